"""What the docs and the committed outputs say of the claims decided over seeds agrees with what a
command prints:
- every claim a script decides at its default seeds is decided at 10 seeds in
  figures/seeds_output.txt (make seeds), and no verdict of a committed output contradicts it: a
  claim that holds (or whose opposite holds) at 5 or 8 seeds must do so at 10; "no clear
  difference" at fewer seeds is what less evidence allows, whatever 10 say;
- every "k of n" count and every measured number that DIFFERENCES.md and the README's
  "Differences from the notes" quote stands in a committed output (figures/NN_output.txt) or in
  figures/seeds_output.txt. Numbers that are not measurements (the notes' and the papers' own, a
  setup's sizes) are listed below, each with why it is not looked for.
"""
import glob
import os
import re

import pytest

from outputs import ROOT, SEEDS_OUTPUT, prints_number, verdicts

TRAINING_SCRIPTS = ("04", "05", "07", "08")


def committed(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def script_verdicts(script: str) -> dict:
    return verdicts(committed(f"figures/{script}_output.txt"))


def seeds_verdicts(script: str) -> dict:
    """The verdicts of one script's section of figures/seeds_output.txt."""
    text = committed(SEEDS_OUTPUT).split("\n== ")
    [section] = [chunk for chunk in text if chunk.lstrip("= ").startswith(script)]
    return verdicts(section)


@pytest.mark.parametrize("script", TRAINING_SCRIPTS)
def test_every_claim_a_script_decides_is_decided_over_10_seeds_by_make_seeds(script):
    assert script_verdicts(script) and set(script_verdicts(script)) == set(seeds_verdicts(script))


@pytest.mark.parametrize("script", TRAINING_SCRIPTS)
def test_no_verdict_in_a_committed_output_contradicts_the_10_seed_file(script):
    ten = seeds_verdicts(script)
    decided = {claim: outcome for claim, outcome in script_verdicts(script).items()
               if outcome in ("holds", "the opposite holds")}
    contradicted = {claim: (outcome, ten[claim]) for claim, outcome in decided.items()
                    if ten[claim] != outcome}
    assert not contradicted, contradicted


def quoted_text() -> str:
    """DIFFERENCES.md and the README's section "Differences from the notes"."""
    readme = committed("README.md")
    section = readme.split("## Differences from the notes", 1)[1].split("\n## ", 1)[0]
    return committed("DIFFERENCES.md") + "\n" + section


def printed_text() -> str:
    paths = sorted(glob.glob(os.path.join(ROOT, "figures", "*_output.txt")))
    return "\n".join(committed(path) for path in paths)


def test_every_count_the_docs_quote_is_printed():
    printed = printed_text()
    counts = re.findall(r"\b\d+ of \d+ seeds?\b", quoted_text())
    assert counts
    assert [count for count in counts if count not in printed] == []


# Numbers the docs may quote that are not measurements of ours, each with its reason
NOT_MEASURED = {
    "0.084": "the notes' contrast-pair difference",
    "1.1e-16": "the notes' rounding-level values", "3.6e-15": "", "1.8e-15": "", "2.2e-16": "",
    "0.8994": "the notes' kept fraction of dropout",
    "6.5e+05": "the notes' residual-only std", "1.6": "the notes' BatchNorm change", "1.8": "",
    "8.1e-06": "the notes' LayerNorm change",
    "65M": "the paper's shared counts", "213M": "",
    "37.5": "the notes' saving from one shared table (ours prints 37.52)",
    "39.8": "the notes' four shares", "27.1": "", "14.9": "", "13.3": "",
    "15": "the notes' time shares (15 / 40 / 70%)", "40": "", "70": "",
    "700": "the notes' GPU measurements (50 and 700-860 GFLOP/s)", "860": "", "50": "",
    "7": "Zhang & Sennrich's time saving (7-64%)", "64": "",
    "37,000": "the paper's vocabulary, a setup",
}


UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e[-+]?\d+)?"
RANGE = re.compile(rf"(?<![\w.])(?P<first>[-+]?{UNSIGNED})(?:-(?P<last>{UNSIGNED}))?")


def quoted_numbers(text: str) -> list[str]:
    """The numbers text quotes, a range's two ends each on its own ("518-625": 518 and 625), but
    for references: dates and years, § sections, "part N", script numbers ("04"), code and
    commands (in backticks), link targets, and names with digits (LLaMA-2-70B, float32)."""
    for reference in (r"`[^`]*`", r"\]\([^)]*\)", r"\b\d{4}-\d\d-\d\d\b", r"\b(19|20)\d\d\b",
                      r"§\s?[\d.]+(-[\d.]+)?", r"\b(parts?|S)\s?\d+(\.\d+)?(-[a-z])?"
                      r"(\s?(-|and|,)\s?\d+)*", r"(?<![\w.+-])0\d\b",
                      r"\b[A-Za-z]+(-\w+)*-\w*\d\w*", r"\b[A-Za-z]+\d\w*"):
        text = re.sub(reference, " ", text)
    return [number for match in RANGE.finditer(text)
            for number in (match["first"], match["last"]) if number]


def test_every_number_the_docs_quote_is_printed():
    printed = printed_text()
    missing = sorted({number for number in quoted_numbers(quoted_text())
                      if number.lstrip("+") not in NOT_MEASURED
                      and not prints_number(number.lstrip("+"), printed)})
    assert missing == [], ("numbers DIFFERENCES.md or the README's differences quote that no "
                           "committed output prints: print them, or say here why they are not "
                           f"measurements: {missing}")


def test_the_number_finder_skips_references_and_keeps_measurements():
    text = ("§5.4 (04 part 4, parts 3-5) on 2026-12-02 by Su et al. 2021 in `--seeds 20` at "
            "LLaMA-2-70B in float32: 274 vs 5.3×, 518-625 and -0.4")
    assert quoted_numbers(text) == ["274", "5.3", "518", "625", "-0.4"]
