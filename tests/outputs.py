"""Run the numbered scripts and compare what they print.

`python tests/outputs.py --update [NN ...]` (what `make golden` runs, for every script) rewrites
tests/golden/NN.txt from a fresh quick run of each script named (all when none); nobody edits those
files by hand.
`python tests/outputs.py --full [NN ...]` (what `make check` runs) runs each script in full, as
`make all` does, and compares it with the committed figures/NN_output.txt the same way (but that a
run may add ⚙ to a line it prints with the same text, and that a count line is compared by its
claim and outcome: see differing_lines); it exits 1 if any line or verdict differs.
`python tests/outputs.py --seeds` (what `make seeds` runs) runs the parts that decide claims over
seeds at 10 seeds, compares them with figures/seeds_output.txt the same way, and rewrites it.

Both comparisons keep every unmarked line as printed, every digit of it (runs of spaces folded to
one, table rules to one dash: a rule's width follows the widest cell, which may be a ⚙ one), and
drop lines marked ⏱ (wall-clock times) or ⚙ (digits that depend on the CPU's float kernels; the
scripts' tests assert what those lines show, over several seeds). So a digit of an unmarked line
that moves under other kernels fails them: a rounding-level value prints as a bound that holds
("≤ 1e-14") or carries ⚙.
"""
from __future__ import annotations

import glob
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
GOLDEN = os.path.join(ROOT, "tests", "golden")
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, "code", "lecture06", "0[1-9]_*.py")))
PRELOADED = os.path.join(ROOT, "tests", "preloaded.py")
TIMER, KERNELS = "⏱", "⚙"
TIMEOUT = 300   # seconds for one quick run
FULL_TIMEOUT = 900   # seconds for one full run


def script_id(path: str) -> str:
    return os.path.basename(path)[:2]


def _quick_argv(path: str, seed: int, part: int | None) -> list[str]:
    return [path, "--quick", "--no-figures", "--seed", str(seed)] + ([] if part is None
                                                                     else ["--part", str(part)])


# runner.report_runs_never_asked_for's words: a script whose train_ahead drifted from its part
NEVER_ASKED_FOR = "started ahead but never asked for"


def _failed(path: str, code: int, stderr: str) -> RuntimeError:
    return RuntimeError(f"{os.path.basename(path)} failed (exit {code}):\n{stderr[-3000:]}")


def _check_runs_ahead(path: str, stderr: str):
    """A quick run whose train_ahead starts runs its parts never ask for prints the same output,
    only without the overlap it was declared for: that fails here."""
    if NEVER_ASKED_FOR in stderr:
        raise RuntimeError(f"{os.path.basename(path)}: {stderr.strip()[-3000:]}")


def run_quick(path: str, seed: int = 0, env: dict | None = None, part: int | None = None) -> str:
    """The script's stdout from `--quick --no-figures --seed SEED [--part PART]`, run from a foreign
    directory, with `env` added to the environment (e.g. other float kernels:
    ATEN_CPU_CAPABILITY=default)."""
    result = subprocess.run([sys.executable] + _quick_argv(path, seed, part), capture_output=True,
                            text=True, cwd="/", timeout=TIMEOUT, env={**os.environ, **(env or {})})
    if result.returncode != 0:
        raise _failed(path, result.returncode, result.stderr)
    _check_runs_ahead(path, result.stderr)
    return result.stdout


_preloaded = {}   # environment -> its tests/preloaded.py process


