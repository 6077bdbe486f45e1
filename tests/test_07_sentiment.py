"""Script 07 (notes §9.3, §2.4, exercise 12): every claim of the notes it serves.

What every trained model must show is asserted at seeds 0, 1, 2 (make test); the count of "then
'but'" over seeds 0-9 (make seeds). Transformers trained STEPS Adam steps;
sentiment_train.train_many keeps them, so each is trained once per process. Margins are asserted
well above what other float kernels change: OPENBLAS_CORETYPE=Sandybridge against Haswell moves a
trained model's logits by up to 1e-4 and its attention by 1e-5.
"""
import re

import numpy as np
import pytest

from lecture06 import common, sentiment_train

from conftest import load_script

SEEDS = (0, 1, 2)   # Part 2's seeds in the default run; none was chosen to pass


@pytest.fixture(scope="module")
def sentiment():
    return load_script("07_sentiment")


@pytest.fixture(scope="module")
def results(sentiment):
    return sentiment.accuracy(SEEDS, sentiment.STEPS)


@pytest.fixture(scope="module")
def attention(sentiment):
    return sentiment.attention_over_seeds(SEEDS, sentiment.STEPS)


def test_parity_with_pytorch_S9_3_a(sentiment):
    """The notes quote 2.2e-16, seed 0's largest difference over the 20 steps: 2.2e-16 here on this
    CPU's kernels (AVX2, MKL) and on the generic ones (ATEN_CPU_CAPABILITY=default,
    OPENBLAS_CORETYPE=Sandybridge, MKL_CBWR=COMPATIBLE), at most 2 ulps of a loss near 1 at every
    step. Asserted at 1e-15, about 4 ulps. At other seeds Adam amplifies the rounding over the steps
    (seed 1: 81 ulps, 2.3e-15, at step 20), so the bound is the notes' seed's, not every seed's."""
    r = sentiment.parity()
    assert len(r["ours"]) == len(r["torch"]) == 20
    assert r["max_difference"] <= 1e-15
    assert r["ours"][-1] < r["ours"][0] - 0.05   # it really trains, dropout on


def test_no_positions_contrast_exactly_half_S9_3_b_Ex12(sentiment, results):
    for r in results["Transformer, no positions"]:
        # a pair's logits agree to rounding: identical predictions
        assert r["pair_difference"] <= 1e-12
        assert r["contrast"] == 0.5
        # no sentence so close to 0 that rounding could split a pair
        assert r["undecided"] > 1e-6
    assert common.holds(results["claims"]["blind_pairs_equal"]) == len(SEEDS)


def test_negation_without_positions_Ex12(sentiment, results):
    for r in results["Transformer, no positions"]:
        assert r["negation"] == 1.0 and r["margin"]["negation"] > 0.5


def test_positions_solve_contrast_S9_3_c(sentiment, results):
    for r in results["Transformer, learned positions"]:
        assert r["contrast"] == 1.0 and r["margin"]["contrast"] > 1.0
        assert r["pair_difference"] > 1.0
    assert common.holds(results["claims"]["positions_contrast"]) == len(SEEDS)


def test_bag_of_words_fails_negation_and_contrast(results):
    r = results["bag-of-words"]
    assert r["negation"] < 0.6 and r["contrast"] < 0.6
    assert r["pair_difference"] == 0.0   # the same counts, the same score
    assert r["plain"] > 0.9              # it is a working baseline on what it can read


def test_attention_most_on_position_8_S9_3_d(sentiment, attention):
    for r in attention["per_seed"]:
        assert r["words"][8] == "bad" and r["words"][4] == "but"
        assert np.isclose(r["received"].sum(), 1.0)
        assert r["argmax"] == 8
        assert r["prediction"] == r["label"] == 0
    # first by more than kernels move it
    assert min(attention["claims"]["most_on_deciding"]) > 0.02
    assert min(attention["claims"]["correct"]) > 1.0


def received_by_hand(sentiment, parameters: dict, sentence: str) -> np.ndarray:
    """The weight each position of `sentence` receives, averaged over the heads and the queries,
    recomputed in numpy from a trained model's parameters: embeddings, ln_1, the q and k
    projections, softmax(q kᵀ/√Dh) per head. Nothing of transformer.py or the script's ranking."""
    from lecture05 import reviews
    ids = [reviews.VOCAB.index(word) for word in sentence.split()]
    p = {name.removeprefix("layer."): value for name, value in parameters.items()}
    x = p["token_embeddings.weights"][ids] + p["position_embeddings.weights"][:len(ids)]
    centred = x - x.mean(axis=-1, keepdims=True)
    x = centred / np.sqrt((centred ** 2).mean(axis=-1, keepdims=True) + 1e-5)
    x = x * p["ln_1.weights"] + p["ln_1.bias"]                                   # (S, D)
    heads, head_dim = sentiment_train.N_HEAD, sentiment_train.N_EMBD // sentiment_train.N_HEAD

    def split(name):   # (S, D) -> (h, S, Dh)
        y = x @ p[f"attention.{name}.weights"] + p[f"attention.{name}.bias"]
        return y.reshape(len(ids), heads, head_dim).transpose(1, 0, 2)

    scores = split("q_projection") @ split("k_projection").transpose(0, 2, 1) / np.sqrt(head_dim)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)                               # (h, S, S)
    return weights.mean(axis=(0, 1))


