"""decoding.py (notes §2.3, §7.6, exercise 11; Vaswani et al. 2017 after Wu et al. 2016): the KV
cache, greedy and sampled generation, top-k and nucleus (top-p) sampling, and beam search with a
length penalty, through DecoderLM.generate and EncoderDecoder.generate.

The cache must change nothing but the cost: every step's logits equal a full recompute over the
prefix to <= 1e-12 (float64, both models, Post-LN and Pre-LN), the tokens are the same, and each
step after the first pushes one position through the decoder (the encoder output's cross-attention
keys/values are projected once). Also: seeded sampling that really draws from softmax(z / T),
stopping at an end token, the paper's source length + 50 limit, the n_positions limit of learned
positions, and the errors.

Beam search is checked against what it approximates: on a tiny model an exhaustive enumeration of
every continuation finds the best sequence, and a beam at least as wide as V^(T-1) must find exactly
it (score to 1e-12), without an end token and with one at three length penalties. Also: one beam
is greedy, the KV cache (its rows reordered by parent beam every step) changes nothing, the rows of
a batch are searched independently, every reported score is the model's log-probability of the
tokens, the stops at end_id and at source length + 50, and the sampling filters' limits (top_k = V
and top_p = 1 are plain sampling, top_k = 1 is greedy).

The conventions, on language models written as tables of next-token probabilities, small enough to
check by hand and by exhaustive search: with an end token ours pools every end extension where
HuggingFace's rule (finish="in_beam") finishes only those ranked in the beam, and its answer is
never ranked lower; a row stops only when no live sum / lp(limit) beats the worst finished; the
finished list is the k best in order; top-k keeps exactly k tokens, ties to the lower id as
argmax; top-p keeps a token while the mass ranked above it is below p."""
import itertools
import math

import numpy as np
import pytest

from lecture06 import decoding, transformer
from lecture06.decoding import KVCache, length_penalty
from lecture06.encoder_decoder import EncoderDecoder
from lecture05.tensor import Tensor, no_grad

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
    return EncoderDecoder(
        V, 16, 4, **(dict(n_layers=2, n_positions=64, p_dropout=0.1, pre_ln=pre_ln) | kwargs))


PROMPT = np.random.default_rng(0).integers(0, V, (3, 4))
SRC = np.random.default_rng(1).integers(0, V, (3, 5))
SRC_PAD = np.array([[False] * 5, [False, False, False, True, True], [False] + [True] * 4])


def teacher_forced_step_logits(model, result, src=None, src_pad=None):
    """One forward over prompt/source + everything generated: position by position the logits every
    step should have chosen from (exercise 11: training scores all positions in one pass)."""
    model.eval()
    if isinstance(model, EncoderDecoder):
        return model(src, result.tokens, src_pad).data
    full = model(np.concatenate([PROMPT, result.tokens], axis=1)).data
    return full[:, PROMPT.shape[1] - 1:-1]


def generate(model, use_cache, **kwargs):
    if isinstance(model, EncoderDecoder):
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
    with no_grad():
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
    with pytest.raises(ValueError, match=r"^DecoderLM.generate: prompt length 4 \+ max_new_tokens "
                                         r"5 = 9 exceeds n_positions=8: the learned position table "
                                         r"has no row for position 8; ask for at most 4 new tokens "
                                         r"or build the model with a larger n_positions$"):
        model.generate(PROMPT, 5)
    with pytest.raises(ValueError, match=r"^DecoderLM: a KV cache of 9 positions exceeds "
                                         r"n_positions=8: the learned position table has no row "
                                         r"for position 8; ask for at most 8 or build the model "
                                         r"with a larger n_positions$"):
        model.new_cache(9)
    cache = model.new_cache(8)
    with no_grad():
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


@pytest.mark.parametrize("new_batch_size", [1, 3], ids=["one row (it would broadcast)", "three"])
def test_a_cache_reused_with_another_batch_size_names_both_and_says_to_make_a_new_one(
        new_batch_size):
    fix = (rf"^KVCache: this cache holds a batch of 2 rows, got one of {new_batch_size}; a cache "
           rf"serves one batch: make a new one for this batch with model.new_cache\(capacity\)$")
    lm, ed = decoder_lm().eval(), encoder_decoder().eval()
    with no_grad():
        cache = lm.new_cache(8)
        lm(PROMPT[:2], cache=cache)
        with pytest.raises(ValueError, match=fix):
            lm(PROMPT[:new_batch_size, :1], cache=cache)
        cache = ed.new_cache(8)
        ed.decode(PROMPT[:2, :1], ed.encode(SRC[:2]), cache=cache)
        with pytest.raises(ValueError, match=fix):
            ed.decode(PROMPT[:new_batch_size, :1], ed.encode(SRC[:new_batch_size]), cache=cache)


