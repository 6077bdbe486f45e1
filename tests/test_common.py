"""The scripts' command line: bad arguments are refused before any work, with a message that says
what was wrong; a Python without the packages gets one line that says what to run instead."""
import os
import subprocess
import sys

import pytest

import common
from conftest import LECTURE06


def refused(capsys, argv) -> str:
    with pytest.raises(SystemExit) as stop:
        common.parse_args("Script 99", [1, 2], argv, seeds=3)
    assert stop.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("seed", ["-1", "4294967296", "1.5"])
def test_a_seed_numpy_cannot_take_is_refused_with_its_range(capsys, seed):
    message = refused(capsys, ["--seed", seed])
    assert "argument --seed" in message and ("0 .. 4294967295" in message
                                             or "not a whole number" in message)


def test_seeds_that_run_past_numpys_range_or_none_are_refused(capsys):
    assert "do not fit numpy's seeds" in refused(capsys, ["--seed", "4294967295", "--seeds", "2"])
    assert "give 1 or more" in refused(capsys, ["--seeds", "0"])


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


def test_a_python_without_the_packages_is_told_what_to_run():
    # -S: no site-packages, as a plain python3 without the requirements installed
    done = subprocess.run([sys.executable, "-S", os.path.join(LECTURE06, "01_attention.py")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "lacks numpy, torch, matplotlib, tabulate" in done.stderr and "make all" in done.stderr
    helped = subprocess.run([sys.executable, "-S",
                             os.path.join(LECTURE06, "04_residual_layernorm.py"), "--help"],
                            capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0 and helped.stderr == ""  # --help is not an error, packages or not
    assert "[--seeds N]" in helped.stdout and "lacks numpy" in helped.stdout


def test_every_line_of_a_timing_or_kernel_dependent_note_is_marked(capsys):
    common.timing("first line\nsecond line")
    common.kernel_note("one\ntwo")
    assert capsys.readouterr().out.splitlines() == ["⏱ first line", "⏱ second line", "⚙ one",
                                                    "⚙ two"]


PARTS_THAT_TRAIN = """
import sys, time
sys.path.insert(0, {lecture06!r})
import common, runner
def nap(seconds):
    time.sleep(seconds)
    return seconds
common.main("a script", {{1: lambda args: print(runner.map(nap, [dict(seconds=1.5)], workers=2)),
                          2: lambda args: print("done")}}, uses_torch=False)
"""


def _stderr_of_parts_that_train(on_a_terminal: bool) -> tuple[str, str]:
    """(stdout, stderr) of a script whose part 1 waits 1.5 s for a run, its tables piped."""
    import fcntl
    import pty
    import struct
    import termios
    leader, follower = pty.openpty() if on_a_terminal else (None, subprocess.PIPE)
    if on_a_terminal:   # 24 rows of 80 columns (a new terminal has 0, where a bar has no room)
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    done = subprocess.run([sys.executable, "-c", PARTS_THAT_TRAIN.format(lecture06=LECTURE06)],
                          stdout=subprocess.PIPE, stderr=follower, text=True, timeout=120)
    if not on_a_terminal:
        return done.stdout, done.stderr
    os.close(follower)
    stderr = b""
    try:
        while chunk := os.read(leader, 65536):
            stderr += chunk
    except OSError:   # the terminal's other end is closed: everything is read
        pass
    os.close(leader)
    return done.stdout, stderr.decode()


def test_on_a_terminal_stderr_names_each_part_and_counts_the_runs_it_waits_for():
    stdout, stderr = _stderr_of_parts_that_train(on_a_terminal=True)
    assert stdout == "a script\nseed 0\n[1.5]\ndone\n"
    assert "-c: part 1 of 2" in stderr and "-c: part 2 of 2" in stderr
    assert "part 1:" in stderr and "0/1" in stderr   # the progress bar, before the run came back


def test_piped_stderr_gets_neither_the_parts_nor_a_progress_bar():
    assert _stderr_of_parts_that_train(on_a_terminal=False) == ("a script\nseed 0\n[1.5]\ndone\n",
                                                                "")


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


def test_a_count_of_runs_is_marked_whatever_its_margins_a_settled_one_is_not(capsys):
    common.count_line("trains", [5.0, 7.0, -6.0])   # wide margins, but runs other kernels can tip
    common.count_line("settles", [500.0, 700.0, 600.0], tipping=100.0)
    assert capsys.readouterr().out.splitlines() == ["⚙ trains: 2 of 3 seeds, mostly",
                                                    "settles: 3 of 3 seeds, holds"]
