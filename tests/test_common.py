"""The scripts' command line: bad arguments are refused before any work, with a message that says
what was wrong; a Python without the packages gets one line that says what to run instead."""
import glob
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from lecture06 import common
from conftest import LECTURE06, load_script


def refused(capsys, argv) -> str:
    with pytest.raises(SystemExit) as stop:
        common.parse_args("Script 99", [1, 2], argv, seeds=3)
    assert stop.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("seed", ["-1", "4294967296", "1.5", "x"])
def test_a_seed_numpy_cannot_take_is_refused_with_its_range(capsys, seed):
    assert refused(capsys, ["--seed", seed]).splitlines()[-1].endswith(
        f"argument --seed: {seed!r} is not a seed; pass a whole number from 0 to 4294967295, "
        "e.g. --seed 1")


def test_seeds_that_run_past_numpys_range_or_none_are_refused_naming_what_to_pass(capsys):
    assert ("--seed 4294967295 --seeds 2 would run past the largest seed, 4294967295: pass a "
            "smaller --seed or fewer --seeds") in refused(capsys, ["--seed", "4294967295",
                                                                    "--seeds", "2"])
    # the default --seeds (3 here) counts too
    assert "--seed 4294967295 --seeds 3 would run past" in refused(capsys, ["--seed", "4294967295"])
    for count in ("0", "-1", "2.5", "x"):
        [line] = [line for line in refused(capsys, ["--seeds", count]).splitlines()
                  if "error" in line]
        assert line.endswith(f"argument --seeds: {count!r} is not a number of seeds; pass how "
                             "many seeds each claim is counted over, 1 or more, e.g. --seeds 3")


def test_figures_and_no_figures_together_are_refused(capsys, tmp_path):
    assert ("--figures DIR writes figures and --no-figures draws none: pass one of them"
            in refused(capsys, ["--figures", str(tmp_path), "--no-figures"]))


def test_figures_must_be_a_folder_checked_before_any_work(capsys, tmp_path):
    a_file = tmp_path / "somefile.txt"
    a_file.write_text("")
    assert "is a file, not a folder" in refused(capsys, ["--figures", str(a_file)])
    assert "use --no-figures" in refused(capsys, ["--figures", ""])
    assert (common.parse_args("Script 99", [1], ["--figures", str(tmp_path / "new")]).figures
            == str(tmp_path / "new"))


def test_quick_draws_no_figures_unless_asked_and_measures_one_seed(tmp_path):
    quick = common.parse_args("Script 99", [1], ["--quick"], seeds=3)
    assert quick.figures is None and quick.seeds == 1
    asked = common.parse_args("Script 99", [1], ["--quick", "--figures", str(tmp_path)])
    assert asked.figures == str(tmp_path)
    full = common.parse_args("Script 99", [1], [], seeds=2)
    assert full.figures.endswith("figures") and full.seeds == 2


def test_seeds_is_offered_only_by_a_script_that_measures_a_claim_over_seeds(capsys):
    with pytest.raises(SystemExit):
        common.parse_args("Script 99", [1], ["--seeds", "2"])
    assert "unrecognized arguments: --seeds 2" in capsys.readouterr().err
    assert not hasattr(common.parse_args("Script 99", [1], []), "seeds")


