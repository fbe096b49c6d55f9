"""Give freed memory back to the operating system (glibc's allocator, on Linux).

Measured on the demo (docs/performance.md, "Where the demo's memory went"): after an evaluation
every tensor was freed, yet the process kept 1.25 GB, and 2.0 GB after a second one. glibc serves
an allocation under its mmap threshold from its heap arenas, and that threshold rises with every
large block freed (up to 32 MB), so the KV caches, logits and activations of a CPU run (1-30 MB
each) end up in arenas that fragment and are rarely returned: one process running the demo's
stages one after another grew to 14.6 GB for a 135M-parameter model.

:func:`tune_allocator` fixes the threshold (blocks of 1 MB and more are mapped on their own and
unmapped when freed) and :func:`release_memory` trims the arenas between stages. Both do nothing
where glibc is not the allocator (macOS, musl); ``HARNESS_MALLOC=default`` leaves the threshold
to glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging
import os

logger = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter numbers (malloc.h)
# 1 MB: every KV cache, logits chunk and activation of a CPU run is mapped on its own; 64 KB kept
# about the same memory after an evaluation (556 MB against 578 MB, docs/performance.md).
MMAP_THRESHOLD_BYTES = 1 << 20


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 (raises AttributeError where the C library is not glibc)
        return libc
    except (OSError, AttributeError):
        return None


def tune_allocator(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold at ``threshold`` bytes for the rest of the process (whether it
    was set)."""
    libc = _glibc()
    if libc is None or os.environ.get("HARNESS_MALLOC", "") == "default":
        return False
    ok = bool(libc.mallopt(M_MMAP_THRESHOLD, threshold))
    logger.debug("glibc mmap threshold %d bytes: %s", threshold, "set" if ok else "refused")
    return ok


def release_memory() -> None:
    """Collect garbage and return the allocator's free pages to the operating system."""
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def resident_kb() -> dict[str, int]:
    """This process's resident memory now (``rss``) and at its peak (``peak``), in kB (Linux's
    ``/proc/self/status``: VmRSS, VmHWM; empty elsewhere)."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for row in f:
                key, _, value = row.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out["rss" if key == "VmRSS" else "peak"] = int(value.split()[0])
    except (OSError, ValueError):
        pass
    return out
