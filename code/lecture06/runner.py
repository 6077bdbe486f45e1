"""The engine room: the one module that knows about processes, glibc's allocator and the gc.

`runner.map(fn, runs)` is `[fn(**run) for run in runs]`, only sooner. A run's arguments (plain data,
what JSON writes) are its key: a run asked for twice is computed once; `runner.start(fn, runs)`
submits runs that a later map collects (common.main's train_ahead). Workers: a concurrent.futures
pool of LECTURE06_WORKERS processes (default one per core; 1: every run here, in map, for a
debugger), each run on one thread (threads.py), the same bits wherever it ran; they ignore Ctrl-C.
"""
from __future__ import annotations

import atexit
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
import ctypes
import gc
import importlib.util
import json
import multiprocessing
import os
import signal
import sys

from lecture06 import progress, threads

_results = {}    # key -> a Future (in a worker, or done) or the result computed here
_ahead = {}      # the keys of runs started by `start`, not yet asked for by a map, in order
_pool = None


def keep_freed_memory():
    """Keep freed heap: glibc hands it back to the kernel at once, and tensor.py's large numpy
    temporaries came back as fresh, zeroed pages every step (a quarter of 07's wall time)."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):   # not glibc (macOS, Windows, musl): its own policy
        return
    # glibc's malloc.h: M_TOP_PAD, M_TRIM_THRESHOLD, M_MMAP_THRESHOLD
    for option, value in ((-2, 64 << 20), (-1, 128 << 20), (-3, 64 << 20)):
        mallopt(option, value)


keep_freed_memory()   # workers forked from this process inherit it


def workers_from_environment() -> int:
    """LECTURE06_WORKERS, read when runs start (not on import); unset: one per available core."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    text = os.environ.get("LECTURE06_WORKERS", str(cores or 1))
    if not text.isdigit() or int(text) < 1:
        raise SystemExit(f"LECTURE06_WORKERS={text!r}: pass a whole number of processes, at least "
                         f"1 (1: every run here, in turn) or unset it: one per core ({cores} here)")
    return int(text)


def _key(fn, run: dict) -> tuple:
    """The function and its arguments written as JSON. An argument JSON cannot write (a model, a
    numpy integer) has no such key, and a stand-in (its repr) would miss silently: refused."""
    for name, value in run.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as error:
            raise TypeError(f"runner: {fn.__qualname__}(..., {name}={value!r:.80}): {error}, so "
                            "its result cannot be kept under its arguments. Pass plain data: "
                            "numbers, strings, bools, None, lists or dicts of them (int(n) for a "
                            "numpy integer, an object's settings, not the object)") from None
    return fn.__module__, fn.__qualname__, json.dumps(run, sort_keys=True)


