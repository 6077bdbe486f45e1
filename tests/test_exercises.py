"""§12's answer key, exercises 1-10, recomputed with the project's own code and asserted.

Each answer comes from the code a student would use (tensor.py, transformer.py, the formulas of
scripts 05 and 06), not from arithmetic written into the test; the expected values are the
answer key's."""
import math

import numpy as np
import pytest

from lecture06 import costs, optim, transformer
from conftest import load_script
from lecture05.tensor import Tensor


def test_ex1_score_std_is_sqrt_d_and_one_after_scaling():
    d, trials = 256, 2000
    r = load_script("01_attention").score_scaling(dims=(d,), trials=trials)
    row, n = r["rows"][0], trials * r["n_keys"]
    # 4 standard errors of a sample std (test_01_attention.test_exercise_1_std_at_d_256 derives it)
    tolerance = 4 * math.sqrt(2 / n + 2 / (d * trials)) / 2
    assert math.sqrt(row["raw"]["var"]) == pytest.approx(16, rel=tolerance)
    assert math.sqrt(row["scaled"]["var"]) == pytest.approx(1, rel=tolerance)


def test_ex2_causal_mask_visibility():
    S = 7
    visible = transformer.MultiHeadAttention.create_causal_mask(S).data[0, 0] == 0
    assert [int(row.sum()) for row in visible] == [i + 1 for i in range(S)]  # position i sees i + 1
    assert int((~visible).sum()) == S * (S - 1) // 2 == 21


def test_ex3_shapes_of_multi_head_attention():
    B, S, D, h = 4, 10, 64, 8
    mha = transformer.MultiHeadAttention(D, h, causal=True, p_dropout=0.0)
    q, kT, v = mha.project_to_query_key_value(Tensor(np.zeros((B, S, D))))
    merged = mha.self_attention(q, kT, v, mha.create_causal_mask(S))
    assert q.shape == (4, 8, 10, 8) and kT.shape == (4, 8, 8, 10)
    assert (q @ kT).shape == (4, 8, 10, 10) and (mha.last_attention @ v).shape == (4, 8, 10, 8)
    assert merged.shape == (4, 10, 64)


def test_ex4_pe_dot_product_depends_only_on_distance():
    d = 512
    pe = transformer.sinusoidal_positions(1200, d)
    omega = transformer.sinusoidal_frequencies(d)
    for k in (1, 7, 100):
        dots = np.einsum("td,td->t", pe[:-k], pe[k:])
        assert np.abs(dots - np.cos(omega * k).sum()).max() < 1e-9


def test_ex5_layer_parameters_d1024():
    layer = transformer.TransformerLayer(1024, 16, p_dropout=0.0)
    count = {name: sum(p.data.size for _, p in getattr(layer, name).named_parameters())
             for name in ("attention", "ff", "ln_1", "ln_2")}
    assert count["attention"] == 4_198_400
    assert count["ff"] == 8_393_728
    assert count["ln_1"] + count["ln_2"] == 4_096
    assert layer.num_parameters() == 12_596_224
    assert round(100 * count["ff"] / layer.num_parameters(), 1) == 66.6


def test_ex6_gpt2_small_at_n_4608():
    flops = costs.flop_formula(n_embd=768, seq_len=4608)
    per_token = {name: value / 4608 for name, value in flops.items()}
    attention = per_token["attention (QKᵀ, AV)"]
    rest = per_token["QKV projections"] + per_token["W_O"] + per_token["FFN"]
    assert attention == rest == 14_155_776
    assert round(attention / 1e6, 1) == 14.2


def test_ex7_learning_rate_at_2000_and_16000():
    peak = optim.noam_lr(4000)
    assert optim.noam_lr(2000) == pytest.approx(optim.noam_lr(16000), rel=1e-12)
    assert optim.noam_lr(2000) == pytest.approx(peak / 2, rel=1e-12)
    assert f"{optim.noam_lr(2000):.2e}" == "3.49e-04" and f"{peak:.2e}" == "6.99e-04"


def test_ex7_intermediate_values_as_script_05_prints_them_and_as_noam_lr_combines_them():
    """The key's 0.0442 × 2000 / 252,982 and 0.0442 × 0.00791: the factors script 05 prints for
    exercise 7, which must be the ones noam_lr multiplies on each side of the warmup."""
    parts = load_script("05_training_recipe").lr_schedule()["ex7_parts"]
    assert f"{parts['d_factor']:.4f}" == "0.0442" and f"{parts['warmup_factor']:,.0f}" == "252,982"
    assert f"{parts['rsqrt_16000']:.5f}" == "0.00791"
    assert optim.noam_lr(2000) == pytest.approx(
        parts["d_factor"] * 2000 / parts["warmup_factor"], rel=1e-15)
    assert optim.noam_lr(16000) == pytest.approx(
        parts["d_factor"] * parts["rsqrt_16000"], rel=1e-15)


def test_ex8_smoothed_targets_v10():
    recipe = load_script("05_training_recipe")
    slides = recipe.smoothed_targets(V=10, eps=0.1, correct=3, convention="slides")
    torch_style = recipe.smoothed_targets(V=10, eps=0.1, correct=3, convention="torch")
    assert (slides[3] == pytest.approx(0.9, abs=1e-12)
            and torch_style[3] == pytest.approx(0.91, abs=1e-12))
    others = np.arange(10) != 3
    assert (np.allclose(slides[others], 0.1 / 9, rtol=0, atol=1e-12)
            and round(slides[0], 4) == 0.0111)
    assert np.allclose(torch_style[others], 0.01, rtol=0, atol=1e-12)


def test_ex9_adam_first_step_is_lr_times_sign():
    lr = 1e-3
    for g in (1e-6, 1e-3, 1.0, 1e3):
        for sign in (1, -1):
            p = transformer.Parameter(np.zeros(1))
            p.grad = np.array([sign * g])
            optim.Adam([p], lr=lr, betas=(0.9, 0.98), eps=1e-9).step()
            assert -p.data[0] / lr == pytest.approx(sign, rel=1e-2)


def test_ex10_activation_estimate_d4096_h32_s4096_fp16():
    example = next(e for e in load_script("06_costs").activation_examples() if e["S"] == 4096)
    assert example["sd_part"] == 512 * 2 ** 20      # 16 copies of S × d: 512 MiB
    assert example["hss_part"] == 2 ** 30            # h × S × S: 1 GiB, the larger part
    assert example["crossover"] == 2048              # 16d/h: S = 4096 is past it
