"""Decoding (notes §2.3, §7.6, exercise 11): DecoderLM.generate and EncoderDecoder.generate, greedy
and sampled, with and without the KV cache.

The cache must change nothing but the cost: every step's logits equal a full recompute over the
prefix to <= 1e-12 (float64, both models, Post-LN and Pre-LN), the tokens are the same, and each
step after the first pushes one position through the decoder (the encoder output's cross-attention
keys/values are projected once). Also: seeded sampling that really draws from softmax(z / T),
stopping at an end token, the paper's source length + 50 limit, the n_positions limit of learned
positions, and the errors."""
import numpy as np
import pytest

import transformer
TOL = 1e-12
V = 13


@pytest.fixture(autouse=True)
def _seed():
    transformer.set_seed(0)


def decoder_lm(pre_ln=True, positions="learned", **kwargs):
    kwargs = dict(n_positions=16, n_layers=2, p_dropout=0.1, pre_ln=pre_ln, positions=positions,
                  tie_weights=not pre_ln) | kwargs
    return transformer.DecoderLM(V, 16, 4, **kwargs)


def encoder_decoder(pre_ln=False, **kwargs):
    return transformer.EncoderDecoder(
        V, 16, 4, **(dict(n_layers=2, n_positions=64, p_dropout=0.1, pre_ln=pre_ln) | kwargs))


PROMPT = np.random.default_rng(0).integers(0, V, (3, 4))
SRC = np.random.default_rng(1).integers(0, V, (3, 5))
SRC_PAD = np.array([[False] * 5, [False, False, False, True, True], [False] + [True] * 4])


def teacher_forced_step_logits(model, result, src=None, src_pad=None):
    """One forward over prompt/source + everything generated: position by position the logits every
    step should have chosen from (exercise 11: training scores all positions in one pass)."""
    model.eval()
    if isinstance(model, transformer.EncoderDecoder):
        return model(src, result.tokens, src_pad).data
    full = model(np.concatenate([PROMPT, result.tokens], axis=1)).data
    return full[:, PROMPT.shape[1] - 1:-1]


def generate(model, use_cache, **kwargs):
    if isinstance(model, transformer.EncoderDecoder):
        return model.generate(SRC, SRC_PAD, kwargs.pop("max_new_tokens", 9), use_cache=use_cache,
                              **kwargs)
    return model.generate(PROMPT, kwargs.pop("max_new_tokens", 9), use_cache=use_cache, **kwargs)


MODELS = {
    "DecoderLM learned": lambda pre_ln: decoder_lm(pre_ln),
    "DecoderLM sinusoidal": lambda pre_ln: decoder_lm(pre_ln, positions="sinusoidal"),
    "EncoderDecoder": lambda pre_ln: encoder_decoder(pre_ln),
}


# ---- the cache changes nothing but the cost ------------------------------------------------------
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("pre_ln", [False, True], ids=["post_ln", "pre_ln"])
@pytest.mark.parametrize("name", list(MODELS))
def test_every_cached_step_equals_a_full_recompute_over_the_prefix(name, pre_ln, sample):
    model = MODELS[name](pre_ln)
    draw = dict(sample=True, temperature=1.5, rng=np.random.default_rng(7)) if sample else {}
    cached = generate(model, True, **draw)
    draw = dict(draw, rng=np.random.default_rng(7)) if sample else {}
    recomputed = generate(model, False, **draw)
    assert cached.tokens.shape == (3, 9)
    np.testing.assert_array_equal(cached.tokens, recomputed.tokens)          # the same tokens
    assert np.max(np.abs(cached.logits - recomputed.logits)) <= TOL          # every step's logits
    one_pass = teacher_forced_step_logits(model, cached, SRC, SRC_PAD)
    assert np.max(np.abs(cached.logits - one_pass)) <= TOL
    assert len(np.unique(cached.tokens)) > 1                                 # not a degenerate test


def test_ex11_training_scores_all_positions_at_once_generation_needs_one_pass_per_token():
    """Exercise 11: with the whole target known, one causal pass gives every position's
    distribution; generating it takes one decoder pass per token, since step t + 1's input is step
    t's output."""
    model = encoder_decoder(pre_ln=True)
    result = model.generate(SRC, SRC_PAD, 8)
    assert result.n_forward == 8
    one_pass = teacher_forced_step_logits(model, result, SRC, SRC_PAD)     # 1 forward
    assert np.max(np.abs(result.logits - one_pass)) <= TOL
    # greedy: each token is its argmax
    np.testing.assert_array_equal(one_pass.argmax(-1), result.tokens)


def record_rows(module, log):
    """Log how many positions each call of module (a Linear) is given."""
    original = module.forward

    def forward(x):
        log.append(x.shape[1])
        return original(x)
    module.forward = forward


