"""runner.py, the engine room: `runner.map(fn, runs)` is `[fn(**run) for run in runs]` wherever the
runs are computed; what a script does when it is interrupted or its reader goes away."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import common
import runner
from conftest import LECTURE06
from outputs import NEVER_ASKED_FOR


def squared(x: int) -> list:
    return [x * x]


def computed_by(x: int) -> int:
    time.sleep(0.05)   # long enough that the workers take some of the runs
    return os.getpid()


def fails_at(x: int, bad: int) -> int:
    if x == bad:
        raise ValueError(f"run {x} failed")
    return x


@pytest.mark.parametrize("workers", [1, 2])
def test_map_gives_what_a_list_comprehension_gives_and_keeps_it(workers):
    runner.forget()
    runs = [dict(x=x) for x in range(7)]
    results = runner.map(squared, runs, workers=workers)
    assert results == [squared(**run) for run in runs]
    again = runner.map(squared, runs[::-1], workers=workers)
    assert all(a is b for a, b in zip(again, results[::-1]))   # kept, not computed again


def test_runs_go_to_the_workers_and_to_the_process_that_waits():
    runner.forget()
    pids = runner.map(computed_by, [dict(x=x) for x in range(12)], workers=2)
    assert os.getpid() in pids and len(set(pids)) >= 2
    runner.forget()
    assert set(runner.map(computed_by, [dict(x=x) for x in range(3)], workers=1)) == {os.getpid()}


def test_runs_started_early_are_collected_by_map():
    runner.forget()
    runs = [dict(x=x) for x in range(5)]
    runner.start(squared, runs, workers=2)
    assert runner.map(squared, runs, workers=2) == [[x * x] for x in range(5)]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_that_raises_raises_in_the_caller(workers):
    runner.forget()
    with pytest.raises(ValueError, match="run 3 failed"):
        runner.map(fails_at, [dict(x=x, bad=3) for x in range(6)], workers=workers)


def tensors_of(x: int) -> dict:
    import torch
    g = torch.Generator().manual_seed(x)
    return {"float32, transposed": torch.randn(3, 4, 5, generator=g).transpose(1, 2),
            "float64": torch.randn(7, generator=g, dtype=torch.float64),
            "int64": torch.randint(-9, 9, (2, 3), generator=g), "0-d": torch.tensor(x / 3),
            "bool": torch.rand(4, generator=g) > 0.5,
            "bfloat16 (torch's way)": torch.randn(5, generator=g).bfloat16(),
            "requires grad (torch's way)": torch.randn(3, generator=g).requires_grad_()}


def tensors_sent_by(x: int) -> tuple:
    """(pid, the tensors, the bytes the worker's pickler writes for a 1,000-float tensor)."""
    import torch
    from multiprocessing.reduction import ForkingPickler
    time.sleep(0.05)
    runner._send_tensors_as_arrays()  # what the worker does after a run: here, to measure it
    return os.getpid(), tensors_of(x), len(ForkingPickler.dumps(torch.zeros(1000)))


def test_a_worker_sends_tensors_as_arrays_that_arrive_with_the_same_bits():
    import torch
    runner.forget()
    sent = runner.map(tensors_sent_by, [dict(x=x) for x in range(8)], workers=2)
    from_workers = [(x, tensors, size) for x, (pid, tensors, size) in enumerate(sent)
                    if pid != os.getpid()]
    assert from_workers
    for x, tensors, size in from_workers:
        assert size > 4000   # the floats themselves, not a handle to shared memory
        for name, expected in tensors_of(x).items():
            got = tensors[name]
            assert isinstance(got, torch.Tensor) and got.dtype == expected.dtype, name
            assert got.shape == expected.shape and got.requires_grad == expected.requires_grad
            assert torch.equal(got.detach(), expected.detach()), name


def large_result(x: int) -> tuple:
    time.sleep(0.05)
    return os.getpid(), np.random.default_rng(x).random(300_000)   # 2.4 MB: a parcel


def _parcels_left() -> list:
    prefix = runner._parcel_prefix(os.getpid())
    return [name for name in os.listdir(runner._parcel_folder()) if name.startswith(prefix)]


def test_a_large_result_comes_through_a_file_that_is_removed_once_read():
    runner.forget()
    sent = runner.map(large_result, [dict(x=x) for x in range(6)], workers=2)
    assert any(pid != os.getpid() for pid, _ in sent)
    for x, (_, values) in enumerate(sent):
        assert np.array_equal(values, np.random.default_rng(x).random(300_000))
    assert _parcels_left() == []
    assert not isinstance(runner._Parcel.of(np.zeros(1000)), runner._Parcel)
    opened, never_opened = runner._Parcel.of(np.ones(300_000)), runner._Parcel.of(np.zeros(300_000))
    assert np.array_equal(opened.opened(), np.ones(300_000)) and len(_parcels_left()) == 1
    runner.shutdown()   # one never read is removed when the workers end
    assert _parcels_left() == []


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


def test_runs_started_before_a_part_start_as_it_begins_and_only_when_every_part_runs(capsys):
    runner.forget()
    started = []

    def later_runs(args):
        started.append(len(capsys.readouterr().out.splitlines()))   # what part 1 had printed
        return [(squared, [dict(x=7)])]

    parts = {1: lambda args: print("part 1"),
             2: lambda args: print(runner.map(squared, [dict(x=7)]))}
    common.main("a script", parts, [], uses_torch=False, alongside={2: later_runs})
    assert started == [3] and capsys.readouterr().out == "[[49]]\n"   # after title, seed, part 1
    assert capsys.readouterr().err == ""                               # and part 2 asked for it
    common.main("a script", parts, ["--part", "2"], uses_torch=False, alongside={2: later_runs})
    assert started == [3]   # one part alone: nothing started for it


def _script(name: str, *args: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-W", "error::DeprecationWarning",
                             os.path.join(LECTURE06, name),
                             *args], stderr=subprocess.PIPE, text=True, **popen)


