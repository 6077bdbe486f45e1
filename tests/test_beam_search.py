"""The paper's decoding (notes §7.6; Vaswani et al. 2017 after Wu et al. 2016): beam search with a
length penalty, and top-k and nucleus (top-p) sampling beside temperature, on DecoderLM and
EncoderDecoder.

Beam search is checked against what it approximates: on a tiny model an exhaustive enumeration of
every continuation finds the best sequence, and a beam at least as wide as V^(T-1) must find exactly
it (score to 1e-12), without an end token and with one at three length penalties. Also: one beam
is greedy, the KV cache (its rows reordered by parent beam every step) changes nothing, the rows of
a batch are searched independently, every reported score is the model's log-probability of the
tokens, the stops at end_id and at source length + 50, and the sampling filters' limits (top_k = V
and top_p = 1 are plain sampling, top_k = 1 is greedy)."""
import itertools
import math

import numpy as np
import pytest

import transformer
from transformer import length_penalty

TOL = 1e-12


@pytest.fixture(autouse=True)
def _seed():
    transformer.set_seed(0)


def decoder_lm(V=5, seed=0, **kwargs):
    transformer.set_seed(seed)
    return transformer.DecoderLM(V, 8, 2, **(dict(n_positions=16, n_layers=2, p_dropout=0.1)
                                             | kwargs))


def encoder_decoder(V=5, seed=0, **kwargs):
    transformer.set_seed(seed)
    return transformer.EncoderDecoder(V, 8, 2, **(dict(n_layers=2, n_positions=64, p_dropout=0.1)
                                                  | kwargs))


PROMPT = np.array([[1, 2, 0], [3, 3, 4]])
SRC = np.array([[2, 3, 4, 1, 2], [4, 2, 3, 0, 0], [3, 0, 0, 0, 0]])
SRC_PAD = SRC == 0
MODELS = {"DecoderLM": decoder_lm, "EncoderDecoder": encoder_decoder}


def generate(model, max_new_tokens, inputs=None, pad=None, **kwargs):
    """model.generate on PROMPT (DecoderLM) or SRC, SRC_PAD (EncoderDecoder), or on the rows
    given."""
    if isinstance(model, transformer.EncoderDecoder):
        inputs, pad = (SRC, SRC_PAD) if inputs is None else (inputs, pad)
        return model.generate(inputs, pad, max_new_tokens, **kwargs)
    return model.generate(PROMPT if inputs is None else inputs, max_new_tokens, **kwargs)


