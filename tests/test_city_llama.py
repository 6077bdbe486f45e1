"""Tests for code/lecture06/city_llama.py (LLaMA-style models trained on the city language) and the
claims script 08 counts over seeds. The plumbing on toy sizes (a few seconds); the claims over 10
seeds of the full runs are marked `seeds` (make seeds)."""
import math

import numpy as np
import pytest
import torch

from lecture06 import city_llama

TOY = dict(n_layers=1, n_embd=16, n_head=4)
TOY_TRAINING = dict(steps=3, lr=3e-3, eval_every=None, seed=1)


@pytest.mark.parametrize("n_embd", [16, 64, 4096])
def test_swiglus_three_matrices_hold_gelus_8d_squared_as_nearly_as_whole_numbers_allow(n_embd):
    middle = city_llama.swiglu_middle_dim(n_embd)
    assert abs(3 * n_embd * middle - 8 * n_embd ** 2) <= 3 * n_embd / 2


def test_each_rung_changes_one_thing_and_gqa_keeps_ropes_parameter_count():
    rungs = dict(city_llama.ladder(n_layers=1, n_embd=64, n_head=4, n_kv_heads=2))
    assert list(rungs) == list(city_llama.RUNGS)
    changed = [sorted(k for k in set(b) | set(a) if a.get(k) != b.get(k))
               for a, b in zip(list(rungs.values()), list(rungs.values())[1:])]
    assert changed == [["norm"], ["ffn", "middle_dim"], ["positions"], ["middle_dim", "n_kv_heads"]]
    rope, gqa = (city_llama.parameter_count(rungs[name]) for name in ("+RoPE", "+GQA"))
    assert abs(gqa - rope) <= 3 * 64 / 2   # within half a SwiGLU hidden unit
    built = city_llama.build_model(**rungs["+GQA"])
    assert gqa == sum(p.numel() for p in built.parameters())


def test_pooling_to_as_many_kv_heads_as_query_heads_changes_no_logit():
    settings = dict(TOY, norm="rmsnorm", ffn="swiglu", positions="rope")
    model = city_llama.build_model(**settings, seed=2)
    same = city_llama.pooled_kv_heads(model, settings, n_kv_heads=4)
    x = torch.tensor(city_llama.long_windows(32, 2).x)
    assert torch.equal(model(x), same(x))


def test_one_kv_head_is_the_mean_of_the_four_heads_k_and_v():
    model = city_llama.build_model(**TOY, seed=2)
    pooled = city_llama.pooled_kv_heads(model, TOY, n_kv_heads=1)
    for name in ("k_projection", "v_projection"):
        before = getattr(model.layers[0].attention, name)
        after = getattr(pooled.layers[0].attention, name)
        # (16, 4·4) -> (16, 4 heads, 4) -> mean over the heads
        expected = before.weights.detach().reshape(16, 4, 4).mean(1)
        assert torch.allclose(after.weights.detach(), expected, rtol=0, atol=1e-7)
        assert torch.allclose(after.bias.detach(), before.bias.detach().reshape(4, 4).mean(0),
                              rtol=0, atol=1e-7)


def test_a_run_scores_longer_windows_or_gives_the_learned_tables_refusal():
    learned, rope = (city_llama.run(model=dict(TOY, positions=p), training=TOY_TRAINING,
                                    long_lengths=[64], long_count=4, convert_to=[2],
                                    uptrain_steps=1) for p in ("learned", "rope"))
    assert learned["long_excess"] == {} and "exceeds n_positions=32" in learned["refusal"]
    assert rope["refusal"] is None and list(rope["long_excess"]) == [64]
    assert all(math.isfinite(r["excess"]) and r["excess"] > 0 for r in (learned, rope))
    assert all(math.isfinite(v) for v in rope["long_excess"].values())
    assert list(rope["converted"]) == [2] and all(map(math.isfinite, rope["converted"][2]))


def test_long_windows_hold_their_exact_probabilities():
    from lecture06 import city_lab
    windows = city_llama.long_windows(64, 3)
    assert windows.x.shape == (3, 64)
    exact = city_lab.true_distributions(np.concatenate([windows.x, windows.y[:, -1:]], axis=1))
    assert np.array_equal(np.take_along_axis(exact, windows.y[..., None], -1)[..., 0],
                          windows.p_y)


def test_bad_kv_head_counts_are_refused_by_name():
    with pytest.raises(ValueError, match=r"n_head \(4\) must be a multiple of n_kv_heads \(3\)"):
        city_llama.build_model(**TOY, n_kv_heads=3)