def _start_worker(counters):
    """A worker ignores Ctrl-C: it is for the parent, which ends the workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    progress.share_counters(counters)


def _compute(module_name: str, path: str | None, qualname: str, run: dict, counter: int):
    """fn(**run) in a worker. A module it lacks is loaded from its file: a worker from a forkserver
    has not imported a script the tests load under another name (script_07_sentiment)."""
    progress.count_steps_in(counter)
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, path)
        sys.modules[module_name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[module_name])
    fn = sys.modules[module_name]
    for name in qualname.split("."):   # a method's qualname names its class first
        fn = getattr(fn, name)
    return fn(**run)


def _open_pool(size: int) -> ProcessPoolExecutor:
    """Workers forked where it is safe (milliseconds, the modules shared); forking a process that
    runs other threads can deadlock the child: a forkserver then, or spawn off Linux."""
    method = ("spawn" if not sys.platform.startswith("linux")
              else "fork" if threads.only_one_running() else "forkserver")
    context = multiprocessing.get_context(method)
    gc.freeze()   # today's objects (torch's 300,000): no collection in a worker walks them again
    if method == "forkserver":   # the server imports these once; every worker is forked from it
        main = ["__main__"] if getattr(sys.modules.get("__main__"), "__file__", None) else []
        context.set_forkserver_preload(main + [m for m in ("numpy", "torch") if m in sys.modules])
    return ProcessPoolExecutor(size, mp_context=context, initializer=_start_worker,
                               initargs=(progress.new_counters(context),))


def _block_ctrl_c(how: int):
    if hasattr(signal, "pthread_sigmask"):   # Windows has no signal masks
        signal.pthread_sigmask(how, {signal.SIGINT})


def _submit(fn, runs: list, workers: int | None):
    """Submit to the workers the runs with no result or future yet (none with one worker)."""
    global _pool
    workers = workers_from_environment() if workers is None else workers
    if workers == 1:
        return   # map computes each run here
    module_file = getattr(sys.modules[fn.__module__], "__file__", None)
    # workers fork with Ctrl-C blocked (it waits for this process): one landing in a worker before
    # it ignores Ctrl-C printed the worker's own traceback
    _block_ctrl_c(signal.SIG_BLOCK)
    try:
        for run in runs:
            key = _key(fn, run)
            if key not in _results:
                if _pool is None:
                    _pool = _open_pool(workers)
                _results[key] = _pool.submit(_compute, fn.__module__, module_file,
                                             fn.__qualname__, run, progress.counter_for(key))
    finally:
        _block_ctrl_c(signal.SIG_UNBLOCK)


def start(fn, runs: list, workers: int | None = None):
    """Begin computing fn(**run) for the runs not known yet, in `workers` processes (default:
    LECTURE06_WORKERS); with one, nothing starts (map computes them). A later map collects them."""
    _ahead.update(dict.fromkeys(_key(fn, run) for run in runs))
    _submit(fn, runs, workers)


def map(fn, runs: list, workers: int | None = None, steps=None) -> list:
    """[fn(**run) for run in runs]: kept, the workers' or computed here. steps(**run): the steps a
    run trains (5 stacked runs of 400: 2,000), which the bar counts as they train (progress.py)."""
    runs = list(runs)
    keys = [_key(fn, run) for run in runs]
    _submit(fn, runs, workers)
    with progress.Bar(dict(zip(keys, runs)), steps, _results) as bar:
        for key, run in zip(keys, runs):
            _ahead.pop(key, None)
            if key not in _results:   # one worker: computed here, in order
                _results[key] = fn(**run)
                bar.show()
        futures = {_results[key]: key for key in keys if isinstance(_results[key], Future)}
        while futures:
            done, _ = wait(futures, timeout=1, return_when=FIRST_COMPLETED)
            for future in done:
                _results[futures.pop(future)] = future.result()   # a run's exception is raised here
            bar.show()   # each second at least: the elapsed time and the steps trained move on
    if all(not isinstance(result, Future) for result in _results.values()):
        shutdown()   # nothing in flight: the workers' memory back; a later start forks afresh
    return [_results[key] for key in keys]


def forget():
    """Drop every kept result (tests that compute a run again to compare)."""
    shutdown()
    _results.clear()
    _ahead.clear()


def report_runs_never_asked_for():
    """One line on stderr naming the runs `start` began that no `map` asked for (a train_ahead that
    drifted from its part: the same output, only without the overlap); then the workers end."""
    calls = []
    for _, name, arguments in _ahead:
        listed = [f"{argument}={value!r}" for argument, value in json.loads(arguments).items()]
        calls.append(f"{name}({', '.join(listed)})")
    if calls:
        runs = "1 run" if len(calls) == 1 else f"{len(calls)} runs"
        sys.stderr.write(f"runner: {runs} started ahead but never asked for (train_ahead differs "
                         f"from what its part passes to runner.map): {'; '.join(calls)}\n")
    _ahead.clear()
    shutdown()


def shutdown():
    """End the workers now; runs they had not finished are forgotten (a later map computes them)."""
    global _pool
    pool, _pool = _pool, None
    if pool is None:
        return
    if any(isinstance(result, Future) for result in _results.values()):
        for process in multiprocessing.active_children():   # the pool's: the only ones we start
            process.terminate()
    pool.shutdown(wait=True, cancel_futures=True)
    for key, result in list(_results.items()):   # finished runs kept, the others forgotten
        if isinstance(result, Future):
            del _results[key]
            if not result.cancelled() and result.exception() is None:
                _results[key] = result.result()


atexit.register(shutdown)
atexit.register(gc.freeze)   # runs first: the interpreter's last collections skip every object
