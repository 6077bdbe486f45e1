"""The engine room: the one module that knows about processes, the garbage collector and the
allocator.

A lesson computes a batch of runs as `runner.map(fn, runs)`, which is `[fn(**run) for run in runs]`:
the same results in the same order. Everything below only makes that faster, and no lesson needs to
read it:

- Plain data in: a run's arguments are numbers, strings, lists and dicts (what JSON writes; anything
  else is refused with the argument's name), and its result is plain data too (numbers, arrays,
  state dicts), so that nothing a worker computes shares state with the caller. A worker sends
  torch tensors as numpy arrays, which arrive as tensors again with the same bits, and a result
  over 1 MB through a file in memory (/dev/shm), read once and removed.
- Results are kept by what was run: keyed by the function and the run's arguments, so a run asked
  for twice (by two parts of a script, by two tests) is computed once.
- `runner.start(fn, runs)` begins computing now; a later `map` of the same runs collects them.
  common.main starts the runs a script declares in `train_ahead` before part 1, so that training
  overlaps the parts printed before it; without train_ahead every output is the same, only later.
  When the parts are done, report_runs_never_asked_for names, in one line on stderr, any run
  started ahead that no map asked for (a declaration that drifted from its part).
- Up to LECTURE06_WORKERS processes (read when runs start; default one per available core) take
  queued runs side by side, one core each; LECTURE06_WORKERS=1 computes every run in this process,
  one after another (what a debugger needs). The process that waits in `map` computes the queued
  runs that no worker has taken yet, from the end of the queue, so that no core idles. Every run
  computes on one thread (threads.py), so its result is the same bits wherever it ran.
- Workers start by fork where that is safe (Linux, from a process that runs one thread, as a script
  does until it starts any: a worker is ready in milliseconds and shares the modules already
  imported); elsewhere from a fresh server process (forkserver, Linux) or a fresh interpreter
  (spawn: macOS, Windows). Forking a process that runs other threads can deadlock its child, and
  Python 3.12+ warns about it.
- Ctrl-C: the workers ignore it; the process that started them ends them (`shutdown`, called by
  common.main).
- Memory: on Linux glibc's malloc is told to keep freed memory (keep_freed_memory), and the objects
  that exist when workers start or when the process exits are frozen out of garbage collection
  (keep_out_of_collections). Neither changes a number, only time.
"""
from __future__ import annotations

import atexit
import collections
import ctypes
import gc
import importlib
import importlib.util
import json
import multiprocessing
import os
import pickle
import signal
import sys
import tempfile
import threading
import time

_SUPPORTED = ("a whole number of processes, at least 1 (1: every run in this process, one after "
              "another)")


def _available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def workers_from_environment() -> int:
    """LECTURE06_WORKERS, read when runs start (so a test or a caller may set it after importing
    this module); unset: one per available core."""
    text = os.environ.get("LECTURE06_WORKERS")
    if text is None:
        return _available_cores()
    if not text.isdigit() or int(text) < 1:
        raise SystemExit(f"LECTURE06_WORKERS={text!r}: it must be {_SUPPORTED}; unset it for one "
                         f"per core ({_available_cores()} here)")
    return int(text)


# ---- memory: glibc's allocator and the garbage collector -----------------------------------------
def keep_freed_memory():
    """By default glibc returns the top of its heap to the kernel as soon as it is free, so the
    large numpy temporaries of a training step (tensor.py's: hundreds of KB each) came back as fresh
    pages, zeroed by the kernel, on every step: 6 of the 27 s of CPU of script 07 were spent there.
    A generous pad on every heap growth and a high trim threshold keep the pages; large blocks stay
    on the heap, so they are reused too."""
    if not sys.platform.startswith("linux"):
        return
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # another C library (musl): it keeps its own policy
        return
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3   # glibc's malloc.h
    for option, value in ((m_top_pad, 64 << 20), (m_trim_threshold, 128 << 20),
                          (m_mmap_threshold, 64 << 20)):
        mallopt(option, value)


def keep_out_of_collections():
    """Freeze the objects that exist now (after importing torch: 300,000) out of garbage collection:
    every later collection, a worker's or the last one at exit (1-3 s), skips them. They are the
    modules and data that live to the end anyway."""
    gc.freeze()


keep_freed_memory()
atexit.register(keep_out_of_collections)   # runs before the interpreter's last collections


# ---- the results, the queue, the workers ---------------------------------------------------------
_lock = threading.Lock()
_changed = threading.Condition(_lock)
_results = {}                     # key -> result (or _Failure)
_queue = collections.deque()      # (key, target, run) that no process has taken yet
_taken = {}                       # key -> (key, target, run) that a worker is computing
_ahead = {}                       # key -> description: started by `start`, not yet asked for
_pool = None
_pool_size = 0


class _Failure:
    """A run that raised: its exception, raised again in the process that asks for the result."""

    def __init__(self, error: BaseException):
        self.error = error