def run_quick_preloaded(path: str, env: dict, seed: int = 0) -> str:
    """run_quick(path, seed, env), forked from a process that imported numpy and torch in that
    environment (tests/preloaded.py, one per environment and pytest process): the same output for ~5
    s less CPU per run. Where fork is not safe with torch loaded (macOS, Windows) it is
    run_quick."""
    if not sys.platform.startswith("linux"):
        return run_quick(path, seed, env)
    key = tuple(sorted(env.items()))
    server = _preloaded.get(key)
    if server is None or server.poll() is not None:
        server = _preloaded[key] = subprocess.Popen(
            [sys.executable, PRELOADED], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            # a session: a timeout kills it and its child
            env={**os.environ, **env}, start_new_session=True)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        server.stdin.write(json.dumps(dict(argv=_quick_argv(path, seed, None), stdout=out,
                                           stderr=err)) + "\n")
        server.stdin.flush()
        if not select.select([server.stdout], [], [], TIMEOUT)[0]:
            os.killpg(server.pid, signal.SIGKILL)
            raise TimeoutError(f"{os.path.basename(path)} --quick did not finish in {TIMEOUT} s")
        answer = server.stdout.readline()
        if not answer:
            raise RuntimeError(f"tests/preloaded.py died (exit {server.wait()}) running "
                               f"{os.path.basename(path)}")
        with open(out, encoding="utf-8") as f_out, open(err, encoding="utf-8") as f_err:
            stdout, stderr = f_out.read(), f_err.read()
    if int(answer) != 0:
        raise _failed(path, int(answer), stderr)
    _check_runs_ahead(path, stderr)
    return stdout


def without_timings(text: str) -> list[str]:
    """The lines that must repeat exactly on this machine: all but the ⏱ ones."""
    return [line for line in text.splitlines() if not line.lstrip().startswith(TIMER)]


def portable(text: str) -> list[str]:
    """The lines that must print alike on any CPU: all but the ⏱ and ⚙ ones."""
    return [line for line in without_timings(text) if KERNELS not in line]


def normalise(text: str) -> str:
    """The portable lines (⏱ and ⚙ ones dropped) as printed,
    runs of spaces folded to one and table rules to one dash."""
    lines = []
    for line in portable(text):
        # a table's rule: its widths follow the (⚙) cells, not what it says
        if set(line) <= set("- "):
            line = re.sub(r"-+", "-", line)
        lines.append(re.sub(r"[ \t]+", " ", line).rstrip())
    return "\n".join(lines) + "\n"


def prints_number(number: str, text: str) -> bool:
    """Whether `number` ("37.52", "63,082,496") appears in text as a whole number: "37.5" is not
    found in "37.52", nor "624" in "1,624" or "6.24"."""
    return re.search(rf"(?<![\w.,]){re.escape(number)}(?![\w]|[.,]\d)", text) is not None


def section(text: str, part: int) -> list[str]:
    """The lines of one part's output, from its "Part N ·" header to the next part's."""
    lines, inside = [], False
    for line in text.splitlines():
        # a header, not prose that starts with "Part 5's model"
        if re.match(r"Part \d+ · ", line):
            inside = line.startswith(f"Part {part} ·")
        if inside:
            lines.append(line)
    return lines


def golden_path(path: str) -> str:
    return os.path.join(GOLDEN, f"{script_id(path)}.txt")


def chosen_scripts(ids: list[str]) -> list[str]:
    """The scripts named by id ("04"; all when none); exits naming the scripts if an id is
    unknown."""
    unknown = sorted(set(ids) - {script_id(path) for path in SCRIPTS})
    if unknown:
        sys.exit(f"no script numbered {', '.join(unknown)}; the scripts are "
                 f"{' '.join(script_id(path) for path in SCRIPTS)}")
    return [path for path in SCRIPTS if not ids or script_id(path) in ids]


def update(ids: list[str]):
    os.makedirs(GOLDEN, exist_ok=True)
    for path in chosen_scripts(ids):
        with open(golden_path(path), "w") as f:
            f.write(normalise(run_quick(path)))
        print(f"wrote {os.path.relpath(golden_path(path), ROOT)}")


def committed_output_path(path: str) -> str:
    return os.path.join(ROOT, "figures", f"{script_id(path)}_output.txt")