def test_a_python_without_the_course_s_package_is_told_in_one_line_what_to_run():
    # -S: no site-packages, as a plain python3 that has not installed the package (make venv)
    script = os.path.join(LECTURE06, "01_attention.py")
    done = subprocess.run([sys.executable, "-S", script], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (f"No module named 'lecture06' in {sys.executable}: run `make venv`, "
                           f"then .venv/bin/python {script}\n")


def test_a_python_with_the_package_but_not_its_requirements_is_told_what_to_run():
    # the package's folder on the path, no site-packages: numpy, torch, ... missing
    env = {**os.environ, "PYTHONPATH": os.path.dirname(LECTURE06)}
    done = subprocess.run([sys.executable, "-S", os.path.join(LECTURE06, "01_attention.py")],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "lacks numpy, scipy, torch, matplotlib, tabulate" in done.stderr
    assert "make all" in done.stderr
    helped = subprocess.run([sys.executable, "-S",
                             os.path.join(LECTURE06, "04_residual_layernorm.py"), "--help"],
                            capture_output=True, text=True, timeout=60, env=env)
    assert helped.returncode == 0 and helped.stderr == ""  # --help is not an error, packages or not
    assert "[--seeds N]" in helped.stdout and "lacks numpy" in helped.stdout


def test_every_line_of_a_timing_or_kernel_dependent_note_is_marked(capsys):
    common.timing("first line\nsecond line")
    common.kernel_note("one\ntwo")
    assert capsys.readouterr().out.splitlines() == ["⏱ first line", "⏱ second line", "⚙ one",
                                                    "⚙ two"]


PARTS_THAT_TRAIN = """
import time
from lecture06 import common, runner
def nap(seconds):
    time.sleep(seconds)
    return seconds
common.main("a script", {{1: lambda args: print(runner.map(nap, [dict(seconds=1.5)], workers=2)),
                          2: lambda args: print("done")}}, uses_torch=False)
"""


def _stderr_of_parts_that_train(on_a_terminal: bool, script: str = "",
                                go_once_shown: tuple = ()) -> tuple[str, str]:
    """(stdout, stderr) of `script` (default: part 1 waits 1.5 s for a run), its tables piped.
    go_once_shown (text, path): the file at path is made once stderr shows text."""
    import fcntl
    import pty
    import struct
    import termios
    command = [sys.executable, "-c", script or PARTS_THAT_TRAIN.format(lecture06=LECTURE06)]
    if not on_a_terminal:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        return done.stdout, done.stderr
    leader, follower = pty.openpty()
    # 24 rows of 80 columns (a new terminal has 0, where a bar has no room)
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    script_process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=follower, text=True)
    os.close(follower)
    stderr = b""
    try:
        while chunk := os.read(leader, 65536):
            stderr += chunk
            if go_once_shown and go_once_shown[0].encode() in stderr:
                open(go_once_shown[1], "w").close()
    except OSError:   # the terminal's other end is closed: everything is read
        pass
    os.close(leader)
    stdout, _ = script_process.communicate(timeout=120)
    return stdout, stderr.decode()


def test_on_a_terminal_stderr_names_each_part_and_counts_the_runs_it_waits_for():
    stdout, stderr = _stderr_of_parts_that_train(on_a_terminal=True)
    assert stdout == "a script\nseed 0\n[1.5]\ndone\n"
    assert "-c: part 1 of 2" in stderr and "-c: part 2 of 2" in stderr
    assert "part 1:" in stderr and "0/1" in stderr   # the progress bar, before the run came back


def test_piped_stderr_gets_neither_the_parts_nor_a_progress_bar():
    assert _stderr_of_parts_that_train(on_a_terminal=False) == ("a script\nseed 0\n[1.5]\ndone\n",
                                                                "")


STEPS_THAT_TRAIN = """
import os, time
from lecture06 import common, progress, runner
def train(steps, go):
    time.sleep(0.6)   # past the bar's half-second delay: shown at once
    progress.report_steps(steps - 3)
    for _ in range(600):   # until the test has seen them counted (a minute at most)
        if os.path.exists(go):
            break
        time.sleep(0.1)
    progress.report_steps(3)
    return steps
def part(args):
    run = dict(steps=10, go={go!r})
    print(runner.map(train, [run], workers={workers}, steps=lambda steps, go: steps))
common.main("a script", {{1: part}}, uses_torch=False)
"""


@pytest.mark.parametrize("workers", [1, 2])
def test_the_bar_counts_the_steps_of_a_run_as_it_trains_and_stays_with_its_time(workers,
                                                                                 tmp_path):
    """In this process (one worker) and in a worker: 7 of the run's 10 steps shown while it waits,
    then the full bar stays, its elapsed time with it, as the tables go to a file (make all)."""
    go = tmp_path / "go"
    script = STEPS_THAT_TRAIN.format(lecture06=LECTURE06, go=str(go), workers=workers)
    stdout, stderr = _stderr_of_parts_that_train(True, script, go_once_shown=("7/10", go))
    assert stdout == "a script\nseed 0\n[10]\n"
    assert go.exists()   # 7/10 was shown while the run waited for it
    last = re.split(r"[\r\n]+", stderr.strip())[-1]
    assert re.fullmatch(r"part 1: 100%\|.*\| 10/10 \[00:0\d<00:00, .* steps/s\]", last), last


SCRIPTS = sorted(glob.glob(os.path.join(LECTURE06, "0[1-9]_*.py")))


def test_make_all_runs_two_at_a_time_only_the_scripts_that_train_on_no_other_core():
    """Two of them share the 2 cores one each; a script that trains runs alone, its workers on
    every core (and the ⏱ lines of both kinds are timed with no other process on their core)."""
    with open(os.path.join(LECTURE06, "..", "..", "Makefile"), encoding="utf-8") as f:
        line = next(line for line in f if line.startswith("ONE_PROCESS :="))
    paired = {word[len("run-"):len("run-") + 2] for word in line.split() if word.startswith("run-")}
    one_process = set()
    for path in SCRIPTS:
        with open(path, encoding="utf-8") as f:
            if not any(name in f.read() for name in ("train_ahead", "train_many", "run_many")):
                one_process.add(os.path.basename(path)[:2])
    assert paired == one_process == {"01", "02", "03", "06", "09"}


DONE = re.compile(r"(\d\d) done in (\d+\.\d) s"
                  r"(?:; make all: about (\d+) s left, as in its last run here)?")


def _make_all(root) -> list[str]:
    done = subprocess.run(["make", "--no-print-directory", "all", f"PY={sys.executable}"],
                          cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout.splitlines()


@pytest.mark.skipif(not shutil.which("make"), reason="no make")
def test_make_all_says_each_script_s_time_and_from_its_last_run_here_the_time_left(tmp_path):
    """The Makefile, copied beside three stand-in scripts (two that run as a pair, one alone): after
    each script "NN done in X s"; a second make all adds the time the first took after that script,
    read from figures/timed/; "make all done in X s" last."""
    root = os.path.join(LECTURE06, "..", "..")
    os.makedirs(tmp_path / "tools")
    os.makedirs(tmp_path / "code" / "lecture06")
    os.makedirs(tmp_path / "figures")
    shutil.copy(os.path.join(root, "Makefile"), tmp_path)
    shutil.copy(os.path.join(root, "tools", "make_clock.py"), tmp_path / "tools")
    (tmp_path / "tools" / "make_venv.py").write_text("")   # the real one checks .venv
    for name, seconds in (("01_pair", 0.3), ("02_pair", 0.3), ("04_alone", 1.2)):
        (tmp_path / "code" / "lecture06" / f"{name}.py").write_text(
            f"import time\ntime.sleep({seconds})\nprint('a table')\nprint('⏱ {seconds} s')\n")
    first = _make_all(tmp_path)
    with open(tmp_path / "figures" / "timed" / "make_all_seconds", encoding="utf-8") as f:
        finished = {number: float(seconds) for number, seconds in map(str.split, f)}
    second = _make_all(tmp_path)
    for lines in (first, second):
        done = {m[1]: m for m in map(DONE.fullmatch, lines) if m}
        assert sorted(done) == sorted(finished) == ["01", "02", "04"], lines
        assert float(done["04"][2]) >= 1.2 and float(done["01"][2]) >= 0.3
        assert lines.index(done["04"][0]) == len(lines) - 2   # run alone, after the pair
        assert re.fullmatch(r"make all done in \d+\.\d s", lines[-1])
    assert all(DONE.fullmatch(line)[3] is None for line in first if DONE.fullmatch(line))
    left = {m[1]: m[3] for m in map(DONE.fullmatch, second) if m}
    assert left == {"01": f"{finished['04'] - finished['01']:.0f}",
                    "02": f"{finished['04'] - finished['02']:.0f}", "04": None}


HELP_AND_MODULES = """
import os, resource, runpy, sys
sys.argv = [{path!r}, "--help"]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    used = resource.getrusage(resource.RUSAGE_SELF)
    print("cpu", used.ru_utime + used.ru_stime, "torch" in sys.modules, "numpy" in sys.modules)
"""


@pytest.mark.parametrize("path", SCRIPTS, ids=os.path.basename)
def test_help_lists_the_parts_as_their_headers_print_them_in_under_a_second_without_torch(
        path, monkeypatch, capsys):
    done = subprocess.run([sys.executable, "-c", HELP_AND_MODULES.format(path=path)],
                          capture_output=True, text=True, timeout=60)
    *shown, measured = done.stdout.splitlines()
    _, cpu, torch_loaded, numpy_loaded = measured.split()
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert float(cpu) < 1 and torch_loaded == numpy_loaded == "False"
    # the same text as the script's own parser, built with its PARTS and --seeds default
    script = load_script(os.path.basename(path))
    monkeypatch.setattr(sys, "argv", [path])
    with pytest.raises(SystemExit):
        common.parse_args(script.__doc__, script.PARTS, ["--help"],
                          seeds=getattr(script, "SEEDS", None))
    assert "\n".join(shown) + "\n" == capsys.readouterr().out
    # every part listed, each as its header prints it
    lines = common.part_lines(script.__doc__)
    assert sorted(lines) == sorted(script.PARTS)
    for number, line in lines.items():
        assert line in " ".join("\n".join(shown).split())   # wrapped as in the docstring
        common.header(number, script.__doc__)
        assert capsys.readouterr().out == f"\n{line}\n{'─' * len(line)}\n"


def test_a_header_whose_docstring_line_no_longer_names_its_sizes_is_an_error(capsys):
    doc = ("Script 99 · a title\n\nPart 1 · §2.2 Why divide by √d, d = 512\n"
           "Part 2 · §3 Long\n    end")
    common.header(1, doc, "d = 512")
    common.header(2, doc)
    assert [line for line in capsys.readouterr().out.splitlines() if line] == [
        "Part 1 · §2.2 Why divide by √d, d = 512", "─" * 39, "Part 2 · §3 Long end", "─" * 20]
    with pytest.raises(ValueError, match="part 1 uses d = 256; its docstring line says 'Part 1"):
        common.header(1, doc, "d = 256")
    with pytest.raises(ValueError, match="no line 'Part 3"):
        common.header(3, doc)


# Where a Ctrl-C lands in 05, each after a line that says it got there: its imports (torch's, ~2 s;
# -X importtime names each module as it finishes), its workers starting (train_ahead, before part
# 1), part 5 waiting for them (alone: parts 1-4 first cost ~8 s more of CPU and change nothing
# there), part 6 training then decoding in this process
# (-X importtime only there: its thousand stderr lines would fill a pipe nobody reads meanwhile)
CTRL_C_POINTS = {"importing torch": (["-X", "importtime"], [], "stderr", "torch._C"),
                 "workers starting": ([], [], "stdout", "seed 0"),
                 "waiting for the workers": ([], ["--part", "5"], "stdout", "Part 5 · "),
                 "part 6 alone": ([], ["--part", "6", "--quick"], "stdout", "Part 6 · ")}


@pytest.mark.parametrize("point", CTRL_C_POINTS)
def test_ctrl_c_anywhere_ends_a_script_with_one_line_exit_130_and_no_worker_left(point):
    flags, argv, stream, line = CTRL_C_POINTS[point]
    script = subprocess.Popen(
        [sys.executable, *flags, os.path.join(LECTURE06, "05_training_recipe.py"),
         "--no-figures", *argv],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "LECTURE06_WORKERS": "2", "PYTHONUNBUFFERED": "1"},
        # a group of its own, with Ctrl-C's default action, as a terminal's foreground job has
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    for text in getattr(script, stream):
        seen.append(text)
        # importtime's lines end "| <indent>module"
        if (text.split("|")[-1].strip() == line if flags else text.startswith(line)):
            break
    else:
        pytest.fail(f"no line with {line!r} came; the last: {seen[-3:]}")
    os.killpg(script.pid, signal.SIGINT)   # what Ctrl-C sends: every process of the group
    stdout, stderr = script.communicate(timeout=120)
    stderr = "".join(seen if stream == "stderr" else []) + stderr
    told = [text for text in stderr.splitlines() if text and not text.startswith("import time:")]
    assert script.returncode == 128 + signal.SIGINT
    assert told == ["interrupted (Ctrl-C)"], stderr[-3000:]
    for _ in range(100):
        try:
            os.killpg(script.pid, 0)   # any process of the group left?
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail("a worker process outlived the script")


def test_a_table_with_kernel_rows_prints_the_same_header_and_rule_for_any_digits(capsys):
    def printed(loss: float, worst: str) -> list[str]:
        common.table([["attention", 0.001, loss, worst], ["FFN", 0.001, 2 * loss, "b"]],
                     ["module", "lr", "loss", "largest in"], floatfmt=("", "g", ".3g", ""),
                     kernel_dependent=True, static_columns=(0, 1))
        return capsys.readouterr().out.splitlines()
    short, long = printed(1.5, "a"), printed(123456.789, "attention.out_projection.weights")
    assert short[:2] == long[:2] == ["module          lr    loss  largest in",
                                     "-----------  -----  ------  ------------"]
    assert short[2] == "⚙ attention  0.001     1.5  a"   # aligned under the header while it fits
    assert long[2] == "⚙ attention  0.001  1.23e+05  attention.out_projection.weights"


def test_unmarked_rows_of_a_table_do_not_move_with_its_kernel_rows(capsys):
    # headers and formats as tabulate takes them: numbers, fewer formats than columns
    common.table([["step", 1, 0.25]], ["", 310, "x"], floatfmt=("", "d"), kernel_dependent=True)
    assert capsys.readouterr().out.splitlines() == ["          310    x", "------  -----  ---",
                                                    "⚙ step      1  0.25"]
    for digits in ("0.1", "0.123456789"):
        common.table([["language", "below", 0], [f"{common.KERNELS} greedy", digits, 18]],
                     ["text", "log p", "forbidden"], disable_numparse=True)
        assert capsys.readouterr().out.splitlines()[:3] == [
            "text      log p    forbidden", "--------  -------  -----------",
            "language  below    0"]   # disable_numparse: numbers too are text, left-aligned


def test_a_table_without_kernel_rows_is_tabulates_own(capsys):
    from tabulate import tabulate
    rows = [["a", 1.25, 3], ["bbbbbbbbbbbb", 10.5, None]]
    common.table(rows, ["name", "x", "n"], floatfmt=".2f", missingval="-")
    assert capsys.readouterr().out == tabulate(rows, ["name", "x", "n"], floatfmt=".2f",
                                               missingval="-") + "\n"


def test_a_figure_is_rewritten_only_when_its_pixels_change(tmp_path, capsys):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def draw(height: float) -> str:
        fig, axes = plt.subplots(figsize=(2, 2))
        axes.bar([0], [height])
        return common.save_figure(fig, "bar", str(tmp_path))
    from PIL import Image
    path = draw(1.0)
    with Image.open(path) as image:   # the same pixels in other bytes, as another zlib writes them
        image.load()
    image.save(path, compress_level=1)
    os.utime(path, (0, 0))
    first = open(path, "rb").read()
    draw(1.0)
    assert os.stat(path).st_mtime == 0 and open(path, "rb").read() == first
    draw(2.0)
    assert os.stat(path).st_mtime > 0 and open(path, "rb").read() != first
    assert capsys.readouterr().out.count("[figure]") == 3   # named each time, written or not


# ---- the one rule for claims over seeds (common.decide) ------------------------------------------
NULLS = {"normal": lambda rng, shape: rng.normal(size=shape),
         "heavy-tailed (t, 2 degrees)": lambda rng, shape: rng.standard_t(2, size=shape),
         "uniform": lambda rng, shape: rng.uniform(-1, 1, size=shape),
         "bimodal (near -1 or +1)": lambda rng, shape: (rng.choice([-1.0, 1.0], size=shape)
                                                         + rng.normal(0, 0.1, size=shape))}
TRIALS = 20_000


def rule_outcomes(margins: np.ndarray) -> list[str]:
    """decide's outcome for each row of margins, by its own two functions on the whole batch."""
    above = np.atleast_1d(common.signed_rank_p(margins, "greater"))
    below = np.atleast_1d(common.signed_rank_p(margins, "less"))
    return [common.outcome_of(a, b, margins.shape[1]) for a, b in zip(above, below)]


@pytest.mark.parametrize("null", sorted(NULLS))
@pytest.mark.parametrize("n", [3, 5, 8, 10, 20])
def test_a_claim_with_no_effect_is_called_holds_at_most_5_percent_of_the_time(null, n):
    """Margins drawn from a distribution symmetric about zero, at each number of seeds the
    scripts and make seeds use: the rule says "holds" (and, alike, "the opposite holds") at most
    FALSE_POSITIVE_RATE of the time. 20,000 trials: a rate of 5% reads within ±0.5% (3 standard
    errors) of it."""
    rng = np.random.default_rng(0)
    outcomes = rule_outcomes(NULLS[null](rng, (TRIALS, n)))
    for word in (common.HOLDS, common.OPPOSITE):
        assert outcomes.count(word) / TRIALS <= common.FALSE_POSITIVE_RATE, word


def test_an_effect_of_one_spread_is_called_holds_at_least_80_percent_of_the_time_at_10_seeds():
    """Margins N(1, 1), the mean one standard deviation from zero: at 10 seeds the rule says
    "holds" in 86% of trials (the exact one-sided signed-rank test's power), at 5 seeds in 42%."""
    rng = np.random.default_rng(0)
    power = {n: rule_outcomes(rng.normal(1, 1, (TRIALS, n))).count(common.HOLDS) / TRIALS
             for n in (5, 10)}
    assert power[10] >= 0.80 and 0.35 < power[5] < 0.50


def test_fewer_than_5_seeds_never_decide_and_5_of_5_do():
    assert common.FEWEST_SEEDS == 5
    assert common.decide([3.0, 1.0, 2.0, 4.0]).outcome == "no clear difference at 4 seeds"
    assert common.decide([3.0, 1.0, 2.0, 4.0, 5.0]).outcome == common.HOLDS
    assert common.decide([-3.0, -1.0, -2.0, -4.0, -5.0]).outcome == common.OPPOSITE


def test_a_decision_carries_its_count_p_value_estimate_and_bounds():
    """At 5 seeds all above zero: p = 1/32, the bounds the smallest and largest margin (the
    signed-rank test's one-sided 95% bounds there), the estimate the median of the 15 pairwise
    averages (Hodges-Lehmann)."""
    d = common.decide([1.0, 2.0, 3.0, 4.0, 50.0])
    walsh = [(a + b) / 2 for i, a in enumerate([1, 2, 3, 4, 50]) for b in [1, 2, 3, 4, 50][i:]]
    assert (d.k, d.n, d.outcome, d.p) == (5, 5, common.HOLDS, 1 / 32)
    assert (d.low, d.high, d.estimate) == (1.0, 50.0, float(np.median(walsh)))
    one_below = common.decide([1.0, 2.0, 3.0, 4.0, -0.5])
    assert (one_below.k, one_below.p, one_below.low) == (4, 2 / 32, -0.5)
    assert one_below.outcome == "no clear difference at 5 seeds"


def test_the_bounds_agree_with_the_verdict_holds_exactly_when_the_lower_bound_is_above_zero():
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(5, 21))
        d = common.decide(rng.normal(rng.uniform(-1.5, 1.5), 1, n))
        assert (d.outcome == common.HOLDS) == (d.low > 0)
        assert (d.outcome == common.OPPOSITE) == (d.high < 0)
        assert d.low <= d.estimate <= d.high


def test_one_seed_is_an_observation_and_decide_refuses_it():
    with pytest.raises(ValueError, match="one seed is an observation of that seed, not a verdict"):
        common.decide([2.0])


def test_a_count_line_is_marked_and_says_count_outcome_p_and_effect(capsys):
    common.count_line("RoPE lowers the excess", [68.0, 45.0, 92.0, 70.0, 30.0], "mnat/token")
    common.count_line("it climbs", [5.0, 7.0, -6.0], "points", digits=1)
    common.count_line("below every one", [14.2], "mnat/token")
    assert capsys.readouterr().out.splitlines() == [
        "⚙ RoPE lowers the excess: 5 of 5 seeds; holds (p = 0.031); per-seed margin +61 "
        "mnat/token, 95% bounds +30 to +92",
        "⚙ it climbs: 2 of 3 seeds; no clear difference at 3 seeds (p = 0.38); per-seed margin "
        "+2.8 points, 95% bounds -∞ to +∞",
        "⚙ below every one: yes at the one seed run, an observation of that seed, not a verdict; "
        "margin +14 mnat/token"]


def test_signed_prints_a_small_margin_with_the_digits_it_needs():
    assert [common.signed(x, 0) for x in (12.4, -0.4, 0.0, -math.inf)] == ["+12", "-0.4", "0",
                                                                          "-∞"]
