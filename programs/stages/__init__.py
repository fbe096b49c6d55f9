"""``harness stages run``'s executor: each stage of a chain (:mod:`training.stages`, the chain as
data and its runner) as its own ``harness`` process (:mod:`programs.stages.executor`). A program on
the top floor: it spawns the CLI, which no library module names."""
