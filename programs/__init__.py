"""Programs on the top floor that drive the library and are more than a command's options: the
demo (:mod:`programs.demo`). The CLI (``cli``) calls them; nothing in the library imports them."""
