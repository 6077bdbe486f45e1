"""What every numbered script shares: arguments, seeding, headers, tables, timing lines, figures.

A script defines each part as a function that RETURNS its numbers (tests import these) and a
`show_*` function that calls it, prints its tables and draws its figure; `main` wires the shows
to the command line:

    def soft_lookup(scales=(1, 4, 16, 64)) -> dict: ...          # numbers only
    def show_soft_lookup(args): header(1, __doc__); r = soft_lookup(); table(...)
    PARTS = {1: show_soft_lookup, 2: ...}
    if __name__ == "__main__":
        common.main(__doc__, PARTS)

The module docstring lists the parts, one line each, as their headers print them
("Part 1 · §2.1 Attention as a soft lookup"; a long one continues on indented lines): `header`
prints that line, and `--help` lists them, answered here on import, before numpy and torch load.

Conventions: each part prints a header naming its section of the notes, then tables and prose
(`note`; `kernel_note` and `timing` for the marked lines below). A line that reports wall-clock
time starts with ⏱ and is the only kind of line allowed to differ between two runs with the same
seed. A line whose digits depend on the CPU's floating-point kernels (float32 training, chaotic
runs) carries ⚙; every other line prints identically on any CPU.
"""
from __future__ import annotations

from lecture06 import threads  # noqa: F401  (first: one BLAS thread, set before numpy loads)

import argparse
import dataclasses
import functools
import importlib.util
import inspect
import io
import math
import os
import re
import signal
import statistics
import sys
import time
from contextlib import contextmanager

from lecture06 import paths

DEFAULT_SEED = 0
_MISSING = [name for name in ("numpy", "scipy", "torch", "matplotlib", "tabulate")
            if importlib.util.find_spec(name) is None]
_ADVICE = (f"This Python ({sys.executable}) lacks {', '.join(_MISSING)}. Run `make all` (it builds "
           ".venv from requirements.txt) or run the script with .venv/bin/python.")


def _part_entries(doc: str | None) -> dict:
    """{number: [its lines]}: a docstring's lines "Part N · §S Title", each with the indented lines
    that continue it."""
    entries, number = {}, None
    for line in (doc or "").splitlines():
        start = re.match(r"Part (\d+) · \S", line)
        if start:
            number = int(start[1])
            entries[number] = [line]
        elif number is not None and line.startswith(" ") and line.strip():
            entries[number].append(line)
        else:
            number = None
    return entries


def part_lines(doc: str | None) -> dict:
    """{number: header line}, as `header` prints it, from the script's docstring."""
    return {number: " ".join(line.strip() for line in lines)
            for number, lines in _part_entries(doc).items()}


def declared_seeds(doc: str | None) -> int | None:
    """The default of --seeds as the docstring states it ("--seeds seeds (default 5)"), or None:
    the script measures no claim over seeds."""
    stated = re.search(r"--seeds seeds \(default (\d+)\)", " ".join((doc or "").split()))
    return int(stated[1]) if stated else None


def _seed(text: str) -> int:
    if not text.isdigit() or int(text) >= 2 ** 32:  # numpy's range
        raise argparse.ArgumentTypeError(f"{text!r} is not a seed; pass a whole number from 0 to "
                                         f"{2 ** 32 - 1}, e.g. --seed 1")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seeds; pass how many seeds "
                                         "each claim is counted over, 1 or more, e.g. --seeds 3")
    return int(text)


def _figures_dir(text: str) -> str:
    """A folder we can write figures into (made if missing): checked now, not after seconds of
    training."""
    path = os.path.abspath(text) if text else ""
    if not text:
        raise argparse.ArgumentTypeError("an empty path; to draw no figures, use --no-figures")
    if os.path.exists(path) and not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write in {existing}; choose another folder or "
                                         "--no-figures")
    return path


