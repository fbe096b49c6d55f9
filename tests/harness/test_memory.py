"""harness.memory: freed blocks go back to the OS instead of staying in glibc's arenas."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from harness import memory

# glibc raises its mmap threshold to the size of a mapped block that is freed: after the 8 MB
# block, blocks of 3 MB come from the heap (as a CPU run's KV caches and activations did), and a
# 64 KB object allocated after each keeps the heap from shrinking at its top when they are freed
# (a tiny one may come from a free list below them and pin nothing).
PROBE = """
import sys
from harness.memory import release_memory, resident_kb, tune_allocator
def rss_mb():
    return resident_kb().get("rss", 0) / 1024
tuned = tune_allocator()
del bytearray(8 << 20)[:]
before = rss_mb()
blocks, pins = [], []
for _ in range(100):  # 300 MB in 3 MB blocks, touched
    blocks.append(bytearray(3 << 20))
    pins.append(bytearray(64 << 10))  # 64 KB: from the heap whatever the threshold, after its block
held = rss_mb()
del blocks
freed = rss_mb()
release_memory()
print(tuned, round(before), round(held), round(freed), round(rss_mb()))
"""


def _probe(**env: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, env={**os.environ, **env}
    )
    return out.stdout.split()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator: Linux only")
def test_freed_blocks_leave_the_process_at_once_when_tuned_and_at_release_otherwise():
    tuned, before, held, freed, released = map(eval, _probe())
    assert tuned is True and held - before > 250  # the blocks were really resident
    assert freed - before < 50, (before, held, freed)  # mapped on their own: unmapped when freed
    tuned, before, held, freed, released = map(eval, _probe(HARNESS_MALLOC="default"))
    assert tuned is False and held - before > 250
    assert freed - before > 250, (before, held, freed)  # glibc's default: kept in the heap
    assert released - before < 50, (before, held, released)  # until release_memory trims it


def test_rss_is_read():
    kb = memory.resident_kb()
    assert kb["rss"] / 1024 > 10 and kb["peak"] >= kb["rss"]
