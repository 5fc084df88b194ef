"""Keep freed host memory in the process, so big CPU tensors are not page-faulted every step.

glibc's malloc serves blocks over 32 MB (the largest mmap threshold it allows) with a fresh
mmap and gives them back to the kernel on free. A CPU training step allocates several such
tensors (the logits of a 4096-token batch over an 8k vocabulary are 131 MB, and so are
their log-softmax and gradients), so every step zero-faults them in again: about a fifth of
the step went to kernel time on transformer_small. Serving every block from the heap and
never trimming it keeps that memory mapped for the next step; the price is that the
resident size stays at its peak, which a training or translation process reaches anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
_M_MMAP_MAX = -4
_done = False


def keep_freed_memory() -> bool:
    """Tune glibc's malloc as above (once per process); False where there is no glibc."""
    global _done
    if _done:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or another libc without mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    # No mmap-served blocks, and no returning the heap's free top to the kernel.
    _done = bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    return _done
