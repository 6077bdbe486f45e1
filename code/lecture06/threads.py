"""How many threads compute the numbers, decided in one place: one, for numpy's BLAS and for torch.

The matrices here are small: on a shared 2-core machine one thread is faster than two that wait for
each other, a step-by-step RNN is timed fairly, and a float32 training run gives the same bits
alone, in a loop or in a worker process (at a large lr its digits depend on the thread count; the
pattern does not). Two processes that each run two threads on two cores spin waiting for each other:
07's quick run, beside another, took 24 s of CPU with two BLAS threads and 7 s with one.

OpenBLAS reads its thread count when numpy loads it, and torch reads OMP_NUM_THREADS when it loads,
so this module must be imported before both (`common` and `city_train` import it first). An explicit
OPENBLAS_NUM_THREADS or OMP_NUM_THREADS in the environment wins.
"""
import os
import time
from contextlib import contextmanager

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# torch's default thread count; torch_threads(n) changes it
os.environ.setdefault("OMP_NUM_THREADS", "1")


@contextmanager
def torch_threads(n: int = 1):
    """torch on n threads inside the `with` block (or the decorated function); the caller's count
    comes back afterwards, so a test that imports a part function leaves torch as it found it."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def only_one_running() -> bool:
    """Whether this (Linux) process runs one thread, C libraries' (OpenMP) counted too: runner.py
    forks its workers only then (forking a process that runs other threads can deadlock a child)."""
    for _ in range(20):   # a pool's threads, joined, leave the kernel's list milliseconds later
        if len(os.listdir("/proc/self/task")) == 1:
            return True
        time.sleep(0.005)
    return False