def _key(fn, run: dict) -> tuple:
    """What a result is kept under: the function and its arguments written as JSON, so that two
    runs with equal arguments share one result. An argument JSON cannot write (a model, a numpy
    integer) has no such key, and a stand-in for it (its repr) would miss silently: refused."""
    for name, value in run.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as error:
            raise TypeError(f"runner: {fn.__qualname__}(..., {name}={value!r:.80}): {error}, so "
                            "its result cannot be kept under its arguments. Pass plain data: "
                            "numbers, strings, bools, None, and lists or dicts of them (int(n) "
                            "for a numpy integer, the settings that build an object rather than "
                            "the object)") from None
    return fn.__module__, fn.__qualname__, json.dumps(run, sort_keys=True)


def _described(fn, run: dict) -> str:
    return f"{fn.__qualname__}({', '.join(f'{k}={v!r}' for k, v in run.items())})"


def _target(fn) -> tuple:
    """How a worker finds fn: module name, file and qualified name. A script loaded under another
    name (the tests load 07_sentiment.py as script_07_sentiment) is found by its file."""
    module = sys.modules[fn.__module__]
    return fn.__module__, getattr(module, "__file__", None), fn.__qualname__


def _resolve(target: tuple):
    module_name, path, qualname = target
    module = sys.modules.get(module_name)
    if module is None:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module
            spec.loader.exec_module(module)
    fn = module
    for name in qualname.split("."):
        fn = getattr(fn, name)
    return fn


def _compute(target: tuple, run: dict):
    return _resolve(target)(**run)


def _compute_in_worker(target: tuple, run: dict):
    result = _compute(target, run)
    if "torch" in sys.modules:   # imported by the run's module, if not before the worker started
        _send_tensors_as_arrays()
    return _Parcel.of(result)


def _send_tensors_as_arrays():
    """Make this worker send a result's torch tensors as numpy arrays, each made a tensor again on
    arrival (torch.from_numpy: the same dtype, shape and bits). torch's own way, a shared-memory
    file per tensor, cost 05 part 5 1.6 s of CPU (both ends) for one stack's 4,200 checkpointed
    tensors; as arrays they cost 0.1 s. A tensor numpy cannot hold (one that requires grad,
    bfloat16, not on the CPU) still goes torch's way."""
    import torch
    from multiprocessing.reduction import ForkingPickler
    from torch.multiprocessing.reductions import reduce_tensor

    def as_array(tensor):
        if not tensor.requires_grad and tensor.device.type == "cpu":
            try:
                return torch.from_numpy, (tensor.numpy(),)
            except (TypeError, RuntimeError):   # a dtype or layout numpy has not
                pass
        return reduce_tensor(tensor)

    ForkingPickler.register(torch.Tensor, as_array)


class _Parcel:
    """A large result, written by the worker to a file that the parent reads once. Through the
    pool's pipe, 05 part 5's 47 MB of checkpoints sometimes came in thousands of small reads, each
    waiting for the reader to wake: 1.6 s instead of 0.1 (one run in three here)."""
    LARGE = 1 << 20   # bytes pickled

    def __init__(self, path: str):
        self.path = path

    @classmethod
    def of(cls, result):
        """The result itself if it is small, else a parcel of it."""
        from multiprocessing.reduction import ForkingPickler
        data = ForkingPickler.dumps(result)
        if len(data) < cls.LARGE:
            return result
        handle, path = tempfile.mkstemp(prefix=_parcel_prefix(_parent), dir=_parcel_folder())
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        return cls(path)

    def opened(self):
        with open(self.path, "rb") as f:
            data = f.read()
        os.unlink(self.path)
        return pickle.loads(data)


def _parcel_folder() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()   # memory, if it can


def _parcel_prefix(parent: int) -> str:
    return f"lecture06-runner-{parent}-"


def _remove_parcels_never_opened():
    prefix = _parcel_prefix(os.getpid())
    folder = _parcel_folder()
    for name in os.listdir(folder):
        if name.startswith(prefix):
            os.unlink(os.path.join(folder, name))


_parent = os.getpid()   # in a worker: the process whose runs it computes (_worker_starts)


def _worker_starts(parent: int):
    global _parent
    _parent = parent
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the parent, which ends the workers


def _threads_running() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _start_method() -> str:
    if not sys.platform.startswith("linux"):
        return "spawn"
    return "fork" if _threads_running() == 1 else "forkserver"


def _open_pool(size: int):
    global _pool, _pool_size
    method = _start_method()
    context = multiprocessing.get_context(method)
    if method == "forkserver":   # the server imports these once; every worker is forked from it
        main = sys.modules.get("__main__")
        preload = ["__main__"] if getattr(main, "__file__", None) else []
        context.set_forkserver_preload(preload
                                       + [m for m in ("numpy", "torch") if m in sys.modules])
    # the workers never walk today's objects; forked ones share their pages longer
    keep_out_of_collections()
    pool = context.Pool(size, initializer=_worker_starts, initargs=(os.getpid(),))
    _pool, _pool_size = pool, size