def test_a_finished_hypothesis_prints_its_tokens_scores_and_length_not_its_logits():
    hypothesis = decoding.Hypothesis(np.array([3, 1]), -1.234567, -1.1, np.zeros((2, V)))
    assert repr(hypothesis) == "Hypothesis(tokens=[3, 1], score=-1.2346, ranked=-1.1000, length=2)"
    finished = decoder_lm().generate(PROMPT, 3, num_beams=2).finished
    assert str(finished).count("Hypothesis(") == 6 and "logits" not in str(finished)


def test_generate_and_translate_refuse_float_ids_as_the_models_do():
    with pytest.raises(TypeError, match=r"^DecoderLM.generate: prompt token ids must be integers, "
                                        r"got dtype float64; pass prompt.astype\(int\)$"):
        decoder_lm().generate(PROMPT.astype(float), 3)
    with pytest.raises(TypeError, match=r"^EncoderDecoder: source token ids must be integers, got "
                                        r"dtype float64; pass ids.astype\(int\)$"):
        encoder_decoder().generate(SRC.astype(float), SRC_PAD)


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
    with pytest.raises(ValueError, match=r"^EncoderDecoder.generate: max_new_tokens=21 exceeds "
                                         r"n_positions=20: the precomputed sinusoidal table has "
                                         r"no row for position 20; ask for at most 20 or build the "
                                         r"model with a larger n_positions$"):
        ed.generate(SRC, SRC_PAD, 21)
    with pytest.raises(ValueError, match=r"src_pad_mask must have the shape of the source ids "
                                         r"\(3, 5\)"):
        ed.generate(SRC, SRC_PAD[:2])
    with pytest.raises(ValueError, match=r"expected a prompt of shape \(B, P\) with P >= 1, got "
                                         r"\(4,\)"):
        lm.generate(PROMPT[0], 3)
    with pytest.raises(TypeError, match=r"^DecoderLM.generate: prompt token ids must be integers "
                                        r"in a numpy array \(or nested lists\), got a Tensor of "
                                        r"shape \(3, 4\); pass prompt.numpy\(\).astype\(int\)$"):
        lm.generate(Tensor(PROMPT), 3)
    with pytest.raises(TypeError, match=r"^EncoderDecoder: source token ids must be integers in "
                                        r"a numpy array \(or nested lists\), got a Tensor of "
                                        r"shape \(3, 5\); pass ids.numpy\(\).astype\(int\)$"):
        ed.generate(Tensor(SRC), SRC_PAD)
    with pytest.raises(ValueError, match=r"not causal \(causal=False\)"):
        decoder_lm(causal=False).generate(PROMPT, 3)
    with pytest.raises(ValueError, match="a KV cache with a capacity serves causal self-attention"):
        transformer.MultiHeadAttention(16, 4, causal=False)(
            Tensor(np.zeros((1, 1, 16))), cache=KVCache(4))
    with pytest.raises(ValueError, match=r"capacity must be >= 1 position, got 0"):
        KVCache(0)


# ==== beam search and the sampling filters, on tiny models (V = 5 to 9, d = 8) ====================
def tiny_decoder_lm(V=5, seed=0, **kwargs):
    transformer.set_seed(seed)
    return transformer.DecoderLM(V, 8, 2, **(dict(n_positions=16, n_layers=2, p_dropout=0.1)
                                             | kwargs))


def tiny_encoder_decoder(V=5, seed=0, **kwargs):
    transformer.set_seed(seed)
    return EncoderDecoder(V, 8, 2, **(dict(n_layers=2, n_positions=64, p_dropout=0.1) | kwargs))


