"""Every script, run as a reader runs it (quick form, from another directory):
- its output matches the stored golden output: every line not marked ⏱ or ⚙, numbers rounded to 3 digits
  (`make golden` writes the golden files, nobody else);
- under other float kernels (torch's generic ones, another OpenBLAS core type, two BLAS threads) it prints
  the same unmarked lines: only ⏱ (timings) and ⚙ (kernel-dependent digits) may move;
- twice with the same seed on the same machine it prints the same lines, ⚙ ones included, except ⏱;
- another seed moves the random-effect numbers but never the deterministic ones.
Each script's runs happen once, on one xdist worker (its tests share an xdist_group).
"""
import os
import platform

import pytest

from outputs import KERNELS, SCRIPTS, golden_path, normalise, portable, run_quick, script_id, without_timings


def other_kernels() -> dict:
    """Environment for a run on other float kernels than this machine's defaults."""
    env = {"ATEN_CPU_CAPABILITY": "default",  # torch's generic C++ kernels instead of AVX2/AVX-512/NEON ones
           "OPENBLAS_NUM_THREADS": "2"}       # numpy's BLAS on two threads instead of threads.py's one
    # another OpenBLAS kernel family; a core type the machine's own setup chose (for a CPU that needs it) stays
    if "OPENBLAS_CORETYPE" not in os.environ:
        env["OPENBLAS_CORETYPE"] = "Sandybridge" if platform.machine() in ("x86_64", "AMD64") else "ARMV8"
    return env


# Deterministic results (formulas, exact computations) that must print identically at any seed.
DETERMINISTIC = {
    "01": ["23.795", "20.000"],
    "02": ["3.714", "60,611", "63,082,496", "214,245,376", "37.5"],
    "03": ["1000.407606", "624"],
    "05": ["12.72", "6.99e-4", "1.40e-4"],
    "06": ["124,439,808", "284.8", "4608", "24576"],
}

_runs = {}


def run(path: str, kind: str) -> str:
    """The script's quick output: kind "seed 0", "seed 0 again", "other kernels" or "seed 1"; each run once."""
    if (path, kind) not in _runs:
        seed, env = {"seed 0": (0, None), "seed 0 again": (0, None), "other kernels": (0, other_kernels()),
                     "seed 1": (1, None)}[kind]
        _runs[path, kind] = run_quick(path, seed, env)
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
    assert portable(run(script_path, "other kernels")) == portable(run(script_path, "seed 0"))


def test_same_seed_prints_the_same(script_path):
    first = run(script_path, "seed 0")
    # with no ⚙ line, the other-kernels run is already a second run that must repeat every line but ⏱ ones
    again = run(script_path, "seed 0 again" if KERNELS in first else "other kernels")
    assert without_timings(again) == without_timings(first)


def test_other_seed_moves_random_numbers_only(script_path):
    first, other = run(script_path, "seed 0"), run(script_path, "seed 1")
    for value in DETERMINISTIC.get(script_id(script_path), []):
        assert value in first and value in other, f"{value} should print at every seed"
    if script_id(script_path) != "06":  # 06 is all formulas and counters except its ⏱ timings
        assert without_timings(first) != without_timings(other), "a different seed changed nothing"
