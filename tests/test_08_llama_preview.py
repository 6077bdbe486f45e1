"""Script 08's untrained claims (parts 1-2, the first halves of parts 3-4), each as the sentence it
prints: RMSNorm's one reduction fewer, LLaMA's hidden sizes, SwiGLU's FLOPs at equal parameters,
RoPE's score a function of m − n, the layout permutation, and the KV cache's bytes = the formula."""
import numpy as np
import pytest

from lecture06 import llama
from lecture05 import tensor
from conftest import load_script


@pytest.fixture(scope="module")
def m():
    return load_script("08_llama_preview")


@pytest.mark.parametrize("reduced, full, kind", [((2, 5, 1), (2, 5, 8), "row"),
                                                 ((8,), (2, 5, 8), "rows"),
                                                 ((1, 1, 8), (2, 5, 8), "rows"),
                                                 ((2, 5, 8), (2, 5, 8), None),
                                                 ((2, 5, 1), (2, 5, 1), None)])
def test_a_result_smaller_than_its_input_is_a_row_or_a_sum_over_rows(m, reduced, full, kind):
    assert m.reduction_kind(reduced, full) == kind


def test_rmsnorm_reduces_a_row_once_each_way_where_layernorm_reduces_it_twice(m):  # S14-a
    layer, rms = (m.tensor_norm_reductions(norm, n_rows=6, dim=16) for norm in m.NORMS)
    assert (layer["forward_row"], layer["backward_row"], layer["backward_rows"]) == (2, 2, 2)
    assert (rms["forward_row"], rms["backward_row"], rms["backward_rows"]) == (1, 1, 1)


@pytest.mark.parametrize("norm", ["LayerNorm", "RMSNorm"])
def test_the_backward_reductions_read_from_the_graph_are_the_sums_backward_makes(m, monkeypatch,
                                                                                norm):
    summed = {"row": 0, "rows": 0}
    unbroadcast = tensor._unbroadcast

    def counting(grad, shape):
        kind = m.reduction_kind(shape, grad.shape)
        if kind is not None:
            summed[kind] += 1
        return unbroadcast(grad, shape)

    monkeypatch.setattr(tensor, "_unbroadcast", counting)
    counted = m.tensor_norm_reductions(norm, n_rows=6, dim=16)
    assert summed == {"row": counted["backward_row"], "rows": counted["backward_rows"]}


def test_torch_s_layernorm_is_one_fused_kernel_each_way_its_rmsnorm_reduces_a_row_once(m):
    layer, rms = (m.torch_norm_reductions(norm, n_rows=6, dim=16) for norm in m.NORMS)
    assert layer["forward"] == dict(kernels=["native_layer_norm"], row=2, rows=0)
    assert layer["backward"] == dict(kernels=["native_layer_norm_backward"], row=0, rows=2)
    assert (rms["forward"]["row"], rms["forward"]["rows"]) == (1, 0)
    assert rms["forward"]["kernels"].count("mean") == 1
    assert (rms["backward"]["row"], rms["backward"]["rows"]) == (1, 1)


def test_llama_s_rule_gives_the_published_hidden_sizes_and_the_city_model_170(m):
    rows = {r["name"]: r for r in m.swiglu_sizes(m.FFN_CONFIGS)}
    published = {name: r["published"] for name, r in rows.items() if r["published"]}
    assert {name: rows[name]["hidden"] for name in published} == published == {
        "LLaMA-7B": 11008, "LLaMA-2-70B": 28672, "LLaMA-3-8B": 14336}
    city = rows["city model"]
    assert city["hidden"] == 170
    assert (city["swiglu"], city["gelu"]) == (3 * 64 * 170, 8 * 64 * 64)