def but_second_by_hand(sentiment, seeds) -> list:
    """At each seed, whether exactly one position receives more than 'but' (position 4), from the
    numpy recomputation of the trained model's attention (train_many keeps the models)."""
    from lecture05 import reviews
    trained = sentiment_train.train_many(sentiment_train.transformer_runs(seeds, sentiment.STEPS,
                                                                          positions=(True,)))
    assert reviews.NOTES_SENTENCE.split()[4] == "but"
    return [int(np.sum(received_by_hand(sentiment, t["parameters"], reviews.NOTES_SENTENCE)
                       > received_by_hand(sentiment, t["parameters"],
                                          reviews.NOTES_SENTENCE)[4]) == 1) for t in trained]


def test_but_second_is_counted_as_the_attention_weights_show(sentiment, attention):
    """The script's count of "then 'but'" equals a count of our own from the weights; each seed's
    'received' matches the recomputation to rounding (amplified by no training: the same
    parameters)."""
    from lecture05 import reviews
    by_hand = but_second_by_hand(sentiment, SEEDS)
    assert common.holds(attention["claims"]["but_second"]) == sum(by_hand)
    assert [m > 0 for m in attention["claims"]["but_second"]] == [bool(b) for b in by_hand]
    trained = sentiment_train.train_many(sentiment_train.transformer_runs(SEEDS, sentiment.STEPS,
                                                                          positions=(True,)))
    for r, t in zip(attention["per_seed"], trained):
        expected = received_by_hand(sentiment, t["parameters"], reviews.NOTES_SENTENCE)
        assert np.abs(r["received"] - expected).max() < 1e-13


def test_margins_of_a_claim(sentiment):
    received = np.array([0.1, 0.5, 0.3, 0.1])
    assert sentiment.most_margin(received, 1) == pytest.approx(0.2)
    assert sentiment.most_margin(received, 2) == pytest.approx(-0.2)
    assert sentiment.second_margin(received, 2) == pytest.approx(0.2)
    assert sentiment.second_margin(received, 0) == pytest.approx(-0.2)


def test_bad_sentence_is_explained(sentiment):
    untrained = sentiment_train.SentimentTransformer(positions=True).eval()
    with pytest.raises(ValueError, match="not words of the review vocabulary"):
        sentiment.attention(untrained, sentence="the plot was superb")


def test_run_prints_every_part_and_draws(sentiment, results, tmp_path, capsys):
    from lecture06 import common
    common.main(sentiment.__doc__, sentiment.PARTS, ["--figures", str(tmp_path), "--seeds", "3"],
                seeds=sentiment.SEEDS)   # the fixtures' models, kept by sentiment_train
    out = capsys.readouterr().out
    for text in ("Part 1", "Part 2", "Part 3", "max difference over 20 steps"):
        assert text in out
    # counts on trained runs, held with a margin one seed that tips on another CPU cannot break
    for claim in ("with learned positions, contrast all correct", "gets the most attention"):
        held = re.search(re.escape(claim) + r": (\d) of 3 seeds", out)
        assert held and int(held.group(1)) >= 2, claim
    k = sum(but_second_by_hand(sentiment, SEEDS))
    assert f"position 4 ('but') gets the second most: {k} of 3 seeds" in out
    # words and integers on unmarked lines, the float kernels' digits on ⚙ lines
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert ("position, word 0 the 1 plot 2 was 3 good 4 but 5 the 6 acting 7 was 8 bad"
            in lines)
    # a trained Transformer's rows are marked whatever their margins (their digits may differ on
    # another CPU; the mark does not)
    for row in ("Transformer, learned positions ", "Transformer, no positions ", "0 ", "1 ", "2 "):
        assert any(line.startswith("⚙ " + row) for line in lines), row
        assert not any(line.startswith(row) for line in lines), row
    assert all(line.startswith("⚙") for line in lines if "e-16" in line or "0.394" in line)
    assert (tmp_path / "07_accuracy.png").exists() and (tmp_path / "07_attention.png").exists()