def token_log_probs(model, row: int, continuations: np.ndarray) -> np.ndarray:
    """(N, T) continuations of input row `row` -> (N, T) the model's log p of each token given
    everything before it, every continuation in one teacher-forced pass."""
    model.eval()
    n = len(continuations)
    with transformer.no_grad():
        if isinstance(model, transformer.EncoderDecoder):
            logits = model(np.repeat(SRC[row:row + 1], n, 0), continuations,
                           np.repeat(SRC_PAD[row:row + 1], n, 0)).data
        else:
            prompt = np.repeat(PROMPT[row:row + 1], n, 0)
            full = model(np.concatenate([prompt, continuations], axis=1)).data
            logits = full[:, prompt.shape[1] - 1:-1]
    shifted = logits - logits.max(-1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return np.take_along_axis(log_p, continuations[..., None], axis=-1)[..., 0]


def rows_of(model):
    return len(SRC) if isinstance(model, transformer.EncoderDecoder) else len(PROMPT)


# ---- exact: a wide enough beam finds the best sequence of an exhaustive enumeration ----------
@pytest.mark.parametrize("name", list(MODELS))
def test_a_beam_of_v_to_the_t_minus_1_finds_the_best_of_all_v_to_the_t_continuations(name):
    V, T = 5, 4
    model = MODELS[name](V)
    every = np.array(list(itertools.product(range(V), repeat=T)))     # (V^T, T)
    result = generate(model, T, num_beams=V ** (T - 1))
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
@pytest.mark.parametrize("name", list(MODELS))
def test_with_an_end_token_the_wide_beam_finds_the_best_by_log_p_over_the_length_penalty(name,
                                                                                     alpha):
    V, T = 5, 4
    # models and end tokens chosen so that the penalty changes which length wins
    seed, end_id = (1, 4) if name == "DecoderLM" else (2, 3)
    model = MODELS[name](V, seed=seed)
    result = generate(model, T, num_beams=V ** (T - 1), end_id=end_id, pad_id=0,
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
@pytest.mark.parametrize("name", list(MODELS))
def test_one_beam_is_greedy_token_for_token(name):
    model = MODELS[name](V=7)
    greedy = generate(model, 9, end_id=6)
    for alpha in (0.0, 0.6):
        one = generate(model, 9, end_id=6, num_beams=1, length_penalty=alpha)
        np.testing.assert_array_equal(one.tokens, greedy.tokens)
        np.testing.assert_array_equal(one.logits, greedy.logits)
        np.testing.assert_array_equal(one.lengths, greedy.lengths)
    assert greedy.finished is None


@pytest.mark.parametrize("name", list(MODELS))
def test_every_score_is_the_models_log_probability_of_its_tokens(name):
    """Generation.scores and each finished hypothesis' score against one teacher-forced pass."""
    model = MODELS[name](V=7)
    for kwargs in (dict(), dict(sample=True, temperature=0.7, top_p=0.9, rng=3),
                   dict(num_beams=3, length_penalty=0.6)):
        result = generate(model, 8, end_id=6, **kwargs)
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


@pytest.mark.parametrize("name", list(MODELS))
def test_the_best_beam_is_at_least_as_likely_as_greedy_on_random_models(name):
    """Not a theorem (a beam can drop the greedy prefix and end lower); true on these models, whose
    rows all have the same length (no end token), so the sums compare directly."""
    gains = []
    for seed in range(4):
        model = MODELS[name](V=9, seed=seed)
        greedy = generate(model, 10)
        for k in (2, 4):
            gain = generate(model, 10, num_beams=k).scores - greedy.scores
            assert (gain >= -TOL).all()
            gains.extend(gain)
    assert max(gains) > 1e-6                            # somewhere strictly more likely: no tie


@pytest.mark.parametrize("end_id", [None, 6])
@pytest.mark.parametrize("name", list(MODELS))
def test_the_cached_search_equals_the_search_without_the_cache(name, end_id):
    model = MODELS[name](V=7)
    cached = generate(model, 10, num_beams=3, end_id=end_id, length_penalty=0.6)
    recomputed = generate(model, 10, num_beams=3, end_id=end_id, length_penalty=0.6,
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
@pytest.mark.parametrize("name", list(MODELS))
def test_the_rows_of_a_batch_are_searched_independently(name, end_id):
    """The encoder-decoder at its default limit, each row's source length + 50."""
    model = MODELS[name](V=7)
    limit = None if name == "EncoderDecoder" else 10
    batch = generate(model, limit, num_beams=3, end_id=end_id, length_penalty=0.6)
    for row in range(rows_of(model)):
        inputs = SRC if name == "EncoderDecoder" else PROMPT
        alone = generate(model, limit, inputs[row:row + 1], SRC_PAD[row:row + 1], num_beams=3,
                         end_id=end_id, length_penalty=0.6)
        length = batch.lengths[row]
        assert alone.lengths[0] == length
        np.testing.assert_array_equal(alone.tokens[0], batch.tokens[row, :length])
        assert abs(alone.scores[0] - batch.scores[row]) <= TOL


def test_beam_search_stops_at_end_id_pads_after_it_and_stops_by_source_length_plus_50():
    model = encoder_decoder(V=7)
    source_lengths = (~SRC_PAD).sum(1)                                   # 5, 3, 1
    free = model.generate(SRC, SRC_PAD, num_beams=3)                      # no end token
    np.testing.assert_array_equal(free.lengths, source_lengths + 50)     # each row's own limit
    assert free.n_forward == 55
    for pool, limit in zip(free.finished, source_lengths + 50):
        assert len(pool) == 3 and all(len(h.tokens) == limit for h in pool)
    stopped = model.generate(SRC, SRC_PAD, num_beams=3, end_id=6, pad_id=5)
    for row, length in enumerate(stopped.lengths):
        assert length <= source_lengths[row] + 50
        tokens = stopped.tokens[row]
        ends_with_end_id = tokens[length - 1] == 6
        assert ends_with_end_id or length == source_lengths[row] + 50
        assert (tokens[:length - 1] != 6).all() and (tokens[length:] == 5).all()
    assert stopped.n_forward < 55            # the search ended before the limit: the stopping rule


def test_with_the_cache_the_decoder_computes_beams_times_steps_positions_and_encodes_once():
    model = encoder_decoder(V=7)
    encoded = []
    encode = model.encode
    model.encode = lambda *args, **kwargs: encoded.append(1) or encode(*args, **kwargs)
    for k in (1, 2, 4):
        encoded.clear()
        result = model.generate(SRC, SRC_PAD, 12, num_beams=k)
        assert encoded == [1] and result.n_forward == 12
        assert result.positions_computed == k * 12
        without = model.generate(SRC, SRC_PAD, 12, num_beams=k, use_cache=False)
        assert without.positions_computed == k * 12 * 13 // 2
    lm = decoder_lm(V=7)
    assert lm.generate(PROMPT, 6, num_beams=4).positions_computed == 4 * (PROMPT.shape[1] + 5)


def test_kv_cache_reorder_takes_each_row_from_its_parent():
    model = decoder_lm(V=7).eval()
    cache = model.new_cache(5)
    with transformer.no_grad():
        model(PROMPT, cache=cache)
    before = [(c.kT.numpy().copy(), c.v.numpy().copy()) for c in cache]
    for c in cache:
        c.reorder(np.array([1, 1, 0]))
    for c, (kT, v) in zip(cache, before):
        np.testing.assert_array_equal(c.kT.numpy(), kT[[1, 1, 0]])
        np.testing.assert_array_equal(c.v.numpy(), v[[1, 1, 0]])
        assert c.length == PROMPT.shape[1]
    transformer.KVCache().reorder(np.array([0]))                        # empty: nothing to move


# ---- top-k and nucleus sampling ----------------------------------------------------------------
@pytest.mark.parametrize("name", list(MODELS))
def test_top_k_of_v_and_top_p_of_1_are_plain_sampling_and_top_k_of_1_is_greedy(name):
    V = 7
    model = MODELS[name](V=V)
    plain = generate(model, 12, sample=True, temperature=1.3, rng=5)
    for kwargs in (dict(top_k=V), dict(top_p=1.0), dict(top_k=V + 3, top_p=1.0)):
        filtered = generate(model, 12, sample=True, temperature=1.3, rng=5, **kwargs)
        np.testing.assert_array_equal(filtered.tokens, plain.tokens)
        np.testing.assert_array_equal(filtered.logits, plain.logits)
    greedy = generate(model, 12)
    for temperature in (0.5, 3.0):
        one = generate(model, 12, sample=True, temperature=temperature, rng=5, top_k=1)
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
    model = decoder_lm(V=V)
    result = model.generate(np.repeat(PROMPT[:1], n, 0), 1, sample=True, temperature=temperature,
                            rng=np.random.default_rng(0), top_k=top_k, top_p=top_p)
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
@pytest.mark.parametrize("name", list(MODELS))
def test_every_bad_decoding_argument_says_what_to_pass(name):
    model = MODELS[name]()
    who = f"{name}.generate: "
    for bad in (0, -2, 1.5, True, "4"):
        with pytest.raises(ValueError, match=rf"{who}num_beams must be an integer >= 1 \(the "
                                             r"hypotheses kept per row\), got .*; num_beams=1 "
                                             r"decodes greedily"):
            generate(model, 3, num_beams=bad)
    with pytest.raises(ValueError, match=rf"{who}num_beams=4 searches for the most likely text "
                                         r"and does not sample; pass sample=False for beam "
                                         r"search, or num_beams=1 to sample"):
        generate(model, 3, num_beams=4, sample=True, rng=0)
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match=rf"{who}top_k must be an integer >= 1 \(the largest "
                                             rf"logits kept\), got {bad}; top_k=None keeps every "
                                             r"token"):
            generate(model, 3, sample=True, rng=0, top_k=bad)
    for bad in (0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match=rf"{who}top_p must be in \(0, 1\] \(the probability "
                                             rf"the kept tokens reach\), got {bad}; top_p=1 keeps "
                                             r"every token"):
            generate(model, 3, sample=True, rng=0, top_p=bad)
    for bad in (-0.1, float("nan")):
        with pytest.raises(ValueError, match=rf"{who}length_penalty must be >= 0 \(α in lp\(Y\) = "
                                             rf"\(\(5 \+ \|Y\|\)/6\)\^α\), got {bad}; 0 ranks by "
                                             r"the sum of log-probabilities alone, 0.6 is the "
                                             r"paper's"):
            generate(model, 3, num_beams=2, length_penalty=bad)
    for kwargs in (dict(top_k=3), dict(top_p=0.9), dict(top_k=3, num_beams=2)):
        with pytest.raises(ValueError, match=rf"{who}top_k= and top_p= filter what sampling draws "
                                             r"from; pass sample=True with them"):
            generate(model, 3, **kwargs)