def test_swiglu_s_flops_per_token_are_twice_its_parameters_and_tensor_py_counts_the_formula(m):
    for r in m.swiglu_sizes(m.FFN_CONFIGS):
        flops = r["flops"]
        assert flops["gate"] + flops["up"] + flops["down"] == 2 * r["swiglu"]
        assert flops["gelu_in"] + flops["gelu_out"] == 2 * r["gelu"] == 16 * r["n_embd"] ** 2
    counted = m.counted_ffn_flops(64, 170, seq_len=3)
    assert counted == {"GELU": 16 * 64 ** 2, "SwiGLU": 6 * 64 * 170}


def test_rope_s_score_depends_on_m_minus_n_only_to_rounding_an_added_table_s_does_not(m):
    r = m.rope_relative(head_dim=16, n_positions=24, seed=3)
    assert r["largest"]["rope"] <= 1e-12
    assert r["largest"]["additive"] > 1.0
    assert len(r["spreads"]["rope"]) == 2 * 24 - 3      # offsets -(S-2) .. S-2


def test_the_table_rope_does_not_need_is_3_mib_at_gpt_2_small_in_float32(m):       # S14-b
    tables = {t["name"]: t for t in m.position_table_bytes(m.POSITION_TABLES)}
    assert (tables["GPT-2 small"]["float32"], tables["GPT-2 small"]["float16"]) == (3 * 2 ** 20,
                                                                                  3 * 2 ** 19)
    assert tables["LLaMA-3-8B"]["float16"] == 8192 * 4096 * 2


def test_turned_vectors_are_llama_s_rope_at_each_position(m):
    vector = np.arange(8.0)
    rows = m.turned(vector, 5)
    cos, sin, quarter_turn = llama.rope_tables(np.arange(5), 8)
    np.testing.assert_allclose(rows, vector * cos + (vector @ quarter_turn) * sin, atol=1e-15)


def test_the_layout_permutation_makes_the_scores_agree_and_without_it_only_m_equals_n_agrees(m):
    p = m.layout_permutation(n_embd=32, n_head=2, seq_len=8, seed=1)
    assert p["converted"] <= 1e-12
    assert p["unconverted"] > 0.1 * p["score_scale"]
    assert p["unconverted_diagonal"] <= 1e-12


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_the_kv_cache_s_bytes_measured_equal_2_l_b_t_n_kv_dh_itemsize_exactly(m, n_kv_heads):
    r = m.measured_kv_cache(n_kv_heads, n_layers=2, batch_size=2, prompt_len=3, new_tokens=2)
    assert r["length"] == 5
    assert r["measured"] == r["formula"] == 2 * 2 * 2 * 5 * n_kv_heads * 16 * 8


def test_the_kv_cache_with_8_heads_shrinks_8_fold_at_one_kv_head(m):
    full, shared = (m.measured_kv_cache(k, n_layers=1, batch_size=1, prompt_len=2, new_tokens=1,
                                        n_embd=32, n_head=8)["measured"] for k in (8, 1))
    assert full == 8 * shared == 2 * 1 * 1 * 3 * 8 * 4 * 8


def test_gqa_shrinks_llama_s_float16_caches_by_heads_over_kv_heads(m):          # S14-c
    rows = {r["name"]: r for r in m.llama_kv_caches(m.KV_CONFIGS, batch_size=1, length=4096)}
    assert {name: (r["gqa"], r["mha"]) for name, r in rows.items()} == {
        "LLaMA-2-7B": (2 * 2 ** 30, 2 * 2 ** 30), "LLaMA-2-70B": (1.25 * 2 ** 30, 10 * 2 ** 30),
        "LLaMA-3-8B": (2 ** 29, 2 * 2 ** 30)}
    assert all(r["mha"] * r["n_kv_heads"] == r["gqa"] * r["n_head"] for r in rows.values())


def test_an_unknown_norm_is_refused_naming_the_choices(m):
    with pytest.raises(ValueError, match="norm must be one of 'LayerNorm', 'RMSNorm'"):
        m.tensor_norm_reductions("BatchNorm", n_rows=2, dim=4)
