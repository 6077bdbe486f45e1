"""How far the runs that runner.map waits for have got: a tqdm bar on stderr, on a terminal only
(never in a file or a test's capture), called what common.main calls the part ("part 4").

It counts the training steps the runs take, as they train: each run reports its steps
(report_steps) into a counter its worker shares with this process, or straight to the bar when it
computes here (one worker). Counting whole runs, 04's part 4 read 9/19 for 22 of its 33 s (9 short
runs, then 10 long ones finishing together) while its estimate of the time left said 2 s.
"""
from __future__ import annotations

import sys
import time
from concurrent.futures import Future

from tqdm import tqdm

tqdm.monitor_interval = 0   # no monitor thread: a process that runs one thread can fork its workers

label = ""   # what the bar calls the wait; common._show_progress sets it
# one counter for each run given to the pool, reused in turn: 1,024 runs in flight never happen
COUNTERS = 1024
_counters = None   # the pool's, shared with its workers: the steps each run in flight reported
_counter_of = {}   # in this process: a run's key -> its counter, for the runs given to the pool
_counter = None    # in a worker: the counter of the run it computes
_open_bar = None   # in this process: the bar of the map that waits, moved by a run computed here


def new_counters(context):
    """Counters, all 0, for a new pool of `context` (a multiprocessing context) to share."""
    share_counters(context.RawArray("q", COUNTERS))
    return _counters


def share_counters(counters):
    """The counters of the pool this process started, or (in a worker) belongs to."""
    global _counters
    _counters = counters
    _counter_of.clear()


def counter_for(key) -> int:
    """A counter, at 0, for a run given to the pool."""
    _counter_of[key] = len(_counter_of) % COUNTERS
    _counters[_counter_of[key]] = 0
    return _counter_of[key]


def count_steps_in(counter: int):
    """In a worker: the run it starts now reports its steps into `counter`."""
    global _counter
    _counter = counter


def report_steps(count: int):
    """A run in progress trained `count` more steps: the bar of the map that waits for it counts
    them. Outside a run that a map waits for (a lesson that trains directly), nothing."""
    if _counter is not None:
        _counters[_counter] += count
    elif _open_bar is not None:
        _open_bar.update(count)


PACE_SECONDS = 5.0   # a run's pace is measured over this long


class _TimeLeftBar(tqdm):
    """A tqdm bar whose time left is at least the slowest run's (Bar.show sets it): a run trains on
    one core however many others are idle, and tqdm, which divides the work left by the steps per
    second of all the runs together, said half the time when one long run was left on two cores."""

    slowest_run_left = 0.0   # seconds
    # No time left said before: a run's changeover (its last evaluation, the next one's models),
    # about a second without steps, made a shorter measurement say 3:36 for 50 s (04's part 4)
    MEASURED_FOR = 3.0

    @property
    def format_dict(self):
        shown = super().format_dict
        rate = shown["rate"] or (self.n - self.initial) / max(shown["elapsed"], 1e-9)
        left = None
        if self.n >= self.total:
            left = 0.0
        elif rate and shown["elapsed"] >= self.MEASURED_FOR:
            left = max((self.total - self.n) / rate, self.slowest_run_left)
        shown["left"] = "?" if left is None else self.format_interval(left)
        return shown


class Bar:
    """The bar of one runner.map, for `runs` {key: a run's arguments}: it counts each distinct run's
    steps(**arguments), or each run as 1 without `steps`. results: runner's, {key: the result, or
    a Future while a worker computes it}."""

    def __init__(self, runs: dict, steps, results: dict):
        self.work = {key: steps(**run) if steps else 1 for key, run in runs.items()}
        self.counts_steps, self.results = steps is not None, results
        self.seen = {}   # key -> [(time, steps)]: the run as this bar saw it train, lately
        # It stays when done where the part lines are shown (common._show_progress): the screen
        # keeps each part's time. Its rate counts only the work done while it shows (initial):
        # runs started ahead may have trained before.
        self.tqdm = _TimeLeftBar(
            total=sum(self.work.values()), initial=self.done(self._steps_in_workers()), desc=label,
            unit=" steps" if self.counts_steps else " runs", file=sys.stderr,
            disable=not sys.stderr.isatty(), delay=0.5, miniters=0, leave=not sys.stdout.isatty(),
            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{left}, {rate_fmt}{postfix}]")

    def __enter__(self):
        global _open_bar
        _open_bar = self.tqdm if self.counts_steps else None
        return self

    def __exit__(self, *exception):
        global _open_bar
        _open_bar = None
        self.tqdm.close()

    def _steps_in_workers(self) -> dict:
        """{key: the steps it reported} of the runs in workers, counting steps."""
        if not self.counts_steps:
            return {}
        return {key: min(_counters[_counter_of[key]], work) for key, work in self.work.items()
                if isinstance(self.results.get(key), Future)}

    def done(self, steps_in_workers: dict) -> int:
        """The runs finished, and the steps reported by the runs in workers."""
        finished = sum(work for key, work in self.work.items()
                       if key in self.results and not isinstance(self.results[key], Future))
        return finished + sum(steps_in_workers.values())

    def _slowest_run_left(self, steps_in_workers: dict) -> float:
        """The longest a run in a worker still takes at its own pace over the last PACE_SECONDS
        (a second at least, else not counted): other processes take and give back cores."""
        now, slowest = time.monotonic(), 0.0
        for key, steps in steps_in_workers.items():
            if steps == 0:   # not begun
                continue
            seen = self.seen.setdefault(key, [])
            seen.append((now, steps))
            while len(seen) > 2 and now - seen[1][0] >= PACE_SECONDS:
                del seen[0]   # the window starts at the last sample PACE_SECONDS back
            seen_at, seen_steps = seen[0]
            if now - seen_at >= 1 and steps > seen_steps:
                seconds_a_step = (now - seen_at) / (steps - seen_steps)
                slowest = max(slowest, (self.work[key] - steps) * seconds_a_step)
        return slowest

    def show(self):
        """The work done now and the time left; the elapsed time moves on even when neither has."""
        steps_in_workers = self._steps_in_workers()
        self.tqdm.slowest_run_left = self._slowest_run_left(steps_in_workers)
        self.tqdm.update(self.done(steps_in_workers) - self.tqdm.n)