def test_ctrl_c_ends_a_script_with_one_line_and_leaves_no_worker_behind():
    # unbuffered: its "seed 0" line arrives as it is printed
    env = {**os.environ, "LECTURE06_WORKERS": "2", "PYTHONUNBUFFERED": "1"}
    script = _script("04_residual_layernorm.py", "--part", "4", "--no-figures", env=env,
                     # a group of its own, as in a terminal
                     stdout=subprocess.PIPE, start_new_session=True,
                     # and Ctrl-C's default action, as a terminal gives it: a shell without job
                     # control starts `make test &` with SIGINT ignored, an ignored SIGINT is
                     # inherited across exec, and Python then raises no KeyboardInterrupt (the
                     # script trained on to its end)
                     preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    # "seed 0" comes once the script is imported and has started its runs (~30 s of work left); a
    # fixed wait from the start could end before the imports on a loaded machine
    for line in script.stdout:
        if line.startswith("seed "):
            break
    time.sleep(2)                         # its workers started, Ctrl-C ignored in them
    os.killpg(script.pid, signal.SIGINT)  # what Ctrl-C sends: every process of the foreground group
    _, stderr = script.communicate(timeout=60)
    assert script.returncode == 128 + signal.SIGINT
    assert stderr.strip() == "interrupted (Ctrl-C)", stderr[-2000:]
    for _ in range(50):
        try:
            os.killpg(script.pid, 0)               # any process of the group left?
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("a worker process outlived the script")


def test_a_reader_that_goes_away_ends_a_script_quietly():
    script = _script("01_attention.py", "--part", "1", "--no-figures", stdout=subprocess.PIPE)
    script.stdout.close()  # as `| head -0` would: nobody reads what it prints
    _, stderr = script.communicate(timeout=60)
    assert stderr == "" and script.returncode == 128 + signal.SIGPIPE