TINY_PROMPT = np.array([[1, 2, 0], [3, 3, 4]])
TINY_SRC = np.array([[2, 3, 4, 1, 2], [4, 2, 3, 0, 0], [3, 0, 0, 0, 0]])
TINY_SRC_PAD = TINY_SRC == 0
TINY_MODELS = {"DecoderLM": tiny_decoder_lm, "EncoderDecoder": tiny_encoder_decoder}


def decode(model, max_new_tokens, inputs=None, pad=None, **kwargs):
    """model.generate on TINY_PROMPT (DecoderLM) or TINY_SRC, TINY_SRC_PAD (EncoderDecoder), or on
    the rows given."""
    if isinstance(model, EncoderDecoder):
        inputs, pad = (TINY_SRC, TINY_SRC_PAD) if inputs is None else (inputs, pad)
        return model.generate(inputs, pad, max_new_tokens, **kwargs)
    return model.generate(TINY_PROMPT if inputs is None else inputs, max_new_tokens, **kwargs)


def token_log_probs(model, row: int, continuations: np.ndarray) -> np.ndarray:
    """(N, T) continuations of input row `row` -> (N, T) the model's log p of each token given
    everything before it, every continuation in one teacher-forced pass."""
    model.eval()
    n = len(continuations)
    with no_grad():
        if isinstance(model, EncoderDecoder):
            logits = model(np.repeat(TINY_SRC[row:row + 1], n, 0), continuations,
                           np.repeat(TINY_SRC_PAD[row:row + 1], n, 0)).data
        else:
            prompt = np.repeat(TINY_PROMPT[row:row + 1], n, 0)
            full = model(np.concatenate([prompt, continuations], axis=1)).data
            logits = full[:, prompt.shape[1] - 1:-1]
    shifted = logits - logits.max(-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return np.take_along_axis(log_p, continuations[..., None], axis=-1)[..., 0]


def rows_of(model):
    return len(TINY_SRC) if isinstance(model, EncoderDecoder) else len(TINY_PROMPT)


# ---- exact: a wide enough beam finds the best sequence of an exhaustive enumeration ----------
@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_a_beam_of_v_to_the_t_minus_1_finds_the_best_of_all_v_to_the_t_continuations(name):
    V, T = 5, 4
    model = TINY_MODELS[name](V)
    every = np.array(list(itertools.product(range(V), repeat=T)))     # (V^T, T)
    result = decode(model, T, num_beams=V ** (T - 1))
    for row in range(rows_of(model)):
        log_p = token_log_probs(model, row, every).sum(1)
        best = int(np.argmax(log_p))
        np.testing.assert_array_equal(result.tokens[row], every[best])
        assert abs(result.scores[row] - log_p[best]) <= TOL
        assert abs(result.finished[row][0].score - log_p[best]) <= TOL
        assert log_p[best] - np.sort(log_p)[-2] > 1e-6        # a unique best: not a test of ties


def stopping_sequences(model, row: int, V: int, T: int, end_id: int) -> dict:
    """Every continuation that stops at end_id (its first) or at the limit of T tokens -> its log p
    under the model."""
    every = np.array(list(itertools.product(range(V), repeat=T)))
    cumulative = np.cumsum(token_log_probs(model, row, every), axis=1)     # (V^T, T)
    sequences = {}
    for seq, sums in zip(every, cumulative):
        ends = np.flatnonzero(seq == end_id)
        length = ends[0] + 1 if len(ends) else T
        sequences[tuple(seq[:length])] = sums[length - 1]
    return sequences


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_with_an_end_token_the_wide_beam_finds_the_best_by_log_p_over_the_length_penalty(name,
                                                                                     alpha):
    V, T = 5, 4
    # models and end tokens chosen so that the penalty changes which length wins
    seed, end_id = (1, 4) if name == "DecoderLM" else (2, 3)
    model = TINY_MODELS[name](V, seed=seed)
    result = decode(model, T, num_beams=V ** (T - 1), end_id=end_id, pad_id=0,
                      length_penalty=alpha)
    lengths_of_best = set()
    for row in range(rows_of(model)):
        sequences = stopping_sequences(model, row, V, T, end_id)
        ranked = {seq: log_p / length_penalty(len(seq), alpha) for seq, log_p in sequences.items()}
        best = max(ranked, key=ranked.get)
        assert sorted(ranked.values())[-1] - sorted(ranked.values())[-2] > 1e-6
        length = result.lengths[row]
        assert tuple(result.tokens[row, :length]) == best
        assert (result.tokens[row, length:] == 0).all()                     # padded after it
        assert abs(result.scores[row] - sequences[best]) <= TOL
        assert abs(result.finished[row][0].ranked - ranked[best]) <= TOL
        lengths_of_best.add(len(best))
    if alpha == 2.0:
        assert max(lengths_of_best) > 1         # not only the end token alone


def test_the_length_penalty_arithmetic():
    for alpha in (0.0, 0.6, 2.0):
        assert length_penalty(1, alpha) == 1.0                          # (5 + 1)/6 = 1
        assert abs(length_penalty(6, alpha) - (11 / 6) ** alpha) <= 1e-15
        assert abs(length_penalty(50, alpha) - (55 / 6) ** alpha) <= 1e-15
    assert abs(length_penalty(50, 0.6) - math.exp(0.6 * math.log(55 / 6))) <= 1e-14
    np.testing.assert_array_equal(length_penalty(np.array([1, 6, 50]), 0.0), [1.0, 1.0, 1.0])


# ---- one beam is greedy; beams and the cache -------------------------------------------------
@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_one_beam_is_greedy_token_for_token(name):
    model = TINY_MODELS[name](V=7)
    greedy = decode(model, 9, end_id=6)
    for alpha in (0.0, 0.6):
        one = decode(model, 9, end_id=6, num_beams=1, length_penalty=alpha)
        np.testing.assert_array_equal(one.tokens, greedy.tokens)
        np.testing.assert_array_equal(one.logits, greedy.logits)
        np.testing.assert_array_equal(one.lengths, greedy.lengths)
    assert greedy.finished is None


@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_every_score_is_the_models_log_probability_of_its_tokens(name):
    """Generation.scores and each finished hypothesis' score against one teacher-forced pass."""
    model = TINY_MODELS[name](V=7)
    for kwargs in (dict(), dict(sample=True, temperature=0.7, top_p=0.9, rng=3),
                   dict(num_beams=3, length_penalty=0.6)):
        result = decode(model, 8, end_id=6, **kwargs)
        for row in range(rows_of(model)):
            length = result.lengths[row]
            log_p = token_log_probs(model, row, result.tokens[row:row + 1, :length]).sum()
            assert abs(result.scores[row] - log_p) <= TOL
        for row, pool in enumerate(result.finished or []):
            assert 1 <= len(pool) <= 3
            assert [h.ranked for h in pool] == sorted((h.ranked for h in pool), reverse=True)
            for h in pool:
                assert abs(h.score - token_log_probs(model, row, h.tokens[None]).sum()) <= TOL
                assert h.ranked == h.score / length_penalty(len(h.tokens), 0.6)
                assert (h.tokens[:-1] != 6).all()                  # end_id only at the end


@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_the_best_beam_is_at_least_as_likely_as_greedy_on_random_models(name):
    """Not a theorem (a beam can drop the greedy prefix and end lower); true on these models, whose
    rows all have the same length (no end token), so the sums compare directly."""
    gains = []
    for seed in range(4):
        model = TINY_MODELS[name](V=9, seed=seed)
        greedy = decode(model, 10)
        for k in (2, 4):
            gain = decode(model, 10, num_beams=k).scores - greedy.scores
            assert (gain >= -TOL).all()
            gains.extend(gain)
    assert max(gains) > 1e-6                            # somewhere strictly more likely: no tie


@pytest.mark.parametrize("end_id", [None, 6])
@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_the_cached_search_equals_the_search_without_the_cache(name, end_id):
    model = TINY_MODELS[name](V=7)
    cached = decode(model, 10, num_beams=3, end_id=end_id, length_penalty=0.6)
    recomputed = decode(model, 10, num_beams=3, end_id=end_id, length_penalty=0.6,
                          use_cache=False)
    np.testing.assert_array_equal(cached.tokens, recomputed.tokens)
    np.testing.assert_array_equal(cached.lengths, recomputed.lengths)
    assert np.abs(cached.scores - recomputed.scores).max() <= TOL
    assert np.abs(cached.logits - recomputed.logits).max() <= TOL
    for ours, theirs in zip(cached.finished, recomputed.finished):
        assert [h.tokens.tolist() for h in ours] == [h.tokens.tolist() for h in theirs]
    assert cached.n_forward == recomputed.n_forward
    texts = {tuple(h.tokens) for pool in cached.finished for h in pool}
    assert len(texts) > 3                                                 # not a degenerate test


@pytest.mark.parametrize("end_id", [None, 6])
@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_the_rows_of_a_batch_are_searched_independently(name, end_id):
    """The encoder-decoder at its default limit, each row's source length + 50."""
    model = TINY_MODELS[name](V=7)
    limit = None if name == "EncoderDecoder" else 10
    batch = decode(model, limit, num_beams=3, end_id=end_id, length_penalty=0.6)
    for row in range(rows_of(model)):
        inputs = TINY_SRC if name == "EncoderDecoder" else TINY_PROMPT
        alone = decode(model, limit, inputs[row:row + 1], TINY_SRC_PAD[row:row + 1], num_beams=3,
                         end_id=end_id, length_penalty=0.6)
        length = batch.lengths[row]
        assert alone.lengths[0] == length
        np.testing.assert_array_equal(alone.tokens[0], batch.tokens[row, :length])
        assert abs(alone.scores[0] - batch.scores[row]) <= TOL


def test_beam_search_stops_at_end_id_pads_after_it_and_stops_by_source_length_plus_50():
    model = tiny_encoder_decoder(V=7)
    source_lengths = (~TINY_SRC_PAD).sum(1)                                   # 5, 3, 1
    free = model.generate(TINY_SRC, TINY_SRC_PAD, num_beams=3)                      # no end token
    np.testing.assert_array_equal(free.lengths, source_lengths + 50)     # each row's own limit
    assert free.n_forward == 55
    for pool, limit in zip(free.finished, source_lengths + 50):
        assert len(pool) == 3 and all(len(h.tokens) == limit for h in pool)
    stopped = model.generate(TINY_SRC, TINY_SRC_PAD, num_beams=3, end_id=6, pad_id=5)
    for row, length in enumerate(stopped.lengths):
        assert length <= source_lengths[row] + 50
        tokens = stopped.tokens[row]
        ends_with_end_id = tokens[length - 1] == 6
        assert ends_with_end_id or length == source_lengths[row] + 50
        assert (tokens[:length - 1] != 6).all() and (tokens[length:] == 5).all()
    assert stopped.n_forward < 55            # the search ended before the limit: the stopping rule


def test_with_the_cache_the_decoder_computes_beams_times_steps_positions_and_encodes_once():
    model = tiny_encoder_decoder(V=7)
    encoded = []
    encode = model.encode
    model.encode = lambda *args, **kwargs: encoded.append(1) or encode(*args, **kwargs)
    for k in (1, 2, 4):
        encoded.clear()
        result = model.generate(TINY_SRC, TINY_SRC_PAD, 12, num_beams=k)
        assert encoded == [1] and result.n_forward == 12
        assert result.positions_computed == k * 12
        without = model.generate(TINY_SRC, TINY_SRC_PAD, 12, num_beams=k, use_cache=False)
        assert without.positions_computed == k * 12 * 13 // 2
    lm = tiny_decoder_lm(V=7)
    searched = lm.generate(TINY_PROMPT, 6, num_beams=4)
    assert searched.positions_computed == 4 * (TINY_PROMPT.shape[1] + 5)


def test_kv_cache_reorder_takes_each_row_from_its_parent():
    model = tiny_decoder_lm(V=7).eval()
    cache = model.new_cache(5)
    with no_grad():
        model(TINY_PROMPT, cache=cache)
    before = [(c.kT.numpy().copy(), c.v.numpy().copy()) for c in cache]
    for c in cache:
        c.reorder(np.array([1, 1, 0]))
    for c, (kT, v) in zip(cache, before):
        np.testing.assert_array_equal(c.kT.numpy(), kT[[1, 1, 0]])
        np.testing.assert_array_equal(c.v.numpy(), v[[1, 1, 0]])
        assert c.length == TINY_PROMPT.shape[1]
    KVCache().reorder(np.array([0]))                        # empty: nothing to move


# ---- top-k and nucleus sampling ----------------------------------------------------------------
@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_top_k_of_v_and_top_p_of_1_are_plain_sampling_and_top_k_of_1_is_greedy(name):
    V = 7
    model = TINY_MODELS[name](V=V)
    plain = decode(model, 12, sample=True, temperature=1.3, rng=5)
    for kwargs in (dict(top_k=V), dict(top_p=1.0), dict(top_k=V + 3, top_p=1.0)):
        filtered = decode(model, 12, sample=True, temperature=1.3, rng=5, **kwargs)
        np.testing.assert_array_equal(filtered.tokens, plain.tokens)
        np.testing.assert_array_equal(filtered.logits, plain.logits)
    greedy = decode(model, 12)
    for temperature in (0.5, 3.0):
        one = decode(model, 12, sample=True, temperature=temperature, rng=5, top_k=1)
        np.testing.assert_array_equal(one.tokens, greedy.tokens)
    assert len(np.unique(plain.tokens)) > 2 and (plain.tokens != greedy.tokens).any()


def softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


@pytest.mark.parametrize("top_k, top_p", [(3, 1.0), (None, 0.6), (4, 0.5)])
def test_filtered_tokens_follow_the_renormalised_softmax_of_the_kept_set(top_k, top_p):
    """top_k: the k largest logits; top_p: of those, the smallest set, most likely first, whose
    probability reaches p; drawn in proportion to softmax(z / T) over the set."""
    V, n, temperature = 9, 6000, 1.5
    model = tiny_decoder_lm(V=V)
    result = model.generate(np.repeat(TINY_PROMPT[:1], n, 0), 1, sample=True,
                            temperature=temperature, rng=np.random.default_rng(0), top_k=top_k,
                            top_p=top_p)
    z = result.logits[0, 0] / temperature
    order = np.argsort(-z)
    kept = order[:top_k or V]
    p = softmax(z[kept])
    reach = int(np.argmax(np.cumsum(p) >= top_p)) + 1              # the smallest set reaching p
    kept, p = kept[:reach], p[:reach] / p[:reach].sum()
    assert 2 <= len(kept) < V                                      # a set that filters something
    expected = np.zeros(V)
    expected[kept] = p
    frequency = np.bincount(result.tokens[:, 0], minlength=V) / n
    assert (frequency[expected == 0] == 0).all()
    assert np.all(np.abs(frequency - expected) <= 4.5 * np.sqrt(expected * (1 - expected) / n)
                  + 1e-12)


# ---- bad arguments ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_every_bad_decoding_argument_says_what_to_pass(name):
    model = TINY_MODELS[name]()
    who = f"{name}.generate: "
    for bad in (0, -2, 1.5, True, "4"):
        with pytest.raises(ValueError, match=rf"{who}num_beams must be an integer >= 1 \(the "
                                             r"hypotheses kept per row\), got .*; num_beams=1 "
                                             r"decodes greedily"):
            decode(model, 3, num_beams=bad)
    with pytest.raises(ValueError, match=rf"{who}num_beams=4 searches for the most likely text "
                                         r"and does not sample; pass sample=False for beam "
                                         r"search, or num_beams=1 to sample"):
        decode(model, 3, num_beams=4, sample=True, rng=0)
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match=rf"{who}top_k must be an integer >= 1 \(the largest "
                                             rf"logits kept\), got {bad}; top_k=None keeps every "
                                             r"token"):
            decode(model, 3, sample=True, rng=0, top_k=bad)
    for bad in (0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match=rf"{who}top_p must be in \(0, 1\] \(the probability "
                                             rf"the kept tokens reach\), got {bad}; top_p=1 keeps "
                                             r"every token"):
            decode(model, 3, sample=True, rng=0, top_p=bad)
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError, match=rf"{who}length_penalty must be >= 0 \(α in lp\(Y\) = "
                                             rf"\(\(5 \+ \|Y\|\)/6\)\^α\), got {bad}; 0 ranks by "
                                             r"the sum of log-probabilities alone, 0.6 is the "
                                             r"paper's"):
            decode(model, 3, num_beams=2, length_penalty=bad)
    for bad in (5, -1, 2.0, True):
        with pytest.raises(ValueError, match=rf"{who}end_id must be a token id of the model, an "
                                             rf"integer in 0..4, got {bad}; pass the end token's "
                                             r"id, or None to stop only at the limit"):
            decode(model, 3, end_id=bad)
    with pytest.raises(ValueError, match=rf"{who}pad_id must be a token id of the model, an "
                                         r"integer in 0..4, got 5; pass any id the model knows: a "
                                         r"finished row is fed it"):
        decode(model, 3, end_id=1, pad_id=5)
    with pytest.raises(ValueError, match=rf"{who}finish must be 'every' \(every end extension "
                                         r"finishes\) or 'in_beam' \(HuggingFace's rule: only "
                                         r"one ranked among the num_beams best\), got 'top_k'"):
        decode(model, 3, num_beams=2, end_id=1, finish="top_k")
    for kwargs in (dict(top_k=3), dict(top_p=0.9), dict(top_k=3, num_beams=2)):
        with pytest.raises(ValueError, match=rf"{who}top_k= and top_p= filter what sampling draws "
                                             r"from; pass sample=True with them"):
            decode(model, 3, **kwargs)