@pytest.mark.parametrize("use_cache", [True, False])
def test_decoder_lm_with_the_cache_runs_one_position_per_step(use_cache):
    model = decoder_lm()
    ffn, keys = [], []
    record_rows(model.layers[-1].ff.linear_in, ffn)
    record_rows(model.layers[-1].attention.k_projection, keys)
    result = model.generate(PROMPT, 6, use_cache=use_cache)
    p = PROMPT.shape[1]
    expected = [p] + [1] * 5 if use_cache else [p + t for t in range(6)]
    assert ffn == keys == expected
    assert result.n_forward == 6 and result.positions_computed == sum(expected)


@pytest.mark.parametrize("use_cache", [True, False])
def test_encoder_decoder_projects_the_memory_for_cross_attention_once(use_cache):
    model = encoder_decoder()
    ffn, cross_keys, self_keys = [], [], []
    record_rows(model.decoder_layers[0].ff.linear_in, ffn)
    record_rows(model.decoder_layers[0].cross_attention.k_projection, cross_keys)
    record_rows(model.decoder_layers[0].attention.k_projection, self_keys)
    result = model.generate(SRC, SRC_PAD, 6, use_cache=use_cache)
    expected = [1] * 6 if use_cache else [1 + t for t in range(6)]
    assert ffn == self_keys == expected
    # once, or every step
    assert cross_keys == ([SRC.shape[1]] if use_cache else [SRC.shape[1]] * 6)
    assert result.positions_computed == sum(expected)


def test_cache_holds_exactly_what_was_fed_back():
    model = decoder_lm()
    cache = model.new_cache(7)
    with transformer.no_grad():
        model.eval()(PROMPT, cache=cache)
        model(PROMPT[:, :2], cache=cache)
    assert all(c.length == 6 for c in cache)
    # (B, h, Dh, L), (B, h, L, Dh)
    assert cache[0].kT.shape == (3, 4, 4, 7) and cache[0].v.shape == (3, 4, 7, 4)
    # the unwritten slot is still empty
    assert (cache[0].kT.numpy()[..., 6:] == 0).all()
    weights = model.layers[0].attention.last_attention.numpy()      # (B, h, 2 new queries, L = 7)
    # unwritten and future: 0
    assert (weights[..., 6:] == 0).all() and (weights[:, :, 0, 5] == 0).all()


# ---- decoding behaviour --------------------------------------------------------------------------
def test_greedy_picks_the_argmax_and_ignores_temperature():
    model = decoder_lm()
    result = model.generate(PROMPT, 5)
    np.testing.assert_array_equal(result.tokens, result.logits.argmax(-1))
    np.testing.assert_array_equal(model.generate(PROMPT, 5, temperature=0.01).tokens, result.tokens)


def test_sampling_is_fixed_by_the_seed():
    model = encoder_decoder()
    draw = lambda seed: model.generate(SRC, SRC_PAD, 12, sample=True,
                                       rng=np.random.default_rng(seed)).tokens
    np.testing.assert_array_equal(draw(3), draw(3))
    # an int seed
    np.testing.assert_array_equal(draw(3), model.generate(SRC, SRC_PAD, 12, sample=True,
                                                          rng=3).tokens)
    assert (draw(3) != draw(4)).any()


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_sampled_tokens_follow_softmax_of_logits_over_temperature(temperature):
    model = decoder_lm()
    n = 6000
    result = model.generate(np.repeat(PROMPT[:1], n, axis=0), 1, sample=True,
                            temperature=temperature, rng=np.random.default_rng(0))
    z = result.logits[0, 0] / temperature
    p = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    frequency = np.bincount(result.tokens[:, 0], minlength=V) / n
    assert np.all(np.abs(frequency - p) <= 4.5 * np.sqrt(p * (1 - p) / n) + 1e-12)


def test_rows_stop_after_the_end_token_and_are_padded_after_it():
    model = decoder_lm()
    free = model.generate(PROMPT, 10)
    end_id = int(free.tokens[0, 2])
    first = [int(np.argmax(row == end_id)) if (row == end_id).any() else None
             for row in free.tokens]
    stopped = model.generate(PROMPT, 10, end_id=end_id, pad_id=V - 1)
    for b, f in enumerate(first):
        length = 10 if f is None else f + 1
        assert stopped.lengths[b] == length
        np.testing.assert_array_equal(stopped.tokens[b, :length], free.tokens[b, :length])
        assert (stopped.tokens[b, length:] == V - 1).all()
    assert stopped.tokens.shape[1] == stopped.lengths.max()               # stops once every row has


def test_encoder_decoder_default_limit_is_each_source_length_plus_50():
    model = encoder_decoder(n_layers=1, n_positions=64)
    result = model.generate(SRC, SRC_PAD)
    # 5, 3, 1 real source tokens
    lengths = 5 - SRC_PAD.sum(1)
    # the paper's limit (notes §7.6)
    np.testing.assert_array_equal(result.lengths, lengths + 50)
    assert result.tokens.shape == (3, 55) and (result.tokens[2, 51:] == 0).all()
    capped = encoder_decoder(n_layers=1, n_positions=52).generate(SRC, SRC_PAD)
    np.testing.assert_array_equal(capped.lengths, np.minimum(lengths + 50, 52))