def run_full(path: str) -> str:
    """The script's stdout from a full run with figures, as `make all` runs it, its figures written
    to a scratch folder and named in the output as `make all` names them (figures/NAME.png)."""
    with tempfile.TemporaryDirectory() as scratch:
        result = subprocess.run([sys.executable, path, "--figures", scratch], capture_output=True,
                                text=True, cwd="/", timeout=FULL_TIMEOUT)
    if result.returncode != 0:
        raise _failed(path, result.returncode, result.stderr)
    _check_runs_ahead(path, result.stderr)
    return result.stdout.replace(f"[figure] {scratch}/", "[figure] figures/")


# A claim decided over seeds, as common.count_line prints it: its text, its count, its outcome
COUNT_LINE = re.compile(r"^(?P<claim>.*): (?P<k>\d+) of (?P<n>\d+) seeds?; "
                        r"(?P<outcome>holds|the opposite holds|no clear difference at \d+ seeds) "
                        r"\(p = ")


def verdicts(text: str) -> dict:
    """{claim: outcome} of every count line in text."""
    return {match["claim"]: match["outcome"] for match in
            (COUNT_LINE.match(line.replace(KERNELS, " ").strip()) for line in text.splitlines())
            if match}


def _comparable(text: str) -> list[tuple[str, bool]]:
    """Every line but the ⏱ ones as (its text without ⚙ marks, whether it had one), runs of spaces
    folded to one and table rules to one dash. A count line (⚙: its count and effect are digits of
    trained runs) is compared by its claim and outcome, which must not move with the kernels."""
    lines = []
    for line in without_timings(text):
        marked = KERNELS in line
        line = re.sub(r"[ \t]+", " ", line.replace(KERNELS, " ")).strip()
        count = COUNT_LINE.match(line)
        if count:
            line, marked = f"{count['claim']}: {count['outcome']}", False
        if set(line) <= set("- "):
            line = re.sub(r"-+", "-", line)
        lines.append((line, marked))
    return lines


def differing_lines(expected: str, printed: str) -> list[str]:
    """The lines where two outputs break the promise of their unmarked lines and their verdicts, as
    "-committed" and "+this run"; [] when they keep it. Lines that differ pass only if every one of
    them carries ⚙ on both sides; a count line counts as unmarked, by its claim and outcome. A
    committed unmarked line that a run prints with ⚙ but the same text passes."""
    import difflib
    old, new = _comparable(expected), _comparable(printed)
    matcher = difflib.SequenceMatcher(None, [text for text, _ in old], [text for text, _ in new],
                                      autojunk=False)
    lines = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        removed, added = old[i1:i2], new[j1:j2]
        if tag == "equal" or all(marked for _, marked in removed + added):
            continue
        lines += [f"-{'⚙ ' if marked else ''}{text}" for text, marked in removed]
        lines += [f"+{'⚙ ' if marked else ''}{text}" for text, marked in added]
    return lines


def _report(name: str, expected: str, printed: str) -> bool:
    """Print how a run compares with its committed output; True if it differs."""
    diff = differing_lines(expected, printed)
    missing = sum(line.startswith("-") and not line.startswith("-⚙") for line in diff)
    extra = sum(line.startswith("+") and not line.startswith("+⚙") for line in diff)
    checked = len([line for line, marked in _comparable(expected) if not marked])
    print(f"{name}: {checked} unmarked lines and verdicts; {missing} not printed, {extra} printed "
          "that are not committed")
    if diff:
        print("\n".join(diff))
    return bool(diff)


def check_full(ids: list[str]) -> int:
    """Run the scripts named by id ("04"; all when none) in full and compare every unmarked line
    and every verdict with the committed figures/NN_output.txt. Returns the number of scripts that
    differ."""
    chosen = chosen_scripts(ids)
    failed = 0
    for path in chosen:
        with open(committed_output_path(path), encoding="utf-8") as f:
            expected = f.read()
        failed += _report(os.path.basename(path), expected, run_full(path))
    print(f"{failed} of {len(chosen)} scripts differ from figures/NN_output.txt"
          + ("; if the change is intended, `make all` rewrites them" if failed else ""))
    return failed