# ==== the conventions, on hand-made distributions: a table of next-token probabilities ============
A, B, END = 0, 1, 2                 # the tables' token ids: two words and the end token


class TableLM:
    """A language model given by hand: the next token's probabilities (its logits are their logs)
    after each generated prefix, a tuple of ids; uniform after a prefix the table does not list;
    the prompt is ignored. All that generate needs of a DecoderLM: no layers (so no cache), no
    positions (so check_length refuses no length; n_positions is read only for its message)."""
    layers, positions, n_positions, training = [], "none", 0, False

    def __init__(self, table: dict, n_vocab: int = 3):
        self.table, self.n_vocab = table, n_vocab

    def probabilities(self, prefix) -> np.ndarray:
        p = np.asarray(self.table.get(tuple(prefix), np.ones(self.n_vocab)), dtype=float)
        return p / p.sum()

    def __call__(self, ids, cache=None):
        # ids (N, 1 + t): the prompt's one token, then what was generated; (N, V) -> (N, 1, V)
        return Tensor(np.log([self.probabilities(row[1:]) for row in ids])[:, None])

    def check_length(self, owner, length, asked, fix):
        pass

    def eval(self):
        return self

    def train(self, mode=True):
        return self

    def log_p(self, text) -> float:
        return float(sum(np.log(self.probabilities(text[:i])[t]) for i, t in enumerate(text)))


