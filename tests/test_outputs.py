"""Every script, run as a reader runs it (quick form, from another directory):
- its output matches the stored golden output: every line not marked ⏱ or ⚙, numbers rounded to 3 digits
  (`make golden` writes the golden files, nobody else);
- under other float kernels (torch's generic ones, another OpenBLAS core type, two BLAS threads) it prints
  the same unmarked lines: only ⏱ (timings) and ⚙ (kernel-dependent digits) may move. For a script with
  no ⚙ line this second run is also the check that a run repeats itself;
- another seed moves the numbers of a part that draws random numbers (one cheap part per script).
Each script's runs happen once, on one xdist worker (its tests share an xdist_group). That ⚙ lines repeat
bit for bit on one machine is tested where they are made (test_city_train, test_07_sentiment).
"""
import os
import platform

import pytest

from outputs import SCRIPTS, golden_path, normalise, run_quick, script_id, section, without_timings


def other_kernels() -> dict:
    """Environment for a run on other float kernels than this machine's defaults."""
    env = {"ATEN_CPU_CAPABILITY": "default",  # torch's generic C++ kernels instead of AVX2/AVX-512/NEON ones
           "OPENBLAS_NUM_THREADS": "2"}       # numpy's BLAS on two threads instead of threads.py's one
    # another OpenBLAS kernel family; a core type the machine's own setup chose (for a CPU that needs it) stays
    if "OPENBLAS_CORETYPE" not in os.environ:
        env["OPENBLAS_CORETYPE"] = "Sandybridge" if platform.machine() in ("x86_64", "AMD64") else "ARMV8"
    return env


# Results fixed by their setup (formulas, exact computations): they print at any seed (golden checks the digits).
DETERMINISTIC = {
    "01": ["23.795", "20.000"],
    "02": ["3.714", "60,611", "63,082,496", "214,245,376", "37.5"],
    "03": ["1000.407606", "624"],
    "05": ["12.72", "6.99e-4", "1.40e-4"],
    "06": ["124,439,808", "284.8", "4608", "24576"],
}
# The part a --seed 1 run repeats: a cheap one that draws random numbers (None: the whole quick run).
# 06 has none: it is formulas and counters but for its ⏱ timings.
OTHER_SEED_PART = {"01": None, "02": None, "03": 2, "04": 2, "05": 1, "07": 1}

_runs = {}


def run(path: str, kind: str) -> str:
    """The script's quick output: kind "seed 0", "other kernels" or "seed 1"; each run once."""
    if (path, kind) not in _runs:
        if kind == "seed 1":
            _runs[path, kind] = run_quick(path, 1, part=OTHER_SEED_PART[script_id(path)])
        else:
            _runs[path, kind] = run_quick(path, 0, other_kernels() if kind == "other kernels" else None)
    return _runs[path, kind]


@pytest.fixture(params=[pytest.param(p, id=script_id(p), marks=pytest.mark.xdist_group(script_id(p)))
                        for p in SCRIPTS])
def script_path(request):
    return request.param


def test_matches_golden_output(script_path):
    with open(golden_path(script_path)) as f:
        expected = f.read()
    assert normalise(run(script_path, "seed 0")) == expected, (
        f"{os.path.basename(script_path)}'s quick output moved from tests/golden/{script_id(script_path)}.txt. "
        "If you changed nothing, a line whose digits depend on your CPU lacks its ⚙ marker (a bug: please "
        "report it); if you changed the script on purpose, run `make golden` and review the diff")


def test_other_kernels_print_the_same_unmarked_lines(script_path):
    assert normalise(run(script_path, "other kernels")) == normalise(run(script_path, "seed 0"))


def test_deterministic_results_print(script_path):
    output = run(script_path, "seed 0")
    for value in DETERMINISTIC.get(script_id(script_path), []):
        assert value in output, f"{value} should print"


@pytest.mark.parametrize("script_id_", [pytest.param(s, marks=pytest.mark.xdist_group(s)) for s in sorted(OTHER_SEED_PART)])
def test_other_seed_moves_random_numbers_only(script_id_):
    path = next(p for p in SCRIPTS if script_id(p) == script_id_)
    first, other, part = run(path, "seed 0"), run(path, "seed 1"), OTHER_SEED_PART[script_id_]
    if part is None:
        for value in DETERMINISTIC.get(script_id_, []):
            assert value in other, f"{value} should print at every seed"
        assert without_timings(first) != without_timings(other), "a different seed changed nothing"
    else:
        ours = [line for line in section(first, part) if not line.startswith("⏱")]
        assert ours and ours != [line for line in section(other, part) if not line.startswith("⏱")], \
            f"a different seed changed nothing in part {part}"
