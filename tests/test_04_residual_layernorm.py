"""Tests for script 04: CLAIMS.md rows S5.2-*, S5.3-*, S5.4-* (notes §5.2-§5.4), asserted as CLAIMS §E says.

Part 4 trains in its quick form here (4 runs of 100 steps instead of 6 of 400; see QUICK in the script): long
enough for Post-LN without warmup to fail and for the others to train, too short for the instability of
warmed-up Post-LN, which the full run shows (README).
"""
import argparse

import numpy as np
import pytest
import torch

from conftest import load_script

m = load_script("04_residual_layernorm")


# ---- Part 1 · S5.2 ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gain():
    return m.gradient_gain(depths=(1, 8, 32, 64))


def test_no_residual_gradient_vanishes_as_the_default_init_predicts(gain):
    no_res = gain["gain"]["no residual"]
    assert 1e-27 < no_res[-1] < 1e-23                                       # S5.2-a: ~1e-25 at L = 64
    assert no_res[-1] == pytest.approx(gain["theory_no_residual"][-1], rel=0.5)  # (1/6)^32 = 1.26e-25
    assert np.all(np.diff(no_res) < 0)


def test_residual_alone_explodes_and_residual_plus_layernorm_does_neither(gain):
    assert 1e4 < gain["std"]["residual"][-1] < 1e7                          # S5.2-b: 6.5e+05 in the notes
    assert gain["gain"]["residual"][-1] > 1e3
    for key in ("gain", "std"):                                             # S5.2-c
        assert np.all((1e-2 < gain[key]["residual + LN"]) & (gain[key]["residual + LN"] < 1e2))


def test_part1_uses_pytorchs_default_linear_init():
    block = m.Block(256, "no residual")
    reference = torch.nn.Linear(256, 256)
    assert block.linear.reset_parameters.__func__ is reference.reset_parameters.__func__
    assert float(block.linear.weight.detach().abs().max()) <= 1 / 16


# ---- Part 2 · S5.3 ----------------------------------------------------------------------------------------
def test_layernorm_ignores_the_companions_batchnorm_does_not():
    r = m.batch_companions()
    assert all(row["ln_change"] == 0.0 for row in r["rows"])                # S5.3-a: exactly 0
    assert all(row["bn_change"] > 0.1 for row in r["rows"])                 # S5.3-b: O(1), 1.6-1.8 in the notes
    assert 1e-7 <= r["scaled"][1e-5] <= 1e-4                                # S5.3-c: from eps (8.1e-06 in the notes)
    assert r["scaled"][0.0] <= 1e-12


def test_part2_table_counts_trials(capsys):
    """Each row is one trial (a fresh set of companions), so the first column is a trial index."""
    m.show_batch_companions(argparse.Namespace(seed=0, quick=True, figures=None))
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if "LayerNorm" in line and "BatchNorm" in line)
    assert header.split()[0] == "trial" and "companions" not in header
    first_column = [line.split()[0] for line in lines[lines.index(header) + 2:] if line.strip()[:1].isdigit()]
    assert first_column == [str(i) for i in range(1, len(m.batch_companions()["rows"]) + 1)]


def test_the_norms_agree_with_torch():
    x = np.random.default_rng(0).standard_normal((3, 5, 8))
    expected_bn = torch.nn.functional.batch_norm(torch.tensor(x).permute(0, 2, 1), None, None, training=True,
                                                 eps=1e-5).permute(0, 2, 1).numpy()  # (B, D, S) -> (B, S, D)
    np.testing.assert_allclose(m.batch_norm(x), expected_bn, atol=1e-12)
    expected_ln = torch.nn.functional.layer_norm(torch.tensor(x), (8,), eps=1e-5).numpy()
    np.testing.assert_allclose(m.layer_norm(x), expected_ln, atol=1e-12)