def beam_search(model: TableLM, limit: int, k: int, alpha: float = 0.0, **kwargs):
    return decoding.generate(model, np.zeros((1, 1), int), limit, num_beams=k, end_id=END,
                             length_penalty=alpha, **kwargs)


def finished_texts(result) -> list:
    return [tuple(h.tokens.tolist()) for h in result.finished[0]]


def best_texts(model: TableLM, limit: int, k: int, alpha: float) -> list:
    """Exhaustive: every text that stops at its first END or at the limit, the k best by
    log p / lp(length), best first."""
    texts = set()
    for tokens in itertools.product(range(model.n_vocab), repeat=limit):
        texts.add(tokens[:tokens.index(END) + 1] if END in tokens else tokens)
    ranked = sorted(texts, key=lambda t: -model.log_p(t) / length_penalty(len(t), alpha))
    return ranked[:k]


def test_with_an_end_token_ours_pools_every_end_extension_huggingface_only_those_in_the_beam():
    """Step 1 ranks END third of three (p .2): HuggingFace's rule (finish="in_beam") does not
    finish it, ours does; at step 2 "a END" (.15) ranks third of six, likewise. So HuggingFace
    answers "a a END" (.105), ours END (.2): the best of every text, by an exhaustive search."""
    model = TableLM({(): [.5, .3, .2], (A,): [.35, .35, .3], (A, A): [.25, .15, .6],
                     (A, B): [.5, .3, .2]})
    ours, theirs = beam_search(model, 3, 2), beam_search(model, 3, 2, finish="in_beam")
    assert finished_texts(ours) == [(END,), (A, END)]
    assert finished_texts(theirs) == [(A, A, END), (A, B, A)]
    assert ours.tokens.tolist() == [[END]] and theirs.tokens.tolist() == [[A, A, END]]
    assert abs(ours.scores[0] - np.log(.2)) <= TOL
    assert abs(theirs.scores[0] - np.log(.5 * .35 * .6)) <= TOL
    assert finished_texts(ours)[:1] == best_texts(model, 3, 1, 0.0)
    assert beam_search(model, 3, 2, finish="every").tokens.tolist() == [[END]]   # the default


