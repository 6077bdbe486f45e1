"""llama.py (the notes' §14 preview) and its twin llama_ref.py: RMSNorm, SwiGLU, RoPE, grouped-query
attention and the DecoderLM with switches.

Every module: gradient check on every element, and equal to its float64 torch twin in outputs and
every parameter's gradient to <= 1e-12 (the twin written the reference way: HuggingFace's
rotate_half and repeat_kv, Meta's complex RoPE), the twin against torch's own RMSNorm and grouped
scaled_dot_product_attention. The claims: LLaMA's hidden sizes from the 2/3·4d rule; a RoPE score
depends on m - n only; the interleaved layout is the rotate-half one after permuting q, k columns
(and not before); query head j reads KV head j // (n_head / n_kv_heads); at GPT's switches the model
is transformer.DecoderLM, weights and bits; cached decoding equals a full recompute with 1, 2 and 4
KV heads (greedy, sampled, beam); the cache's bytes are 2·L·B·T·n_kv·Dh·itemsize. And the errors.
"""
import inspect

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lecture06 import llama, llama_ref, torch_ref, transformer
from gradcheck import check_gradients, leaf
from lecture05.tensor import Tensor
from test_parity import check_twins
from test_transformer import lecture_imports, violations
from twins import max_diff, randomize_layernorms

TOL = 1e-12
B, S, D, H, V = 2, 5, 16, 4, 11
LLAMA = dict(norm="rmsnorm", ffn="swiglu", positions="rope")


@pytest.fixture(autouse=True)
def _seed():
    transformer.set_seed(0)
    torch.manual_seed(0)


def randomize_norms(model, seed=1):
    """LayerNorms and RMSNorms moved off weights 1 (and biases 0), where a wrong gradient could
    hide."""
    rng = np.random.default_rng(seed)
    for _, m in model.named_modules():
        if isinstance(m, llama.RMSNorm):
            m.weights.data[...] = rng.uniform(0.5, 1.5, m.weights.shape)
    return randomize_layernorms(model, seed)


def model_kwargs(n_kv_heads=H, **switches):
    return dict(n_vocab=V, n_embd=D, n_head=H, n_positions=S, n_layers=2, p_dropout=0.1,
                n_kv_heads=n_kv_heads) | switches


# ---- gradient checks -----------------------------------------------------------------------------
def test_gradient_rmsnorm_on_a_permuted_input():
    norm, x = randomize_norms(llama.RMSNorm(4)), leaf((2, 3, 4), "permuted")
    check_gradients(lambda: norm(x), [x, norm.weights])


def test_gradient_swiglu():
    ff, x = llama.SwiGLU(4, 6, p_dropout=0.0), leaf((2, 3, 4))
    check_gradients(lambda: ff(x), ff.parameters() + [x])


@pytest.mark.parametrize("layout", llama.ROPE_LAYOUTS)
def test_gradient_rope(layout):
    x = leaf((2, 3, 2, 4))
    check_gradients(lambda: llama.apply_rope(x, np.arange(5, 8), layout), [x])


def test_gradient_grouped_query_attention_with_rope_and_a_pad_mask():
    attention = llama.GroupedQueryAttention(4, 2, 1, p_dropout=0.0, rope=True)
    x, pad = leaf((2, 3, 4)), np.array([[False] * 3, [False, False, True]])
    check_gradients(lambda: attention(x, pad_mask=pad), attention.parameters() + [x])


def test_gradient_of_the_loss_of_the_llama_decoder():
    model = randomize_norms(llama.DecoderLM(5, 4, 2, 3, n_layers=1, p_dropout=0.0, n_kv_heads=1,
                                            middle_dim=4, tie_weights=True, **LLAMA))
    ids, targets = np.array([[1, 2, 3], [4, 0, 1]]), np.array([[2, 3, 4], [0, 1, 2]])
    check_gradients(lambda: transformer.lm_loss(model(ids), targets), model.parameters())


def test_llama_py_writes_no_backward_and_no_array_arithmetic():
    assert violations(inspect.getsource(llama)) == []


def test_llama_py_builds_on_transformer_py_and_decoding_needs_no_change():
    """It imports the lesson and tensor.py; decoding.py comes with DecoderLM's inherited new_cache
    and generate."""
    assert lecture_imports(llama) == ({"tensor", "transformer"}, set())


# ---- the twins -----------------------------------------------------------------------------------
def test_rmsnorm_twin():
    check_twins(randomize_norms(llama.RMSNorm(D)), llama_ref.RMSNorm,
                [leaf((B, S, D), "permuted")], dict(dim=D))


