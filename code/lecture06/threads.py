"""How many threads and processes compute the numbers, decided in one place; and memory kept for reuse.

One thread, for numpy's BLAS and for torch. The matrices here are small: on a shared 2-core machine one
thread is faster than two that wait for each other, a step-by-step RNN is timed fairly, and a float32
training run gives the same bits alone, in a loop or in a worker process (at a large lr its digits depend
on the thread count; the pattern does not).

OpenBLAS reads its thread count when numpy loads it, and torch reads OMP_NUM_THREADS when it loads, so
this module must be imported before both (`common` and `city_train` import it first). An explicit
OPENBLAS_NUM_THREADS or OMP_NUM_THREADS in the environment wins. Two processes that each run two threads on
two cores spin waiting for each other: 07's quick run, beside another, took 24 s of CPU with two BLAS
threads and 7 s with one.

On Linux, glibc's malloc is told to keep freed memory (_keep_freed_memory): it changes no number, only time.
"""
import ctypes
import os
import sys
from contextlib import contextmanager

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")  # torch's default thread count; torch_threads(n) changes it


def _keep_freed_memory():
    """By default glibc returns the top of its heap to the kernel as soon as it is free, so the large numpy
    temporaries of a training step (tensor.py's: hundreds of KB each) come back as fresh pages, zeroed by the
    kernel, on every step: 6 of the 27 s of CPU of a run of 07 were spent there. A generous pad on every heap
    growth and a high trim threshold keep the pages; large blocks stay on the heap, so they are reused too."""
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # another C library (musl): it keeps its own policy
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3   # glibc's malloc.h
    for option, value in ((m_top_pad, 64 << 20), (m_trim_threshold, 128 << 20), (m_mmap_threshold, 64 << 20)):
        mallopt(option, value)


_keep_freed_memory()


def _workers() -> int:
    text = os.environ.get("LECTURE06_WORKERS", "2")
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"LECTURE06_WORKERS={text!r}: it must be a whole number of processes, at least 1 "
                         "(1: train in this process, one run after another); unset it for the default 2")
    return int(text)


# Processes that train several models side by side (city_train, 07): one per core of this 2-core machine.
# LECTURE06_WORKERS overrides it; the test suite, whose workers already keep every core busy, sets 1
WORKERS = _workers()


@contextmanager
def torch_threads(n: int = 1):
    """torch on n threads inside the `with` block (or the decorated function); the caller's count comes back
    afterwards, so a test that imports a part function leaves torch as it found it."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
