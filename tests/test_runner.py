"""runner.py, the engine room: `runner.map(fn, runs)` is `[fn(**run) for run in runs]` wherever the
runs are computed; what a script does when its reader goes away (Ctrl-C: test_common.py)."""
from concurrent.futures import Future
import io
import multiprocessing
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from lecture06 import common, progress, runner
from conftest import LECTURE06
from outputs import NEVER_ASKED_FOR


def squared(x: int) -> list:
    return [x * x]


def computed_in(x: int) -> int:
    return os.getpid()


def fails_at(x: int, bad: int) -> int:
    if x == bad:
        raise ValueError(f"run {x} failed")
    return x


def float32_run(seed: int) -> list:
    """A float32 training run's every loss, as bits."""
    from lecture06 import city_train
    result = city_train.run(model=dict(n_layers=1, n_embd=16, n_head=2, seed=seed),
                            training=dict(lr=1e-2, steps=10, eval_every=None, seed=seed))
    return np.array(result.train_excess).view(np.uint64).tolist()


@pytest.mark.parametrize("workers", [1, 2])
def test_map_gives_what_a_list_comprehension_gives_and_keeps_it(workers):
    runner.forget()
    runs = [dict(x=x) for x in range(7)] + [dict(x=3)]
    results = runner.map(squared, runs, workers=workers)
    assert results == [squared(**run) for run in runs]
    again = runner.map(squared, runs[::-1], workers=workers)
    assert all(a is b for a, b in zip(again, results[::-1]))   # kept, not computed again


def test_a_float32_training_run_has_the_same_bits_here_and_in_a_worker():
    runner.forget()
    runs = [dict(seed=s) for s in (3, 4)]
    assert runner.map(float32_run, runs, workers=2) == [float32_run(**run) for run in runs]


def test_runs_started_ahead_are_collected_by_map_not_computed_again():
    runner.forget()
    runs = [dict(x=x) for x in range(3)]
    runner.start(computed_in, runs, workers=2)
    # one worker would compute a run in this process: each result comes from the workers instead
    assert os.getpid() not in runner.map(computed_in, runs, workers=1)


def test_one_worker_computes_every_run_in_this_process_where_a_debugger_can_stop():
    runner.forget()
    assert runner.map(computed_in, [dict(x=x) for x in range(3)], workers=1) == [os.getpid()] * 3


@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_that_raises_raises_in_the_caller(workers):
    runner.forget()
    with pytest.raises(ValueError, match="run 3 failed"):
        runner.map(fails_at, [dict(x=x, bad=3) for x in range(6)], workers=workers)


@pytest.mark.parametrize("argument, what", [(object(), "object"), (np.int64(3), "int64")])
def test_an_argument_that_cannot_be_a_key_is_refused_by_name(argument, what):
    with pytest.raises(TypeError, match=f"squared\\(..., x=.*{what}.*Pass plain data"):
        runner.map(squared, [dict(x=1), dict(x=argument)])


@pytest.mark.parametrize("workers, expected",
                         [("3", "3"), ("0", "at least 1"), ("two", "at least 1")])
def test_lecture06_workers_is_read_when_runs_start_or_refused(workers, expected):
    done = subprocess.run([sys.executable, "-c", "import runner; print('imported'); "
                           "print(runner.workers_from_environment())"], cwd=LECTURE06,
                          capture_output=True, text=True,
                          env={**os.environ, "LECTURE06_WORKERS": workers})
    assert done.stdout.startswith("imported")   # importing runner does not read it
    assert expected in (done.stdout if done.returncode == 0 else done.stderr)
    assert (done.returncode == 0) == (workers == "3")


def test_runs_started_ahead_that_no_part_asks_for_are_named_in_one_line(capsys):
    runner.forget()
    asked, never = [dict(x=x) for x in range(3)], [dict(x=x) for x in (10, 11)]

    def part(args):
        print(runner.map(squared, asked))
    common.main("a script", {1: part}, [], uses_torch=False,
                train_ahead={1: lambda args: (squared, asked + never)})
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == "[[0], [1], [4]]"
    [line] = captured.err.splitlines()
    assert NEVER_ASKED_FOR in line and "2 runs" in line
    assert "squared(x=10); squared(x=11)" in line and "x=2" not in line
    common.main("a script", {1: part}, [], uses_torch=False,
                train_ahead={1: lambda args: (squared, asked)})
    assert capsys.readouterr().err == ""   # every run started ahead was asked for


def _script(name: str, *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-W", "error::DeprecationWarning",
                             os.path.join(LECTURE06, name),
                             *args], stderr=subprocess.PIPE, text=True, **popen)