def test_swiglu_twin():
    kwargs = dict(n_embd=D, hidden_dim=24, p_dropout=0.1)
    check_twins(llama.SwiGLU(**kwargs), llama_ref.SwiGLU, [leaf((B, S, D))], kwargs)


PAD = np.array([[False] * S, [False] * (S - 2) + [True] * 2])


@pytest.mark.parametrize("rope_layout", [None, *llama.ROPE_LAYOUTS])
@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_grouped_query_attention_twin_with_dropout_and_a_pad_mask(n_kv_heads, rope_layout):
    kwargs = dict(n_embd=D, n_head=H, n_kv_heads=n_kv_heads, p_dropout=0.1,
                  rope=rope_layout is not None, rope_layout=rope_layout or "rotate_half")
    ours = llama.GroupedQueryAttention(**kwargs)
    check_twins(ours, llama_ref.GroupedQueryAttention, [leaf((B, S, D), "permuted")], kwargs,
                pad_mask=PAD)
    assert (ours.dropout.last_mask == 0).any()                               # dropout really on


@pytest.mark.parametrize("switches", [
    dict(), dict(norm="rmsnorm"), dict(norm="rmsnorm", ffn="swiglu"), LLAMA,
    dict(LLAMA, n_kv_heads=2), dict(LLAMA, n_kv_heads=1, rope_layout="interleaved"),
    dict(positions="sinusoidal", tie_weights=True)], ids=str)
def test_decoder_lm_twin_at_every_rung_of_the_ladder(switches):
    kwargs = model_kwargs(**switches)
    model = randomize_norms(llama.DecoderLM(**kwargs)).train()
    ids = np.random.default_rng(3).integers(0, V, (B, S))
    diffs = check_twins(model, llama_ref.DecoderLM, [ids], kwargs)
    assert len(diffs) == 1 + len(model.parameters())


def test_the_rmsnorm_twin_is_torchs_rmsnorm():
    twin = torch_ref.copy_from(llama_ref.RMSNorm(D), randomize_norms(llama.RMSNorm(D)))
    official = nn.RMSNorm(D, eps=1e-5, dtype=torch.float64)
    with torch.no_grad():
        official.weight.copy_(twin.weights)
    x = torch.randn(B, S, D, dtype=torch.float64) * 3 + 1
    grad = torch.randn(B, S, D, dtype=torch.float64)
    ours, theirs = twin(x), official(x)
    assert max_diff(ours, theirs) <= TOL
    ours.backward(grad)
    twin_grad = twin.weights.grad.clone()
    theirs.backward(grad)
    assert max_diff(twin_grad, official.weight.grad) <= TOL


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_the_attention_twin_is_torchs_grouped_scaled_dot_product_attention(n_kv_heads):
    twin = llama_ref.GroupedQueryAttention(D, H, n_kv_heads, p_dropout=0.0).eval()
    x = torch.randn(B, S, D, dtype=torch.float64)
    q, k, v = (twin.heads(twin.q_projection(x), H), twin.heads(twin.k_projection(x), n_kv_heads),
               twin.heads(twin.v_projection(x), n_kv_heads))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    # (B, h, S, Dh) -> (B, S, h, Dh) -> (B, S, D)
    expected = twin.out_projection(out.transpose(1, 2).reshape(B, S, D))
    assert max_diff(twin(x), expected) <= TOL


# ---- RMSNorm and SwiGLU --------------------------------------------------------------------------
def test_rmsnorm_scales_each_row_to_root_mean_square_one_with_eps_inside_the_root():
    x = np.random.default_rng(0).standard_normal((3, D)) * 5 + 2
    y = llama.RMSNorm(D, eps=0.5)(Tensor(x)).data
    np.testing.assert_allclose(y, x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 0.5), rtol=1e-14)
    no_eps = llama.RMSNorm(D, eps=0.0)(Tensor(x)).data
    np.testing.assert_allclose(np.sqrt((no_eps ** 2).mean(-1)), 1.0, rtol=1e-14)
    assert np.abs(no_eps.mean(-1)).min() > 0.1                       # not centred: LayerNorm's is
    assert llama.RMSNorm(D).num_parameters() == D                    # no bias


@pytest.mark.parametrize("model,n_embd,multiple_of,multiplier,hidden", [
    ("LLaMA-7B", 4096, 256, None, 11_008), ("LLaMA-2-70B", 8192, 4096, 1.3, 28_672),
    ("LLaMA-3-8B", 4096, 1024, 1.3, 14_336)])
