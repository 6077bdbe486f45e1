"""Every script, run as a reader runs it (quick form, from another directory), but on other float
kernels than the ones `make golden` used (torch's generic ones on one thread, another OpenBLAS core
type, MKL's compatible code path, numpy's own loops without AVX-512):
- it prints the stored golden output: every line not marked ⏱ or ⚙, every digit as printed. The one
  run proves both that the script still prints what it printed and that its unmarked lines do not
  depend on the float kernels: only ⏱ (timings) and ⚙ (kernel-dependent digits) may move. On a
  mismatch the test reruns the script on this machine's own kernels to say which of the two failed;
- another seed moves the numbers of a part that draws random numbers (one cheap part per script, in
  process).
Each script runs once, forked from a process that imported numpy and torch on those kernels once
(outputs.run_quick_preloaded, one per xdist worker). Each script's tests are an xdist group of their
own: its run is a subprocess with nothing to share with another script's, and one group for all
(~80 s: 04's and 05's runs take ~24 s each) was make test's longest pole. That
⚙ lines repeat bit for bit on one machine is tested where they are made (test_city_train,
test_07_sentiment).
"""
import os
import platform

import pytest

from conftest import load_script
from outputs import (SCRIPTS, differing_lines, golden_path, normalise, prints_number, run_full,
                     run_quick, run_quick_preloaded, script_id, section, verdicts)


def other_kernels() -> dict:
    """Environment for a run on other float kernels than this machine's defaults."""
    # torch's generic C++ kernels instead of AVX2/AVX-512/NEON ones; torch on one thread where a
    # script leaves it its default (one per core: another split of its reductions; training pins
    # one). Two threads spun against the other xdist worker's run: 1 thread took 9-12 s less CPU
    # over the quick runs (03, 05, 06 most). numpy's BLAS stays on threads.py's one: on two cores,
    # two BLAS threads in each of two training workers spin on each other (07's run took 18 s of
    # CPU instead of 7.5)
    env = {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}
    # a kernel choice the machine's own setup made (for a CPU that needs it) stays
    env.update({name: value for name, value in other_library_kernels().items()
                if name not in os.environ})
    return env


def other_library_kernels() -> dict:
    """Other kernels in the libraries under numpy and torch: another OpenBLAS kernel family; MKL's
    compatible code path (MKL is torch's BLAS on x86_64); numpy's own SIMD loops (sin, cos, exp,
    sums) without their AVX-512 groups, named only where this numpy dispatches them: numpy refuses
    to disable a group it does not have (an ImportWarning, or an error under -W error)."""
    from numpy._core import _multiarray_umath as numpy_simd
    x86 = platform.machine() in ("x86_64", "AMD64")
    env = {"OPENBLAS_CORETYPE": "Sandybridge" if x86 else "ARMV8", "MKL_CBWR": "COMPATIBLE"}
    avx512 = [group for group in numpy_simd.__cpu_dispatch__
              if group == "X86_V4" or group.startswith("AVX512")]
    if avx512:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(avx512)
    return env


# Results fixed by their setup (formulas, exact computations), as printed: each must print as a
# whole number (prints_number: "37.52" is not found in "37.521") at any seed and on any kernels.
DETERMINISTIC = {
    "01": ["23.795", "20.000"],
    "02": ["3.714", "60,611", "63,082,496", "214,245,376", "37.52"],
    "03": ["1000.407606", "624"],
    "05": ["12.72", "6.99e-4", "1.40e-4"],
    "06": ["124,439,808", "284.8", "4608", "24576"],
    "08": ["11,008", "28,672", "14,336", "3,145,728", "2,147,483,648", "1,342,177,280"],
}
# The part a --seed 1 run repeats: a cheap one that draws random numbers (None: the whole quick
# run). 06 has none: it is formulas and counters but for its ⏱ timings. 08's first random
# numbers are part 3's query and key, printed before the part trains.
OTHER_SEED_PART = {"01": None, "02": None, "03": 2, "04": 2, "05": 1, "07": 1, "08": 3}
# Where the repeated part trains after its random lines: the function that trains, left out (the
# seed's effect on training is the scripts' tests' business); the lines before it are compared.
TRAINS_LAST = {"08": "show_extrapolation"}

_runs = {}


def run(path: str) -> str:
    """The script's quick output on other float kernels, run once."""
    if path not in _runs:
        _runs[path] = run_quick_preloaded(path, other_kernels())
    return _runs[path]


def own_group(script_id_: str):
    """The xdist group of one script's tests here (its run is cached in the worker's _runs)."""
    return pytest.mark.xdist_group(f"test_outputs {script_id_}")


@pytest.fixture(params=[pytest.param(p, id=script_id(p), marks=own_group(script_id(p)))
                        for p in SCRIPTS])
def script_path(request):
    return request.param


def test_other_kernels_print_the_golden_output(script_path):
    with open(golden_path(script_path)) as f:
        expected = f.read()
    printed = normalise(run(script_path))
    if printed != expected:
        name, golden = os.path.basename(script_path), f"tests/golden/{script_id(script_path)}.txt"
        if normalise(run_quick(script_path)) == expected:
            why = (f"{name} prints {golden} on this machine's own float kernels but not on others: "
                   "a line whose digits depend on the kernels lacks its ⚙ marker "
                   "(a bug: please report it)")
        else:
            why = (f"{name}'s quick output moved from {golden} on this machine's own kernels too. "
                   "If you changed the script on purpose, run `make golden` and review the diff; "
                   "if you changed nothing, please report it")
        assert printed == expected, why


def test_deterministic_results_print(script_path):
    output = run(script_path)
    for value in DETERMINISTIC.get(script_id(script_path), []):
        assert prints_number(value, output), f"{value} should print"


