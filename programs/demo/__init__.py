"""``harness demo``: each seed system's training chain on the shipped demo world, on CPU
(:mod:`programs.demo.program` runs it; :mod:`programs.demo.systems` says what each system trains). A program
on the top floor: it drives the library's evaluation, training and report, and no library module
imports it."""