def test_generation_runs_in_eval_mode_and_restores_the_training_mode():
    model = encoder_decoder(p_dropout=0.5).train()
    first = model.generate(SRC, SRC_PAD, 6).tokens
    assert model.training and all(m.training for _, m in model.named_modules())
    np.testing.assert_array_equal(model.generate(SRC, SRC_PAD, 6).tokens, first)   # no dropout
    np.testing.assert_array_equal(model.eval().generate(SRC, SRC_PAD, 6).tokens, first)


def test_zero_new_tokens_gives_an_empty_result():
    for model in (decoder_lm(), encoder_decoder()):
        result = generate(model, True, max_new_tokens=0)
        assert (result.tokens.shape == (3, 0) and result.logits.shape == (3, 0, V)
                and result.n_forward == 0)


# ---- limits and bad input ------------------------------------------------------------------------
def test_the_cache_cannot_go_past_n_positions_with_learned_positions():
    model = decoder_lm(n_positions=8)
    assert model.generate(PROMPT, 4).tokens.shape == (3, 4)                # 4 + 4 = 8: fits exactly
    with pytest.raises(ValueError, match=r"prompt length 4 \+ max_new_tokens 5 = 9 exceeds "
                                         r"n_positions=8: the learned position table has no row "
                                         r"past position 7; ask for at most 4 new tokens or build "
                                         r"the model with a larger n_positions"):
        model.generate(PROMPT, 5)
    with pytest.raises(ValueError, match=r"a KV cache of 9 positions exceeds n_positions=8"):
        model.new_cache(9)
    cache = model.new_cache(8)
    with transformer.no_grad():
        # positions 0..7: the whole table
        model.eval()(np.zeros((1, 8), int), cache=cache)
        with pytest.raises(ValueError, match=r"sequence length 9 exceeds n_positions=8: the "
                                             r"learned position table has no row for position 8"):
            model(np.zeros((1, 1), int), cache=cache)
        sinusoidal = decoder_lm(n_positions=8, positions="sinusoidal").eval()
        # no table, but a cache has a capacity
        cache = sinusoidal.new_cache(8)
        sinusoidal(np.zeros((1, 8), int), cache=cache)
        with pytest.raises(ValueError, match=r"KVCache: cannot write 1 more position\(s\) after 8: "
                                             r"the cache holds 8; make it with a larger capacity"):
            sinusoidal(np.zeros((1, 1), int), cache=cache)
    assert (decoder_lm(n_positions=8, positions="sinusoidal").generate(PROMPT, 9).tokens.shape
            == (3, 9))


def test_errors():
    lm, ed = decoder_lm(), encoder_decoder(n_positions=20)
    for model in (lm, ed):
        with pytest.raises(ValueError, match=r"max_new_tokens must be an integer >= 0, got -1; 0 "
                                             r"generates nothing"):
            generate(model, True, max_new_tokens=-1)
        for temperature in (0.0, -1.0):
            with pytest.raises(ValueError, match=rf"temperature must be > 0 when sampling \(the "
                                                 rf"logits are divided by it\), got {temperature}; "
                                                 rf"for the most likely token use sample=False "
                                                 rf"\(greedy\)"):
                generate(model, True, sample=True, temperature=temperature,
                         rng=np.random.default_rng(0))
        with pytest.raises(ValueError, match=r"sampling needs rng=np.random.default_rng\(seed\)"):
            generate(model, True, sample=True)
    with pytest.raises(ValueError, match=r"max_new_tokens=21 exceeds n_positions=20, the longest "
                                         r"target"):
        ed.generate(SRC, SRC_PAD, 21)
    with pytest.raises(ValueError, match=r"src_pad_mask must have the shape of the source ids "
                                         r"\(3, 5\)"):
        ed.generate(SRC, SRC_PAD[:2])
    with pytest.raises(ValueError, match=r"expected a prompt of shape \(B, P\) with P >= 1, got "
                                         r"\(4,\)"):
        lm.generate(PROMPT[0], 3)
    with pytest.raises(ValueError, match=r"not causal \(causal=False\)"):
        decoder_lm(causal=False).generate(PROMPT, 3)
    with pytest.raises(ValueError, match="a KV cache with a capacity serves causal self-attention"):
        transformer.MultiHeadAttention(16, 4, causal=False)(
            transformer.Tensor(np.zeros((1, 1, 16))), cache=transformer.KVCache(4))
    with pytest.raises(ValueError, match=r"capacity must be >= 1 position, got 0"):
        transformer.KVCache(0)