def _hand_out():
    """Give every idle worker the next queued run (called with the lock held)."""
    while _pool is not None and _queue and len(_taken) < _pool_size:
        key, target, run = item = _queue.popleft()
        _taken[key] = item
        _pool.apply_async(_compute_in_worker, (target, run),
                          callback=lambda result, key=key: _finished(key, result),
                          error_callback=lambda error, key=key: _finished(key, _Failure(error)))


def _finished(key: tuple, result):
    if isinstance(result, _Parcel):
        try:
            result = result.opened()
        except BaseException as error:   # the pool's result thread must go on
            result = _Failure(error)
    with _lock:   # in the pool's result thread
        _taken.pop(key, None)
        _results[key] = result
        _hand_out()
        _changed.notify_all()


def start(fn, runs: list, workers: int | None = None):
    """Begin computing fn(**run) for the runs not known yet, in up to `workers` processes (default:
    LECTURE06_WORKERS, read now); with one worker, nothing starts: map computes them in this
    process. A later map of the same runs collects them; report_runs_never_asked_for names those
    that none did."""
    with _lock:
        _ahead.update((_key(fn, run), _described(fn, run)) for run in runs)
    _enqueue(fn, runs, workers)


def _enqueue(fn, runs: list, workers: int | None):
    workers = workers_from_environment() if workers is None else workers
    with _lock:
        known = set(_results) | set(_taken) | {key for key, _, _ in _queue}
        for run in runs:
            key = _key(fn, run)
            if key not in known:
                _queue.append((key, _target(fn), run))
                known.add(key)
        wanted = workers > 1 and _queue and _pool is None
    if wanted:
        _open_pool(workers)   # outside the lock: a forked worker must not inherit it held
    with _lock:
        _hand_out()


def map(fn, runs: list, workers: int | None = None) -> list:
    """[fn(**run) for run in runs]: from the results kept, from the workers, or computed here."""
    runs = list(runs)
    keys = [_key(fn, run) for run in runs]
    with _lock:
        for key in keys:
            _ahead.pop(key, None)
    _enqueue(fn, runs, workers)
    waiting = _Status(len(set(keys)))
    while True:
        with _lock:
            missing = {key for key in keys if key not in _results}
            waiting.show(len(set(keys)) - len(missing))
            if not missing:
                break
            mine = next((item for item in reversed(_queue) if item[0] in missing), None)
            if mine is None:
                _changed.wait(timeout=0.5)
                continue
            _queue.remove(mine)
        key, target, run = mine
        try:
            result = _compute(target, run)
        except BaseException:
            with _lock:
                _queue.append(mine)   # still wanted: a later map computes it
            raise
        with _lock:
            _results[key] = result
            _changed.notify_all()
    waiting.clear()
    if not _queue and not _taken:
        shutdown()
    results = [_results[key] for key in keys]
    for result in results:
        if isinstance(result, _Failure):
            raise result.error
    return results


def forget():
    """Drop every kept result (tests that compare a run computed here with one computed in a
    worker)."""
    with _lock:
        _results.clear()
        _ahead.clear()


def report_runs_never_asked_for():
    """One line on stderr naming the runs `start` began that no `map` asked for since, and drop
    those not begun yet. common.main calls it when a script's parts are done: such a run means a
    script's train_ahead declares runs its part no longer asks for, so the part trains its own
    runs later, and nothing overlaps (the output stays the same, which is why it must be said)."""
    with _lock:
        never = dict(_ahead)
        _ahead.clear()
        for item in [item for item in _queue if item[0] in never]:
            _queue.remove(item)
    if never:
        sys.stderr.write(f"runner: {len(never)} run{'s' * (len(never) > 1)} started ahead but "
                         f"never asked for (train_ahead differs from what its part passes to "
                         f"runner.map): {'; '.join(never.values())}\n")


def shutdown():
    """End the workers at once; queued runs stay queued (a later map computes them)."""
    global _pool, _pool_size
    with _lock:
        pool, _pool, _pool_size = _pool, None, 0
        _queue.extend(_taken.values())   # still wanted: a later map computes them
        _taken.clear()
    if pool is not None:
        pool.terminate()
        pool.join()
    _remove_parcels_never_opened()


atexit.register(shutdown)


class _Status:
    """A line on stderr while map waits, if stderr is a terminal (stdout holds only the tables)."""

    def __init__(self, total: int):
        self.total, self.since, self.shown = total, time.monotonic(), False

    def show(self, done: int):
        if sys.stderr.isatty() and done < self.total and time.monotonic() - self.since > 1:
            sys.stderr.write(f"\r{done} of {self.total} runs done")
            sys.stderr.flush()
            self.shown = True

    def clear(self):
        if self.shown:
            sys.stderr.write("\r" + " " * 30 + "\r")
            sys.stderr.flush()