@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_every_end_extension_ranks_the_answer_at_least_as_high_as_huggingfaces_rule(name):
    """The live beams are the same under both rules and ours pools a superset of the finished
    texts, so its answer's score / lp is never lower; on these models it is higher somewhere."""
    gains = []
    for seed in range(3):
        model = TINY_MODELS[name](V=7, seed=seed)
        ours = decode(model, 8, num_beams=3, end_id=6, length_penalty=0.6)
        theirs = decode(model, 8, num_beams=3, end_id=6, length_penalty=0.6, finish="in_beam")
        gain = [o[0].ranked - t[0].ranked for o, t in zip(ours.finished, theirs.finished)]
        assert min(gain) >= -TOL
        gains.extend(gain)
    assert max(gains) > 1e-6


def test_a_row_stops_only_when_no_live_sum_over_lp_of_the_limit_beats_the_worst_finished():
    """α = 2, k = 2, limit 4. After step 2 the finished are END (.4) and "b END" (.294); the live
    "a a" (.225) over lp(2) could not beat them, over lp(4) it can, and "a a a END" (.216) ranks
    first. The search must go on and find the 2 best of every text."""
    model = TableLM({(): [.3, .3, .4], (A,): [.75, .05, .2], (B,): [.01, .01, .98],
                     (A, A): [.98, .01, .01], (A, A, A): [.01, .01, .98]})
    result = beam_search(model, 4, 2, alpha=2.0)
    assert finished_texts(result) == best_texts(model, 4, 2, 2.0) == [(A, A, A, END), (B, END)]
    assert result.n_forward == 4