def test_swiglu_hidden_sizes_of_the_published_models(model, n_embd, multiple_of, multiplier,
                                                     hidden):
    assert llama.swiglu_hidden_dim(n_embd, multiple_of, multiplier) == hidden


def test_swiglu_holds_three_matrices_against_gelus_two_at_about_equal_parameters():
    swiglu, gelu = llama.swiglu_parameter_count(4096, 11_008)
    assert (swiglu, gelu) == (3 * 4096 * 11_008, 8 * 4096 ** 2) == (135_266_304, 134_217_728)
    ff = llama.SwiGLU(D)                                   # the rule without rounding: 8d/3 -> 42
    assert ff.gate_projection.out_size == 42
    assert ff.num_parameters() == llama.swiglu_parameter_count(D, 42)[0] <= 8 * D * D
    assert transformer.FeedForward(D, bias=False).num_parameters() == 8 * D * D


# ---- RoPE ----------------------------------------------------------------------------------------
def rope_score(q, k, m, n, layout="rotate_half"):
    """The score of a query at position m against a key at position n, both turned by RoPE."""
    turned_q = llama.apply_rope(Tensor(q[None, None, None]), [m], layout).data
    turned_k = llama.apply_rope(Tensor(k[None, None, None]), [n], layout).data
    return float((turned_q * turned_k).sum())


@pytest.mark.parametrize("layout", llama.ROPE_LAYOUTS)
def test_a_rope_score_depends_only_on_m_minus_n(layout):
    q, k = np.random.default_rng(1).standard_normal((2, 8))
    for offset in (-3, 0, 5):
        scores = [rope_score(q, k, n + offset, n, layout) for n in (0, 1, 7, 100, 2047)]
        assert np.ptp(scores) <= 1e-12 * max(map(abs, scores))
    assert abs(rope_score(q, k, 0, 0, layout) - q @ k) <= 1e-14       # position 0: no turn
    assert abs(rope_score(q, k, 3, 0, layout) - rope_score(q, k, 0, 3, layout)) > 1e-3


def test_rope_turns_pairs_without_changing_their_length():
    x = np.random.default_rng(2).standard_normal((1, 6, 2, 8))
    for layout in llama.ROPE_LAYOUTS:
        first, second = llama.rope_pairs(8, layout)
        turned = llama.apply_rope(Tensor(x), np.arange(6) * 7, layout).data
        np.testing.assert_allclose(turned[..., first] ** 2 + turned[..., second] ** 2,
                                   x[..., first] ** 2 + x[..., second] ** 2, rtol=1e-13)
    assert llama.rope_pairs(8, "rotate_half")[1].tolist() == [4, 5, 6, 7]
    assert llama.rope_pairs(8, "interleaved")[1].tolist() == [1, 3, 5, 7]