# ---- Part 3 · S5.4-a, S5.4-b, S5.4-h, and the README's FFN branch scales at init -----------------
def test_pre_ln_last_layer_gradient_shrinks_with_depth_post_ln_does_not():
    r = m.layer_grad_norms()  # L = 2..32, 3 seeds, as the script runs it
    post_last = {L: r["norms"]["Post-LN", L][-1] for L in r["depths"]}
    pre_last = {L: r["norms"]["Pre-LN", L][-1] for L in r["depths"]}
    assert pre_last[32] / pre_last[2] < 0.8                                 # S5.4-b
    assert post_last[32] > 1.5 * pre_last[32]
    assert post_last[32] >= post_last[2]                                    # S5.4-a (weak form, CLAIMS §D.7)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ffn_branch_starts_largest_with_xavier_and_smallest_with_gpt2(seed):
    """README (§5.4 needs the original init): layer 1's FFN branch std over its input's at init is about 0.48
    with Xavier, 0.20 with PyTorch's default and 0.026 with GPT-2's N(0, 0.02²)."""
    ratio = {init: m.branch_scale(init, seed)["ratio"] for init in ("xavier", "default", "gpt2")}
    assert ratio["xavier"] > ratio["default"] > ratio["gpt2"]
    assert 0.4 < ratio["xavier"] < 0.6 and 0.15 < ratio["default"] < 0.25 and 0.02 < ratio["gpt2"] < 0.035
    assert ratio["default"] > 5 * ratio["gpt2"]


def test_part3_prints_one_branch_scale_line_per_init(capsys, monkeypatch):
    original = m.layer_grad_norms                              # the gradient table at a small size, for speed
    monkeypatch.setattr(m, "layer_grad_norms", lambda **kwargs: original(depths=(2, 4), seeds=(0,)))
    m.show_layer_grad_norms(argparse.Namespace(seed=1, quick=True, figures=None))
    lines = capsys.readouterr().out.splitlines()
    scale = [line.split() for line in lines if line.startswith("  ") and "):" in line]
    assert [words[0] for words in scale] == ["xavier", "default", "gpt2"]
    for words in scale:                                       # computed at the script's seed, 3 digits
        assert float(words[-1]) == pytest.approx(m.branch_scale(words[0], 1)["ratio"], rel=3e-3)


def test_pre_ln_has_a_final_layernorm():                                    # S5.4-h
    model = m.city_train.build_model(n_layers=2, pre_ln=True)
    assert model.ln is not None and m.city_train.build_model(n_layers=2, pre_ln=False).ln is None


# ---- Part 4 · S5.4-d..g, reduced ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stability():
    r = m.training_stability(**m.QUICK)
    return r, {(run["placement"], run["lr"], run["warmup"]): run["result"].final_excess for run in r["runs"]}


def test_post_ln_without_warmup_fails_at_a_large_lr(stability):
    r, final = stability
    failed = final["Post-LN", m.LARGE_LR, 0]
    assert failed > 0.9 * r["baselines"]["unigram"]                        # no better than ignoring the context
    assert failed > 3 * final["Pre-LN", m.LARGE_LR, 0]                     # S5.4-e (reduced: > 10× at 400 steps)


def test_the_others_train(stability):
    r, final = stability
    bigram = r["baselines"]["bigram"]
    assert final["Post-LN", m.SMALL_LR, 0] < bigram                      # S5.4-d: small lr, Post-LN is fine
    assert final["Pre-LN", m.LARGE_LR, 0] < bigram                        # S5.4-g: Pre-LN needs no warmup
    assert final["Post-LN", m.LARGE_LR, 50] < bigram < final["Post-LN", m.LARGE_LR, 0]  # S5.4-f: warmup rescues it


def test_part4_curves_are_consistent(stability):
    r, _ = stability
    for run in r["runs"]:
        res = run["result"]
        assert [step for step, _, _ in res.curve] == [0, 50, 100] and len(res.train_excess) == r["steps"]
        assert res.best_excess == min(test for _, _, test in res.curve)
