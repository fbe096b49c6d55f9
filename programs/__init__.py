"""Programs on the top floor that drive the library and are more than a command's options: the
demo (:mod:`programs.demo`), the stage executor (:mod:`programs.stages`: each stage of a chain a
``harness`` child process) and the fault battery (:mod:`programs.faults`). The CLI (``cli``) and
the scripts (``scripts``) call them; nothing in the library imports or names them."""