@pytest.mark.parametrize("script_id_", [pytest.param(n, marks=own_group(n))
                                        for n in sorted(OTHER_SEED_PART)])
def test_other_seed_moves_random_numbers_only(script_id_, capsys, monkeypatch):
    path = next(p for p in SCRIPTS if script_id(p) == script_id_)
    m, part = load_script(os.path.basename(path)), OTHER_SEED_PART[script_id_]
    if script_id_ in TRAINS_LAST:
        monkeypatch.setattr(m, TRAINS_LAST[script_id_], lambda args: None)
    m.common.main(m.__doc__, m.PARTS,
                  ["--quick", "--no-figures", "--seed", "1"]
                  + ([] if part is None else ["--part", str(part)]),
                  seeds=getattr(m, "SEEDS", None))
    printed = capsys.readouterr().out
    other = normalise(printed)
    with open(golden_path(path)) as f:
        first = f.read()   # seed 0's, normalised as `other` is
    if part is None:
        for value in DETERMINISTIC.get(script_id_, []):
            assert prints_number(value, printed), f"{value} should print at every seed"
        assert other.splitlines()[2:] != first.splitlines()[2:], "a different seed changed nothing"
    else:
        ours, seed_0 = section(other, part), section(first, part)
        if script_id_ in TRAINS_LAST:
            seed_0 = seed_0[:len(ours)]
        assert ours and ours != seed_0, \
            f"a different seed changed nothing in part {part}"


@pytest.mark.parametrize("number, text, found",
                         [("37.52", "saving 37.52%", True), ("37.5", "saving 37.52%", False),
                          ("624", "1,624 and 6.24", False), ("624", "(624, 12)", True),
                          ("6.99e-4", "peak 6.99e-4.", True), ("20.000", "20.0001", False)])
def test_prints_number_finds_whole_numbers_only(number, text, found):
    assert prints_number(number, text) is found


def test_normalise_keeps_every_digit_and_drops_marked_lines():
    printed = "a 0.0481  b\n⚙ x 3.6e-15\n⏱ 12 ms\n----  -------\n"
    assert normalise(printed) == "a 0.0481 b\n- -\n"
    assert normalise(printed.replace("0.0481", "0.0482")) != normalise(printed)


def test_the_full_check_finds_a_changed_digit_and_skips_marked_lines():
    committed = "Part 1 · x\nmean 0.0481\n⚙ spread 3.6e-15\n⏱ 12 ms\n"
    on_other_kernels = committed.replace("3.6e-15", "4.1e-15").replace("12 ms", "15 ms")
    assert differing_lines(committed, on_other_kernels) == []
    assert differing_lines(committed, committed.replace("0.0481", "0.0482")) == \
        ["-mean 0.0481", "+mean 0.0482"]


def test_the_full_check_lets_a_run_add_kernel_marks_but_not_change_a_marked_line_s_text():
    committed = "the table's rule\n⚙ median 270\n"
    assert differing_lines(committed, "⚙ the table's rule\n⚙ median 202\n") == []
    assert differing_lines(committed, "⚙ the table's rule!\n⚙ median 202\n") == \
        ["-the table's rule", "-⚙ median 270", "+⚙ the table's rule!", "+⚙ median 202"]


def test_the_full_check_compares_a_count_line_by_its_claim_and_outcome_not_its_digits():
    committed = ("⚙ RoPE lowers it: 5 of 5 seeds; holds (p = 0.031); per-seed margin +87 "
                 "mnat/token, 95% bounds +45 to +224\n")
    other_digits = ("⚙ RoPE lowers it: 6 of 6 seeds; holds (p = 0.016); per-seed margin +80 "
                    "mnat/token, 95% bounds +40 to +200\n")
    assert differing_lines(committed, other_digits) == []
    unclear = committed.replace("5 of 5 seeds; holds",
                                "4 of 5 seeds; no clear difference at 5 seeds")
    assert differing_lines(committed, unclear) == [
        "-RoPE lowers it: holds", "+RoPE lowers it: no clear difference at 5 seeds"]
    assert verdicts(unclear) == {"RoPE lowers it": "no clear difference at 5 seeds"}


def test_a_full_run_names_its_figures_as_make_all_does(tmp_path):
    script = tmp_path / "09_draws.py"
    script.write_text("import os, sys\n"
                      "folder = sys.argv[sys.argv.index('--figures') + 1]\n"
                      "print(f'[figure] {os.path.join(folder, \"09_x.png\")}')\n")
    assert run_full(str(script)) == "[figure] figures/09_x.png\n"


@pytest.mark.parametrize("ending, shown", [
    ("raise SystemExit('09: the data set is missing')", "data set is missing"),
    ("raise ValueError('deep inside')", "ValueError: deep inside")])
def test_a_script_that_fails_in_the_preloaded_process_reports_its_exit_and_error(tmp_path, ending,
                                                                                 shown):
    script = tmp_path / "09_fails.py"
    script.write_text(f"print('part 1 printed')\n{ending}\n")
    with pytest.raises(RuntimeError, match=r"09_fails.py failed \(exit 1\)") as failure:
        run_quick_preloaded(str(script), other_kernels())
    assert shown in str(failure.value)


def test_a_part_s_section_runs_to_the_next_header_not_to_prose_that_starts_with_part():
    text = "Part 5 · §7.6 x\na\nPart 6 · §7.1 y\nPart 5's model, copied\nb\nPart 7 · §8 z\nc\n"
    assert section(text, 6) == ["Part 6 · §7.1 y", "Part 5's model, copied", "b"]
