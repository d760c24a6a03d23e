"""The process's C heap: keep freed memory for reuse instead of handing it back to the OS every step.

torch allocates CPU tensors with the C library's malloc. glibc returns a freed block to the OS
when it was mmapped (at first every block above 128 KiB) or when the free space at the top of
the heap exceeds its trim threshold (twice the largest block freed so far). A training step on
the CPU frees a few MiB of activations and gradients at its end and allocates them again in the
next step, so every step pays again for the pages it touches first. Where the blocks outgrow
glibc's adaptive threshold (a 2048-token vocabulary's 4 MiB logits; a process that steps several
models, as `benchmarks/bench_cpu_bf16.py` does) a tiny-skinny-tall step took about 2,000 minor page
faults, 8% of its time with bf16 on fp32 kernels and 5% with fp32 compute; the default study's
runs (961 tokens, 2 MiB logits) stay under it and gain nothing measurable. `keep_freed_memory`
sets glibc's thresholds so that blocks below `MMAP_THRESHOLD` come from the heap and up to
`TRIM_THRESHOLD` of free heap is kept: the steps then reuse the same pages. Blocks above 32 MiB
(a large model's tensors, a checkpoint's buffers) are still mmapped and returned at once, so a
process holds at most `TRIM_THRESHOLD` more than it uses. Every `streamback` stage calls it first (`streamback.cli`).

It does nothing where the C library is not glibc, or where the user has set glibc's malloc
tunables (`GLIBC_TUNABLES` with a `glibc.malloc.` setting, or `MALLOC_TRIM_THRESHOLD_` /
`MALLOC_MMAP_THRESHOLD_`): those are the user's choice.
"""

from __future__ import annotations

import ctypes
import os

MMAP_THRESHOLD = 32 << 20  # glibc's own ceiling for its dynamic threshold on 64-bit systems
TRIM_THRESHOLD = 256 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)
USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


def user_set_malloc() -> bool:
    """Whether the environment sets glibc's malloc thresholds itself."""
    return any(os.environ.get(name) for name in USER_SETTINGS) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")


def keep_freed_memory() -> bool:
    """Set glibc's mmap and trim thresholds (see the module docstring); True where they were set."""
    if user_set_malloc():
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # glibc only: musl and macOS have a mallopt of other meaning, or none
        mallopt = libc.mallopt
    except (AttributeError, OSError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