def _parser(doc: str | None, part_numbers, seeds: int | None) -> argparse.ArgumentParser:
    """The command line; its description is the docstring's first line and its parts' lines."""
    first_line = (doc or "").strip().splitlines()[:1]
    entries = [line for lines in _part_entries(doc).values() for line in lines]
    description = "\n".join(first_line + ([""] if entries else []) + entries)
    parser = argparse.ArgumentParser(description=description,
                                     epilog=_ADVICE if _MISSING else None,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=_seed, default=DEFAULT_SEED,
                        help=f"random seed (default {DEFAULT_SEED})")
    if seeds is not None:
        parser.add_argument("--seeds", type=_count, metavar="N",
                            help="how many seeds (--seed, --seed + 1, ...) each training claim is "
                                 f"measured over (default {seeds}; 1 with --quick)")
    parser.add_argument("--part", type=int, choices=sorted(part_numbers),
                        help="run only this part (default: all)")
    parser.add_argument("--quick", action="store_true",
                        help="smaller sizes" + (" and one seed" if seeds is not None else "") + ", "
                             "for a fast check (tests use it). Draws no figures unless --figures "
                             "is given, so the committed full-size ones stay")
    parser.add_argument("--figures", metavar="DIR", type=_figures_dir,
                        help="where to write figures (default: figures/ at the repository root)")
    parser.add_argument("--no-figures", action="store_true", help="draw no figures")
    return parser


def _parse(parser: argparse.ArgumentParser, argv, seeds: int | None) -> argparse.Namespace:
    """The arguments, or one line saying what was wrong and what to pass (argparse's exit 2).
    seeds: the default of --seeds (parse_args), filled in before the range is checked."""
    args = parser.parse_args(argv)
    if args.no_figures and args.figures is not None:
        parser.error("--figures DIR writes figures and --no-figures draws none: pass one of them")
    if seeds is not None and args.seeds is None:
        args.seeds = 1 if args.quick else seeds
    last = 2 ** 32 - 1   # numpy's largest seed
    if seeds is not None and args.seed + args.seeds - 1 > last:
        parser.error(f"--seed {args.seed} --seeds {args.seeds} would run past the largest seed, "
                     f"{last}: pass a smaller --seed or fewer --seeds")
    return args


def _answer_the_command_line_now():
    """Run as a numbered script, answer its --help and refuse bad arguments now, from its docstring
    (bound before the script's `import common`): before numpy and torch load (2 s). main parses the
    same command line again, with the script's PARTS, and a test holds the two to the same text."""
    script = sys.modules.get("__main__")
    path, doc = getattr(script, "__file__", None), getattr(script, "__doc__", None)
    if path and sys.argv[:1] and os.path.abspath(sys.argv[0]) == os.path.abspath(path):
        # Ctrl-C while numpy and torch load (seconds): one line, not the import's traceback (an
        # ignored SIGINT, as a shell gives a background job, stays ignored)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _interrupted)
        if part_lines(doc):
            seeds = declared_seeds(doc)
            _parse(_parser(doc, part_lines(doc), seeds), sys.argv[1:], seeds)