def test_the_finished_list_is_the_k_best_in_order_the_bar_is_the_worst_of_them():
    """α = 0, k = 2, limit 3. After step 2 the finished are END (.5) and "b END" (.09); the live
    "a a" (.3) cannot beat the best but can beat the worst, and "a a END" (.294) is second best."""
    model = TableLM({(): [.4, .1, .5], (A,): [.75, .05, .2], (B,): [.05, .05, .9],
                     (A, A): [.01, .01, .98]})
    result = beam_search(model, 3, 2)
    assert finished_texts(result) == best_texts(model, 3, 2, 0.0) == [(END,), (A, A, END)]
    ranked = [h.ranked for h in result.finished[0]]
    assert ranked == sorted(ranked, reverse=True)


def drawn(model: TableLM, n: int = 400, **filters) -> set:
    """The tokens n seeded one-step draws took: with this many, every token kept (here at least
    1/6 of the mass each) shows up."""
    result = decoding.generate(model, np.zeros((n, 1), int), 1, sample=True, rng=0, **filters)
    return set(result.tokens[:, 0].tolist())


def test_top_k_keeps_exactly_k_tokens_ties_at_the_kth_place_go_to_the_lowest_id_as_argmax():
    """Logits tied at the 3rd place (ids 2, 4, 5): top_k=3 keeps ids 1, 3 and 2 (HuggingFace
    keeps all five); tied at the top, top_k=1 keeps greedy's argmax, the lower id."""
    model = TableLM({(): [1, 3, 2, 3, 2, 2]}, n_vocab=6)
    assert drawn(model, top_k=3) == {1, 2, 3}
    assert drawn(model) == set(range(6))                             # unfiltered: all six
    tied_top = TableLM({(): [2, 4, 4]})
    greedy = decoding.generate(tied_top, np.zeros((1, 1), int), 1).tokens[0, 0]
    assert drawn(tied_top, top_k=1) == {greedy} == {1}


def test_top_p_keeps_a_token_while_the_mass_ranked_above_it_is_below_p_ties_by_id():
    """Four equally likely tokens, 1/4 each (exact in binary): the mass above the j-th is j/4, so
    top_p=0.5 keeps ids 0 and 1 (their mass reaches p exactly) and top_p=0.75 ids 0 to 2."""
    model = TableLM({(): [1, 1, 1, 1]}, n_vocab=4)
    assert drawn(model, top_p=0.5) == {0, 1}
    assert drawn(model, top_p=0.75) == {0, 1, 2}
    assert drawn(model, top_p=0.76) == {0, 1, 2, 3}