# make seeds: the parts that decide claims over seeds, run at SEEDS_COUNTED seeds
SEEDS_COUNTED = 10
TRAINED_PARTS = {"04": (4,), "05": (5, 6), "07": (2, 3), "08": (3, 4, 5)}
SEEDS_OUTPUT = os.path.join(ROOT, "figures", "seeds_output.txt")


def seeds_heading(path: str) -> str:
    parts = " and ".join(map(str, TRAINED_PARTS[script_id(path)]))
    return (f"== {os.path.basename(path)} --seeds {SEEDS_COUNTED}, "
            f"part{'s' * (' and ' in parts)} {parts}")


def run_over_seeds(path: str) -> str:
    """The parts of a script that decide claims over seeds, as a full run with --seeds
    SEEDS_COUNTED prints them (the other parts' lines and the ⏱ ones left out), under a heading."""
    result = subprocess.run([sys.executable, path, "--seeds", str(SEEDS_COUNTED), "--no-figures"],
                            capture_output=True, text=True, cwd="/", timeout=FULL_TIMEOUT)
    if result.returncode != 0:
        raise _failed(path, result.returncode, result.stderr)
    _check_runs_ahead(path, result.stderr)
    kept = [line for part in TRAINED_PARTS[script_id(path)]
            for line in section(result.stdout, part)]
    return "\n".join([seeds_heading(path), *without_timings("\n".join(kept))]) + "\n"


def check_seeds() -> int:
    """make seeds: run every script's claims over SEEDS_COUNTED seeds, print each count line,
    compare with the committed figures/seeds_output.txt as check_full compares (every verdict,
    every unmarked line), then write the new runs there (`git diff figures` shows what moved).
    Returns the number of scripts that differ."""
    committed = ""   # none yet: every line differs, and the runs are written for committing
    if os.path.exists(SEEDS_OUTPUT):
        with open(SEEDS_OUTPUT, encoding="utf-8") as f:
            committed = f.read()
    chunks, failed = [], 0
    for path in (path for path in SCRIPTS if script_id(path) in TRAINED_PARTS):
        printed = run_over_seeds(path)
        chunks.append(printed)
        print(printed.splitlines()[0])
        print("\n".join(line for line in printed.splitlines()
                        if COUNT_LINE.match(line.replace(KERNELS, " ").strip())))
        failed += _report(os.path.basename(path), seeds_section(committed, path), printed)
    with open(SEEDS_OUTPUT, "w", encoding="utf-8") as f:
        f.write("\n".join(chunks))
    print(f"{failed} of {len(chunks)} scripts' {SEEDS_COUNTED}-seed verdicts differ from "
          "figures/seeds_output.txt (now rewritten)" + ("; if the change is intended, commit it"
                                                        if failed else ""))
    return failed


def seeds_section(text: str, path: str) -> str:
    """One script's runs in figures/seeds_output.txt, from its heading to the next."""
    lines, inside = [], False
    for line in text.splitlines():
        if line.startswith("== "):
            inside = line.startswith(f"== {os.path.basename(path)} ")
        if inside:
            lines.append(line)
    return "\n".join(lines).rstrip("\n") + "\n"   # the blank line between two scripts is neither's


USAGE = ("usage: python tests/outputs.py --update [NN ...] (rewrites tests/golden/, quick runs)\n"
         "       python tests/outputs.py --full [NN ...]  (full runs vs figures/NN_output.txt)\n"
         "       python tests/outputs.py --seeds          (the claims over 10 seeds vs "
         "figures/seeds_output.txt)")

if __name__ == "__main__":
    if sys.argv[1:2] == ["--update"]:
        update(sys.argv[2:])
    elif sys.argv[1:2] == ["--full"]:
        sys.exit(1 if check_full(sys.argv[2:]) else 0)
    elif sys.argv[1:] == ["--seeds"]:
        sys.exit(1 if check_seeds() else 0)
    else:
        sys.exit(USAGE)