def convert_to_rotate_half(interleaved: llama.GroupedQueryAttention, permute: bool):
    """A rotate-half attention holding the interleaved one's weights, q and k columns permuted
    (as a checkpoint conversion must) or not."""
    converted = llama.GroupedQueryAttention(D, H, 2, p_dropout=0.0, rope=True)
    for name, p in converted.named_parameters():
        source = dict(interleaved.named_parameters())[name].data
        if permute and name.split(".")[0] in ("q_projection", "k_projection"):
            order = llama.interleaved_to_rotate_half(source.shape[-1] // (D // H), D // H)
            source = source[..., order]
        p.data[...] = source
    return converted


def test_interleaved_rope_is_rotate_half_after_permuting_the_q_and_k_columns():
    interleaved = llama.GroupedQueryAttention(D, H, 2, p_dropout=0.0, rope=True,
                                              rope_layout="interleaved")
    x = Tensor(np.random.default_rng(4).standard_normal((B, 12, D)))
    out = interleaved(x).data
    weights = interleaved.last_attention.data
    permuted = convert_to_rotate_half(interleaved, permute=True)
    assert max_diff(permuted(x).data, out) <= TOL
    assert max_diff(permuted.last_attention.data, weights) <= TOL
    unpermuted = convert_to_rotate_half(interleaved, permute=False)
    unpermuted(x)
    # from the second token on, the attention weights are wrong
    assert np.abs(unpermuted.last_attention.data - weights)[..., 1:, :].max(axis=(-1, -2)).min() \
        > 1e-3
    assert llama.interleaved_to_rotate_half(2, 4).tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


# ---- grouped-query attention ---------------------------------------------------------------------
@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_query_head_j_reads_kv_head_j_floor_divided_by_the_group_size(n_kv_heads):
    attention = llama.GroupedQueryAttention(D, H, n_kv_heads, p_dropout=0.0)
    x = np.random.default_rng(5).standard_normal((B, S, D))
    heads = attention.self_attention(*attention.project_to_query_key_value(Tensor(x)),
                                     transformer.MultiHeadAttention.create_causal_mask(S)).data
    head_dim, group = D // H, H // n_kv_heads
    q = x @ attention.q_projection.weights.data + attention.q_projection.bias.data
    k = x @ attention.k_projection.weights.data + attention.k_projection.bias.data
    v = x @ attention.v_projection.weights.data + attention.v_projection.bias.data
    future = np.triu(np.ones((S, S), bool), 1)
    for j in range(H):
        kv = slice(j // group * head_dim, (j // group + 1) * head_dim)
        scores = q[..., j * head_dim:(j + 1) * head_dim] @ np.swapaxes(k[..., kv], 1, 2)
        scores = np.where(future, -np.inf, scores / np.sqrt(head_dim))
        p = np.exp(scores - scores.max(-1, keepdims=True))
        expected = (p / p.sum(-1, keepdims=True)) @ v[..., kv]
        assert max_diff(heads[..., j * head_dim:(j + 1) * head_dim], expected) <= TOL


@pytest.mark.parametrize("pad", [False, True])
def test_at_gpts_switches_the_model_is_transformer_decoder_lm_bit_for_bit(pad):
    """Same seed, same names, same weights; with dropout on and a pad mask, the same logits and
    gradients to the last bit."""
    kwargs = dict(n_vocab=V, n_embd=D, n_head=H, n_positions=S, n_layers=2, p_dropout=0.1)
    gpt = transformer.DecoderLM(**kwargs)
    transformer.set_seed(0)
    ours = llama.DecoderLM(**kwargs, n_kv_heads=H)
    gpt_params, our_params = dict(gpt.named_parameters()), dict(ours.named_parameters())
    assert list(gpt_params) == list(our_params)
    assert all((gpt_params[n].data == p.data).all() for n, p in our_params.items())
    ids = np.random.default_rng(6).integers(0, V, (B, S))
    call = dict(pad_mask=PAD) if pad else {}
    transformer.set_seed(1)
    gpt_logits = gpt(ids, **call)
    transformer.set_seed(1)                  # the same dropout masks, drawn in the same order
    our_logits = ours(ids, **call)
    assert (gpt_logits.data == our_logits.data).all()
    grad = np.random.default_rng(7).standard_normal(gpt_logits.shape)
    gpt_logits.backward(grad)
    our_logits.backward(grad)
    assert all((gpt_params[n].grad == p.grad).all() for n, p in our_params.items())


def test_each_rung_of_the_ladder_changes_the_parameters_by_its_own_part():
    counts = [llama.DecoderLM(**model_kwargs(**switches)).num_parameters() for switches in (
        {}, dict(norm="rmsnorm"), dict(norm="rmsnorm", ffn="swiglu", middle_dim=24), dict(
            LLAMA, middle_dim=24), dict(LLAMA, middle_dim=24, n_kv_heads=1))]
    n_layers, head_dim = 2, D // H
    assert counts[0] - counts[1] == (2 * n_layers + 1) * D               # the norms' biases
    # GELU's 2·4D² + 4D + D against SwiGLU's 3·D·24
    assert counts[1] - counts[2] == n_layers * (8 * D * D + 5 * D - 3 * D * 24)
    assert counts[2] - counts[3] == S * D                                # the position table
    # K and V for 1 head instead of 4
    assert counts[3] - counts[4] == n_layers * 2 * (D + 1) * (H - 1) * head_dim


# ---- decoding: the KV cache holds only the KV heads ----------------------------------------------
PROMPT = np.random.default_rng(8).integers(0, V, (3, 4))


def llama_lm(n_kv_heads, **switches):
    return llama.DecoderLM(**model_kwargs(n_kv_heads, **(LLAMA | switches)))


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("decoding", ["greedy", "sampled", "beam"])
def test_cached_decoding_equals_a_full_recompute(n_kv_heads, decoding):
    model = llama_lm(n_kv_heads)
    options = dict(greedy={}, sampled=dict(sample=True, temperature=1.5),
                   beam=dict(num_beams=3, length_penalty=0.6))[decoding]
    draws = [dict(rng=np.random.default_rng(9)) if decoding == "sampled" else {} for _ in "ab"]
    # past n_positions = 5: RoPE has no table to run out of
    cached = model.generate(PROMPT, 8, **options, **draws[0])
    recomputed = model.generate(PROMPT, 8, use_cache=False, **options, **draws[1])
    np.testing.assert_array_equal(cached.tokens, recomputed.tokens)
    assert np.abs(cached.logits - recomputed.logits).max() <= TOL
    assert np.abs(cached.scores - recomputed.scores).max() <= TOL
    if decoding != "beam":       # one pass over prompt and text gives every step's logits
        full = model.eval()(np.concatenate([PROMPT, cached.tokens], axis=1)).data
        assert np.abs(cached.logits - full[:, PROMPT.shape[1] - 1:-1]).max() <= TOL
    assert len(np.unique(cached.tokens)) > 1                               # not degenerate


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_the_cache_holds_2_l_b_t_n_kv_dh_itemsize_bytes(n_kv_heads):
    model = llama_lm(n_kv_heads).eval()
    cache = model.new_cache(9)
    model(PROMPT, cache=cache)
    head_dim = D // H
    assert cache[0].kT.shape == (3, n_kv_heads, 1, head_dim, 9)          # only the KV heads
    assert llama.kv_cache_bytes(cache) == llama.kv_cache_formula(2, 3, 9, n_kv_heads, head_dim)
    assert llama.kv_cache_formula(2, 3, 9, n_kv_heads, head_dim) == 2 * 2 * 3 * 9 * D * 8 // (
        H // n_kv_heads)


# ---- bad input -----------------------------------------------------------------------------------
def test_n_head_must_be_a_multiple_of_n_kv_heads():
    with pytest.raises(ValueError, match=r"n_head=4 is not a multiple of n_kv_heads=3 .*"
                                         r"pass n_kv_heads in \[1, 2, 4\]"):
        llama.DecoderLM(**model_kwargs(3))


def test_the_cache_refuses_a_pad_mask():
    model = llama_lm(2).eval()
    with pytest.raises(ValueError, match="a KV cache serves decoding without padding"):
        model(PROMPT, pad_mask=np.zeros(PROMPT.shape, bool), cache=model.new_cache(4))


def test_printing_a_llama_model_shows_rmsnorm_and_the_grouped_query_attentions_settings():
    text = repr(llama.DecoderLM(**model_kwargs(n_kv_heads=2, **LLAMA)))
    assert text.startswith("DecoderLM(\n  n_vocab=11, n_embd=16, n_positions=5, positions='rope', "
                           "tie_weights=False\n")
    assert ("    (ln_1): RMSNorm(dim=16, eps=1e-05)\n"
            "    (ln_2): RMSNorm(dim=16, eps=1e-05)\n"
            "    (attention): GroupedQueryAttention(\n"
            "      n_embd=16, n_head=4, n_kv_heads=2, rope_layout='rotate_half', "
            "rope_base=10000.0\n"
            "      (q_projection): Linear(in_size=16, out_size=16)\n"
            "      (k_projection): Linear(in_size=16, out_size=8)\n") in text


def test_float_token_ids_are_refused_as_transformer_decoder_lm_refuses_them():
    with pytest.raises(TypeError, match=r"^DecoderLM: token ids must be integers, got dtype "
                                        r"float64; pass ids.astype\(int\)$"):
        llama.DecoderLM(**model_kwargs(**LLAMA))(np.ones((1, 3)))


def test_rope_refuses_an_odd_head_size():
    with pytest.raises(ValueError, match="head size must be an even integer .* head_dim=3"):
        llama.DecoderLM(V, 12, 4, S, positions="rope")
    llama.DecoderLM(V, 12, 4, S, positions="learned")          # without RoPE an odd size is fine


def test_only_a_learned_table_refuses_a_prompt_past_the_trained_length():
    long_prompt = np.random.default_rng(10).integers(0, V, (1, S + 3))
    with pytest.raises(ValueError, match=f"sequence length {S + 3} exceeds n_positions={S}"):
        llama.DecoderLM(**model_kwargs())(long_prompt)
    with pytest.raises(ValueError, match="exceeds n_positions"):
        llama.DecoderLM(**model_kwargs()).generate(long_prompt[:, :S], 1)
    for positions in ("rope", "sinusoidal"):
        model = llama.DecoderLM(**model_kwargs(positions=positions))
        assert model(long_prompt).shape == (1, S + 3, V)
        assert model.generate(long_prompt, 2).tokens.shape == (1, 2)


@pytest.mark.parametrize("switch,value", [("norm", "batchnorm"), ("ffn", "relu"),
                                          ("positions", "alibi"), ("rope_layout", "meta")])
def test_an_unknown_switch_value_names_the_choices(switch, value):
    switches = dict(LLAMA, **{switch: value})
    with pytest.raises(ValueError, match=f"{switch} must be one of .* got '{value}'"):
        llama.DecoderLM(**model_kwargs(**switches))