def test_a_reader_that_goes_away_ends_a_script_quietly():
    script = _script("01_attention.py", "--part", "1", "--no-figures", stdout=subprocess.PIPE)
    script.stdout.close()  # as `| head -0` would: nobody reads what it prints
    _, stderr = script.communicate(timeout=60)
    assert stderr == "" and script.returncode == 128 + signal.SIGPIPE


def test_a_run_weighs_the_training_steps_it_takes_a_stack_its_runs_steps_together():
    from lecture06 import city_llama, city_train, sentiment_train
    assert city_train.stack_steps(model={}, training=dict(steps=75), seeds=[1, 2, 3]) == 225
    assert city_train.stack_steps(model={}, training={}, seeds=[(4, 5)]) == 400   # train's default
    assert city_llama.run_steps(model={}, training=dict(steps=300), long_lengths=[64],
                                convert_to=[1, 2], uptrain_steps=40, uptrain_lr=1e-3) == 380
    assert city_llama.run_steps(model={}, training={}) == 400
    assert sentiment_train.transformer_steps(positions=True, seed=0, steps=120) == 120


@pytest.mark.parametrize("argv, steps", [([], 3 * 5 * 75 + 2 * 8 * 400), (["--quick"], 2 * 100)])
def test_script_04_part_4_bar_counts_the_steps_of_every_planned_run_once(script, argv, steps):
    """The stacks train_many makes of part 4's runs weigh what its plan trains: in a full run 15
    runs of 75 steps (3 settled configurations × 5 seeds) and 16 of 400 (2 contested × 8), not 31
    runs of one weight."""
    from lecture06 import city_train
    m = script("04_residual_layernorm")
    args = common.parse_args(m.__doc__, m.PARTS.keys(), ["--part", "4", *argv], m.SEEDS)
    _, stacks = m.part4_runs(args)
    assert sum(steps * len(seeds) for _, seeds, steps in m.part4_plan(args)) == steps
    assert sum(city_train.stack_steps(**stack) for stack in stacks) == steps


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_bar_counts_runs_in_workers_by_their_steps_and_waits_for_the_slowest(monkeypatch):
    """Finished runs count whole, a run in a worker the steps it reported (at most its own), one
    not begun nothing; the time left, said once the bar has measured for 3 s, is at least the
    slowest run's at its own recent pace (1 s a step here: 60 steps left, 01:00), whatever the
    steps per second of all the runs together say."""
    runner.forget()   # no pool whose counters these would replace
    monkeypatch.setattr(sys, "stderr", _Terminal())
    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    counters = progress.new_counters(multiprocessing.get_context())
    counter = {key: progress.counter_for(key) for key in ("training", "queued")}
    results = {"finished": "its result", "training": Future(), "queued": Future()}
    runs = {"finished": dict(steps=50), "training": dict(steps=100), "queued": dict(steps=100),
            "not asked yet": dict(steps=10)}
    counters[counter["training"]] = 30
    with progress.Bar(runs, lambda steps: steps, results) as bar:
        assert (bar.tqdm.total, bar.tqdm.n) == (260, 80)
        bar.show()   # first seen training at 30 steps
        clock[0], counters[counter["training"]] = 110.0, 40
        bar.show()
        assert (bar.tqdm.n, bar.tqdm.slowest_run_left) == (90, 60.0)
        bar.tqdm.refresh()
        assert "90/260 [00:00<?," in sys.stderr.getvalue().split("\r")[-1]   # not 3 s yet
        for waited, left in ((3, "01:00"), (10, "02:50")):
            # 10 steps since the bar opened, in 3 s: 170 left in 51 s, less than the slowest
            # run's 60; in 10 s: 170 s, more
            bar.tqdm.start_t = bar.tqdm.last_print_t - waited
            bar.tqdm.refresh()
            assert f"90/260 [00:{waited:02d}<{left}," in sys.stderr.getvalue().split("\r")[-1]
        clock[0], counters[counter["training"]] = 120.0, 90
        bar.show()   # its pace over the last 5 s or more: 50 steps in 10 s, 10 left
        assert bar.tqdm.slowest_run_left == 2.0
        counters[counter["training"]] = 150   # more than its steps(): counted as 100
        bar.show()
        assert bar.tqdm.n == 150
    with progress.Bar(runs, None, results) as counting_runs:
        assert (counting_runs.tqdm.total, counting_runs.tqdm.n) == (4, 1)


def test_runner_py_is_read_whole_in_200_lines_at_most():
    """DEVELOPING.md's engine room is one short module: what grows there goes to a module of its
    own (the progress bar: progress.py), not into golfed lines."""
    with open(os.path.join(LECTURE06, "runner.py"), encoding="utf-8") as f:
        assert len(f.readlines()) <= 200