def _interrupted(*_):
    """How a script ends at Ctrl-C: one line, exit status 128 + SIGINT, as a shell reports it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second Ctrl-C does not interrupt the ending
    sys.stderr.write("\ninterrupted (Ctrl-C)\n")
    sys.stderr.flush()
    os._exit(128 + signal.SIGINT)   # from inside any import: nothing to flush or end yet


_answer_the_command_line_now()
if _MISSING:  # say so now, not in a traceback after half the output
    sys.exit(_ADVICE)

import numpy as np  # noqa: E402  (the imports follow the check above)
from tabulate import tabulate  # noqa: E402

from lecture06 import progress  # noqa: E402
from lecture06 import runner  # noqa: E402

TIMER = "⏱"     # a wall-clock time: differs from run to run
# digits that depend on the CPU's floating-point kernels (float32 training, which of many
# rounding-level differences is the largest): they may differ on your CPU, the effect does not
KERNELS = "⚙"


def seed_everything(seed: int, uses_torch: bool = True):
    """Seed numpy's legacy global generator, torch and transformer.py's generators.

    uses_torch=False leaves torch alone, so a script that never uses it does not pay for importing
    it.
    """
    from lecture06 import transformer
    np.random.seed(seed)
    transformer.set_seed(seed)
    if uses_torch:
        import torch
        torch.manual_seed(seed)


def header(part: int, doc: str, *shown: str):
    """Print the part's header line as the script's docstring words it ("Part 1 · §2.1 Attention as
    a soft lookup"), the line `--help` lists. shown: how the line names the sizes the part uses
    ("d = 512"); a line that no longer says them is an error, not a stale title."""
    line = part_lines(doc).get(part)
    if line is None:
        raise ValueError(f"the docstring has no line 'Part {part} · §section title' for part "
                         f"{part}")
    stale = [text for text in shown if text not in line]
    if stale:
        raise ValueError(f"part {part} uses {', '.join(stale)}; its docstring line says {line!r}")
    print(f"\n{line}")
    print("─" * len(line))


def table(rows, headers=(), floatfmt="g", kernel_dependent: bool = False, static_columns=(0,),
          **kwargs):
    """A tabulate table; kernel_dependent=True marks every row with ⚙ (its digits depend on the
    CPU), and a row whose first cell starts with ⚙ is marked too.

    In a table with ⚙ rows, tabulate would size a column by its widest cell, ⚙ ones included, and
    so move the unmarked header and rule with the float kernels' digits. There the columns are as
    wide as the header (plus tabulate's 2), the unmarked rows and the ⚙ rows' `static_columns`
    (their labels and settings, not the kernels' digits): a wider ⚙ cell overflows its own row."""
    if kernel_dependent:
        rows = [[f"{KERNELS} {row[0]}", *row[1:]] for row in rows]
    # headers named in a list (not tabulate's "keys" or "firstrow")
    if (isinstance(headers, (list, tuple)) and headers
            and any(str(row[0]).startswith(KERNELS) for row in rows)):
        print(_fixed_width_table(rows, [str(header) for header in headers], floatfmt,
                                 static_columns, **kwargs))
    else:
        print(tabulate(rows, headers=headers, floatfmt=floatfmt, **kwargs))


def _per_column(option, n_columns: int, default) -> list:
    """tabulate's per-column option (one value for all, or one per column, the columns past the
    given ones taking tabulate's default) as a list."""
    if not isinstance(option, (list, tuple)):
        return [option] * n_columns
    return list(option) + [default] * (n_columns - len(option))


def _formatted_column(cells, floatfmt, intfmt, missingval, disable_numparse) -> list[str]:
    """The column's cells as tabulate formats them (its number types, floatfmt, missingval), one
    tab-separated line per cell, after a row number (a missing last cell leaves no tab)."""
    text = tabulate([[i, cell] for i, cell in enumerate(cells)], tablefmt="tsv",
                    floatfmt=("g", floatfmt), intfmt=("", intfmt),
                    missingval=("", missingval), disable_numparse=disable_numparse)
    return [line.partition("\t")[2].strip() for line in text.split("\n")]


def _is_number(cell, disable_numparse: bool) -> bool:
    """Whether tabulate would align the cell as a number (right)."""
    if isinstance(cell, bool) or cell is None or disable_numparse:   # then every cell is text
        return False
    if isinstance(cell, (int, float, np.integer, np.floating)):
        return True
    try:
        float(cell)
    except (TypeError, ValueError):
        return False
    return True


def _fixed_width_table(rows, headers, floatfmt, static_columns, intfmt="", missingval="",
                       disable_numparse: bool = False) -> str:
    """tabulate's plain "simple" table, but for the widths (see table): numbers right-aligned,
    text left-aligned, two spaces between columns."""
    n = len(headers)
    rows = [list(row) + [None] * (n - len(row)) for row in rows]
    marked = [str(row[0]).startswith(KERNELS) for row in rows]
    floatfmts, intfmts = _per_column(floatfmt, n, "g"), _per_column(intfmt, n, "")
    missingvals = _per_column(missingval, n, "")
    columns = [_formatted_column([row[j] for row in rows], floatfmts[j], intfmts[j],
                                 missingvals[j], disable_numparse) for j in range(n)]
    numeric = [any(row[j] is not None for row in rows)
               and all(row[j] is None or _is_number(row[j], disable_numparse) for row in rows)
               for j in range(n)]
    widths = [max([len(headers[j]) + 2] + [len(cell) for cell, kernels in zip(columns[j], marked)
                                           if not kernels or j in static_columns])
              for j in range(n)]

    def line(cells) -> str:
        return "  ".join(cell.rjust(width) if right else cell.ljust(width)
                         for cell, width, right in zip(cells, widths, numeric)).rstrip()
    body = [line([column[i] for column in columns]) for i in range(len(rows))]
    return "\n".join([line(headers), "  ".join("-" * width for width in widths), *body])


def note(text: str):
    """Prose between the tables, the one way a script prints it: unmarked lines, which print alike
    on any CPU (kernel_note's ⚙ lines and timing's ⏱ lines are the other two kinds)."""
    print(text)


def _marked(mark: str, text: str):
    """Every line of text marked, so that no continuation line passes for one that repeats
    exactly."""
    print("\n".join(f"{mark} {line}" for line in text.split("\n")))


def kernel_note(text: str):
    """Lines whose digits depend on the CPU's floating-point kernels: marked ⚙, like ⏱ for
    timings."""
    _marked(KERNELS, text)


def sci(x: float, digits: int = 2) -> str:
    """6.98771e-04 -> '6.99e-4', the way the notes write numbers."""
    if x == 0:
        return "0"
    mantissa, exponent = f"{x:.{digits}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def at_most(value: float, bound: float) -> str:
    """A rounding-level value as a bound that holds on any CPU ("≤ 1e-13"); its digits depend on the
    float kernels, the bound does not. Above the bound, the value itself: that is a finding."""
    if value <= bound:
        return f"≤ {bound:.0e}"
    return f"{value:.1e}, MORE than the {bound:.0e} of rounding"


def holds(margins) -> int:
    """At how many seeds a claim holds, given its margin at each (> 0 where it holds, < 0 where it
    fails)."""
    return sum(m > 0 for m in margins)


# One rule for every claim counted over seeds (README, "How to read the output"). A claim that rests
# on training is a statement about the distribution of runs: its margin at each seed (how much it
# holds by, in its own unit) is a draw, and Wilcoxon's signed-rank test, exact at these sizes, asks
# whether the margins lie above zero (the claim holds) or below it (the opposite holds) further
# than a claim with no effect puts them, each direction at FALSE_POSITIVE_RATE.
FALSE_POSITIVE_RATE = 0.05
HOLDS, OPPOSITE = "holds", "the opposite holds"
# The fewest seeds at which the test can decide: all n margins of one sign have p = 2⁻ⁿ
FEWEST_SEEDS = math.ceil(math.log2(1 / FALSE_POSITIVE_RATE))


@dataclasses.dataclass(frozen=True)
class Decision:
    """What a claim's margins over n seeds say. outcome: HOLDS, OPPOSITE or "no clear difference
    at n seeds"; p: the one-sided p-value of the outcome's direction (the claim's where no
    direction is clear); estimate: the Hodges–Lehmann median of the margins (the median of their
    pairwise averages, the estimate that goes with the test); low, high: one-sided 95% confidence
    bounds of the margin (the shifts the test cannot reject; ±inf where n is too small)."""
    k: int
    n: int
    outcome: str
    p: float
    estimate: float
    low: float
    high: float


def decide(margins) -> Decision:
    """The one rule: a claim's margins at n ≥ 2 seeds (> 0 where it holds) -> its Decision. HOLDS
    when the signed-rank test puts the margins above zero at p ≤ FALSE_POSITIVE_RATE, OPPOSITE when
    it puts them below, otherwise no clear difference; the bounds are where the same test turns
    (so "holds" exactly when low > 0, on margins without ties)."""
    margins = np.asarray(margins, dtype=float)
    n = len(margins)
    if n < 2 or not np.isfinite(margins).all():
        raise ValueError(f"a claim over seeds needs 2 or more finite margins, got {margins}; one "
                         "seed is an observation of that seed, not a verdict (count_line says so)")
    above, below = signed_rank_p(margins, "greater"), signed_rank_p(margins, "less")
    outcome = outcome_of(above, below, n)
    p = below if outcome == OPPOSITE else above
    pairs = np.triu_indices(n)
    walsh = (margins[pairs[0]] + margins[pairs[1]]) / 2   # every pairwise average, each with itself
    low, high = _confidence_bounds(margins, np.unique(walsh))
    return Decision(int(holds(margins)), n, outcome, p, float(np.median(walsh)), low, high)


def outcome_of(above: float, below: float, n: int) -> str:
    """The rule's word from the one-sided p-values of "the margins lie above zero" and "below"."""
    if above <= FALSE_POSITIVE_RATE:
        return HOLDS
    return OPPOSITE if below <= FALSE_POSITIVE_RATE else f"no clear difference at {n} seeds"


def signed_rank_p(margins, alternative: str):
    """scipy's signed-rank test, one-sided ("greater": the margins lie above zero), along the last
    axis: exact without ties; with ties or zeros the exact permutation distribution (n ≤ 13) or
    the normal one (scipy's choice). Margins that are all zero show nothing: p = 1."""
    from scipy import stats   # here, not at the top: 0.6 s that only the training scripts need
    margins = np.asarray(margins, dtype=float)
    if not margins.any():
        return 1.0
    p = stats.wilcoxon(margins, alternative=alternative, axis=-1).pvalue
    return float(p) if np.ndim(p) == 0 else p


def _confidence_bounds(margins: np.ndarray, walsh: np.ndarray) -> tuple[float, float]:
    """The one-sided 95% bounds of the margins' shift, by inverting the test: shifted by δ, the
    margins' p changes only where δ crosses a pairwise average (sorted in `walsh`), monotonically,
    so each bound is the average where the test at a point between two of them starts to
    reject."""
    points = np.concatenate([[walsh[0] - 1], (walsh[:-1] + walsh[1:]) / 2, [walsh[-1] + 1]])

    def first(accepts) -> int:   # the first point the test accepts (len(points) if none)
        lo, hi = 0, len(points)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if accepts(points[mid]) else (mid + 1, hi)
        return lo
    i = first(lambda d: signed_rank_p(margins - d, "greater") > FALSE_POSITIVE_RATE)
    j = first(lambda d: signed_rank_p(margins - d, "less") <= FALSE_POSITIVE_RATE)
    return (-math.inf if i == 0 else float(walsh[i - 1]),
            math.inf if j == len(points) else float(walsh[j - 1]))


def seeds_text(k: int, n: int) -> str:
    """ "k of n seeds" """
    return f"{k} of {n} seed{'s' * (n != 1)}"


def effect_text(decision: Decision, unit: str, digits: int = 0) -> str:
    """ "per-seed margin +10 mnat/token, 95% bounds -4 to +37": the estimate and its bounds."""
    return (f"per-seed margin {signed(decision.estimate, digits)} {unit}, 95% bounds "
            f"{signed(decision.low, digits)} to {signed(decision.high, digits)}")


def signed(x: float, digits: int) -> str:
    """+12, -0.4, +∞: with a digit more where the rounding would print a margin that is not zero as
    0."""
    if math.isinf(x):
        return f"{'+' if x > 0 else '-'}∞"
    while x and round(x, digits) == 0 and digits < 6:
        digits += 1
    return f"{x:+.{digits}f}" if x else "0"


def count_line(text: str, margins, unit: str, digits: int = 0, notes: str = ""):
    """Print "text: k of n seeds; <outcome> (p = …); per-seed margin …, 95% bounds … to …" for a
    claim whose margin (in `unit`) at each seed is in `margins`, marked ⚙: trained runs' digits
    depend on the float kernels (make check compares the line by its claim and outcome). At one
    seed, what that seed shows: an observation, not a verdict."""
    margins = [float(m) for m in margins]
    if len(margins) == 1:
        line = (f"{text}: {'yes' if margins[0] > 0 else 'no'} at the one seed run, an observation "
                f"of that seed, not a verdict; margin {signed(margins[0], digits)} {unit}")
    else:
        decision = decide(margins)
        line = (f"{text}: {seeds_text(decision.k, decision.n)}; {decision.outcome} "
                f"(p = {decision.p:.2g}); {effect_text(decision, unit, digits)}")
        if decision.outcome not in (HOLDS, OPPOSITE):
            _undecided.append(decision.n)
    kernel_note(line + (f"   (notes: {notes})" if notes else ""))


_undecided = []   # the seed counts of this part's claims that showed no clear difference


def _say_how_to_count_more():
    """After a part whose claims include one with no clear difference: how to count more seeds."""
    if _undecided:
        kernel_note(f"No clear difference at {max(_undecided)} seeds is not no difference: "
                    f"--seeds {max(20, 2 * max(_undecided))} counts more (figures/seeds_output.txt "
                    "decides every claim at 10 seeds).")
        _undecided.clear()


def timing(text: str):
    """Lines reporting a wall-clock measurement: marked ⏱, so that determinism checks skip them."""
    _marked(TIMER, text)


class _Elapsed:
    def __init__(self):
        self.wall_start, self.cpu_start = time.perf_counter(), time.process_time()

    def __call__(self) -> float:
        return time.perf_counter() - self.wall_start

    def cpu(self) -> float:
        return time.process_time() - self.cpu_start


@contextmanager
def stopwatch():
    """`with stopwatch() as elapsed: ...`; then elapsed() is the wall-clock seconds since entering
    and elapsed.cpu() this process's CPU seconds (which other programs on a shared machine disturb
    less)."""
    yield _Elapsed()


def median_time(f, repeats: int, warmup: int = 0, budget: float = math.inf) -> tuple[float, float]:
    """(wall-clock, CPU) median seconds of f() over up to `repeats` calls after `warmup` uncounted
    ones, stopping early once `budget` wall-clock seconds are spent (at least one counted call)."""
    for _ in range(warmup):
        f()
    wall, cpu = [], []
    while len(wall) < repeats and sum(wall) < budget:
        with stopwatch() as elapsed:
            f()
        wall.append(elapsed())
        cpu.append(elapsed.cpu())
    return statistics.median(wall), statistics.median(cpu)


def draws_figure(draw):
    """Decorates a `draw_*(..., figures_dir)`: with figures_dir None (--quick, --no-figures) it
    returns None at once, so a run that writes no figure neither imports matplotlib (0.5 s) nor
    draws one."""
    signature = inspect.signature(draw)

    @functools.wraps(draw)
    def draw_if_wanted(*args, **kwargs):
        if signature.bind(*args, **kwargs).arguments.get("figures_dir") is None:
            return None
        import matplotlib
        matplotlib.use("Agg")  # files only, no display: before pyplot's first import
        return draw(*args, **kwargs)
    return draw_if_wanted


def save_figure(fig, name: str, figures_dir: str | None):
    """Write figures/<name>.png (name like '01_softmax_saturation'); do nothing with
    --no-figures."""
    import matplotlib.pyplot as plt
    if figures_dir is None:
        plt.close(fig)
        return None
    os.makedirs(figures_dir, exist_ok=True)
    path = os.path.join(figures_dir, f"{name}.png")
    rendered = io.BytesIO()
    fig.savefig(rendered, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    # a file with the same pixels stays as it is: `make all` on a clone rewrites only the figures
    # that look different (PNG's compression may differ between builds of zlib and libpng)
    if not _same_pixels(path, rendered):
        with open(path, "wb") as f:
            f.write(rendered.getvalue())
    print(f"[figure] {os.path.relpath(path, paths.ROOT) if path.startswith(paths.ROOT) else path}")
    return path


def _same_pixels(path: str, rendered: io.BytesIO) -> bool:
    """Whether the PNG at path exists and decodes to the same size, mode and pixels as
    rendered."""
    from PIL import Image
    if not os.path.isfile(path):
        return False
    rendered.seek(0)
    try:
        with Image.open(path) as old, Image.open(rendered) as new:
            return (old.size == new.size and old.mode == new.mode
                    and old.tobytes() == new.tobytes())
    except OSError:   # not a PNG we can read: write over it
        return False


def parse_args(doc: str, part_numbers, argv=None, seeds: int | None = None):
    """The command line. seeds: the default of --seeds, for a script that measures a training claim
    over seeds; None: the script has no such claim, and no --seeds option."""
    args = _parse(_parser(doc, part_numbers, seeds), argv, seeds)
    if args.no_figures or (args.quick and args.figures is None):
        args.figures = None
    elif args.figures is None:
        args.figures = paths.FIGURES
    return args


def seeds_of(args) -> list[int]:
    """The seeds a training claim is measured over: --seed, --seed + 1, ... (--seeds of them)."""
    return [args.seed + i for i in range(args.seeds)]


def main(doc: str, parts: dict, argv=None, uses_torch: bool = True, seeds: int | None = None,
         train_ahead: dict | None = None):
    """Run the selected parts. parts: {number: callable(args) -> None} that computes, prints and
    draws.

    uses_torch=False: the script never touches torch, so seeding skips importing it (about 2 s).
    seeds: see parse_args.
    train_ahead: {part number: runs(args) -> (fn, [run, ...])}, the runs that part will ask
    runner.map for: they start now, before part 1, and train while the parts before it compute
    (runner.py). Only faster: without it every line printed is the same; a run it names that no
    part asks for is named on stderr when the parts are done.
    """
    if argv is not None:   # called from Python (a test): errors propagate as they are
        args = parse_args(doc, parts.keys(), argv, seeds)
        _run_parts(doc, parts, args, uses_torch, train_ahead or {})
        return args
    try:
        if signal.getsignal(signal.SIGINT) is _interrupted:
            # from here a Ctrl-C is a KeyboardInterrupt, caught below once the workers are ended
            signal.signal(signal.SIGINT, signal.default_int_handler)
        args = parse_args(doc, parts.keys(), argv, seeds)
        _run_parts(doc, parts, args, uses_torch, train_ahead or {})
        # here, where a reader that went away is caught, not at the interpreter's exit
        sys.stdout.flush()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second Ctrl-C does not interrupt this
        runner.shutdown()
        sys.stderr.write("\ninterrupted (Ctrl-C)\n")
        sys.exit(128 + signal.SIGINT)
    # the reader went away (`| head`): stop quietly, as a command-line tool does
    except BrokenPipeError:
        runner.shutdown()
        # nothing left to flush at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + getattr(signal, "SIGPIPE", 13))
    return args


def _show_progress(number: int, count: int):
    """Which part runs, on the screen: `make all` sends the tables to a file and stderr to the
    screen. Only there: the committed outputs and the tests' captures never see it, and a reader
    whose tables come to the terminal sees each part's header instead."""
    progress.label = f"part {number}"   # the progress bar's, while runs train
    if sys.stderr.isatty() and not sys.stdout.isatty():
        sys.stderr.write(f"{os.path.basename(sys.argv[0])}: part {number} of {count}\n")


def _run_parts(doc: str, parts: dict, args, uses_torch: bool, train_ahead: dict):
    for number, runs_of in train_ahead.items():
        if args.part in (None, number):
            runner.start(*runs_of(args))
    title = (doc or "").strip().splitlines()[0] if doc else ""
    print(title)
    print(f"seed {args.seed}{' · quick' if args.quick else ''}")
    for number in sorted(parts):
        if args.part is None or args.part == number:
            _show_progress(number, len(parts))
            # each part starts from the same state, whether run alone or not
            seed_everything(args.seed, uses_torch)
            _undecided.clear()   # this part's claims only
            parts[number](args)
            _say_how_to_count_more()
    runner.report_runs_never_asked_for()
