"""Tests for code/lecture06/city_lab.py: the city
language's exact probabilities, its bound, its data."""
import doctest
import math
import warnings

import numpy as np
import pytest

from lecture06 import city_lab


@pytest.fixture(scope="module")
def big_sample():
    """10,000 windows (320,000 targets) with their true
    distributions, from a seed of the tests' own."""
    return city_lab.sample(10000, np.random.default_rng(12345), with_distributions=True)


# --------------------------------------------------------------------------------------------------
# An independent reading of the grammar in city_lab's docstring, written sentence by sentence rather
# than as a coroutine: the probability of each target
# of a window, straight from the docstring's numbers.
# --------------------------------------------------------------------------------------------------
class _WindowEnds(Exception):
    pass


def reference_probabilities(words):
    probs, cursor = [], [1]  # words[0] is <bos>

    def read(probability_of):
        if cursor[0] == len(words):
            raise _WindowEnds
        word = words[cursor[0]]
        cursor[0] += 1
        probs.append(probability_of(word))
        return word

    def read_exactly(*expected):
        for e in expected:
            read(lambda w: 1.0 if w == e else 0.0)

    try:
        while True:  # a story
            name = read(lambda w: 1 / 6 if w in city_lab.NAMES else 0.0)
            pronoun = "she" if name in ("anna", "maria", "sofia") else "he"
            read_exactly("lives", "in")
            home = read(lambda w: 1 / 8 if w in city_lab.CITIES else 0.0)
            read_exactly(".")
            here, transport, weather = home, None, {}
            while True:  # a sentence
                at_home = here == home
                p_subject, p_city = (0.3, 0.3) if at_home else (0.25, 0.5)
                first = read(lambda w: p_subject if w in (name, pronoun) else
                             p_city if w == here else 0.1 if (w == "<eos>" and at_home) else 0.0)
                if first == "<eos>":
                    read_exactly("<bos>")
                    break
                if first == here:
                    read_exactly("is")
                    second = read(lambda w: 0.4 if w == "in" else
                                  (0.6 if w == weather[here] else 0.0) if here in weather else
                                  (0.12 if w in city_lab.WEATHER else 0.0))
                    if second == "in":
                        read_exactly(city_lab.COUNTRIES[city_lab.CITIES.index(here)])
                    else:
                        weather[here] = second
                elif at_home:
                    read_exactly("travels", "from", home, "to")
                    here = read(lambda w: 1 / 7 if (w in city_lab.CITIES and w != home) else 0.0)
                    read_exactly("by")
                    transport = read(lambda w: 1 / 4 if w in city_lab.TRANSPORT else 0.0)
                else:
                    read_exactly("returns", "from", here, "to", home, "by", transport)
                    here = home
                read_exactly(".")
    except _WindowEnds:
        return np.array(probs)


# --------------------------------------------------------------------------------------------------
# The true distribution
# --------------------------------------------------------------------------------------------------
def test_vocabulary_and_encoding():
    assert city_lab.V == len(set(city_lab.VOCAB)) == 44
    assert city_lab.VOCAB[city_lab.BOS] == "<bos>" and city_lab.VOCAB[city_lab.EOS] == "<eos>"
    text = "<bos> anna lives in paris . she travels from paris to rome by train ."
    assert city_lab.decode(city_lab.encode(text)) == text
    assert city_lab.encode(text.split()).tolist() == city_lab.encode(text).tolist()


def test_distributions_sum_to_one_and_give_the_sampled_token_its_probability(big_sample):
    p_true, p_y, y = big_sample.p_true, big_sample.p_y, big_sample.y
    assert p_true.shape == y.shape + (city_lab.V,)
    assert np.max(np.abs(p_true.sum(axis=-1) - 1.0)) < 1e-12
    assert np.all(p_true >= 0.0)
    # the reported probability of each sampled token is,
    # bit for bit, its entry in the full distribution
    assert np.array_equal(np.take_along_axis(p_true, y[..., None], axis=-1)[..., 0], p_y)
    assert np.all(p_y > 0.0)


def test_replaying_the_tokens_gives_the_same_distributions(big_sample):
    """The distribution depends on the tokens alone: replaying a window without the sampler's random
    numbers gives the sampler's distributions exactly (nothing hidden from the model)."""
    windows = np.concatenate([big_sample.x[:300], big_sample.y[:300, -1:]], axis=1)
    assert np.array_equal(city_lab.true_distributions(windows), big_sample.p_true[:300])


def test_probabilities_agree_with_an_independent_reading_of_the_grammar(big_sample):
    for b in range(500):
        words = city_lab.decode(np.append(big_sample.x[b], big_sample.y[b, -1])).split()
        np.testing.assert_allclose(reference_probabilities(words), big_sample.p_y[b], rtol=0,
                                   atol=1e-15)


def test_the_docstring_example_is_a_sentence_of_the_language():
    example = city_lab.__doc__.split("For example")[1].split("::")[1].split("...")[0]
    words = example.split()
    probs = city_lab.true_distributions(city_lab.encode(words))[0]
    assert np.all(probs[np.arange(len(words) - 1), city_lab.encode(words[1:])] > 0)


def test_deterministic_tokens_have_probability_exactly_one(big_sample):
    p_true, p_y = big_sample.p_true, big_sample.p_y
    certain = p_true.max(axis=-1) == 1.0
    assert np.array_equal(p_y == 1.0, certain)  # p(y) = 1 exactly where the distribution is one-hot
    # and every other target is genuinely random
    assert np.all(p_true.max(axis=-1)[~certain] <= 0.6)
    assert 0.5 < certain.mean() < 0.8
    # some of them by name: "lives" after the opening name, "in" after "lives"
    after_name = (np.isin(big_sample.x, city_lab.encode(city_lab.NAMES))
                  & (np.roll(big_sample.x, 1, axis=1) == city_lab.BOS))
    assert (np.all(p_y[after_name] == 1.0)
            and np.all(big_sample.y[after_name] == city_lab.TOKEN_ID["lives"]))


def test_long_range_dependencies():
    def dist(text):
        return dict(zip(city_lab.VOCAB, city_lab.next_token_distribution(text)))

    opening = "<bos> anna lives in paris ."
    assert dist(opening + " she travels from")["paris"] == 1.0               # the home city recurs
    to = dist(opening + " she travels from paris to")
    assert to["paris"] == 0.0 and all(to[c] == 1 / 7 for c in city_lab.CITIES if c != "paris")
    trip = opening + " she travels from paris to rome by bus ."
    start = dist(trip)
    assert start["anna"] == start["she"] == 0.25 and start["he"] == 0.0  # the subject matches anna
    assert dist(trip + " rome is in italy . anna")["returns"] == 1.0           # a trip is under way
    # the way back mirrors it
    assert dist(trip + " anna returns from rome to paris by")["bus"] == 1.0
    said = "<bos> anna lives in paris . paris is rainy . she travels from paris to rome by bus ."
    again = dist(said + " she returns from rome to paris by bus . paris is")
    # the weather is repeated
    assert again["rainy"] == 0.6 and again["sunny"] == 0.0 and again["in"] == 0.4
    next_story = dist("<bos> anna lives in paris . <eos> <bos> omar lives in rome .")
    # a new story
    assert next_story["anna"] == next_story["paris"] == 0.0 and next_story["omar"] == 0.3


def _chi_square(observed, expected):
    """Chi-square statistic and degrees of freedom of count tables (groups x V), ignoring groups
    with fewer than 50 draws; each group's cells of probability 0 must be empty and are left out."""
    n = observed.sum(axis=1)
    keep = n >= 50
    observed, expected = observed[keep], expected[keep]
    assert np.all(observed[expected == 0] == 0)
    cells = expected > 0
    chi2 = float((((observed - expected) ** 2)[cells] / expected[cells]).sum())
    dof = int((cells.sum(axis=1) - 1).sum())
    return chi2, dof, int(keep.sum())


def test_sampled_frequencies_match_the_true_distribution(big_sample):
    """Chi-square test of the sampler against the distributions it reports.

    1. Exact prefixes of up to 8 tokens: every window that shares a prefix reports the same
       distribution after it (a conditional distribution is a function of the prefix), and the
       tokens drawn after the prefix follow that distribution.
    2. Every position, grouped by its distribution: the tokens drawn follow it.
    The seed is fixed, so the test is deterministic; |z| < 4 on the Wilson-Hilferty normal
    approximation of the chi-square distribution.
    """
    x, y, p_true = big_sample.x, big_sample.y, big_sample.p_true
    chi2_total, dof_total, n_prefixes = 0.0, 0, 0
    for t in range(8):
        _, first, group = np.unique(x[:, :t + 1], axis=0, return_index=True, return_inverse=True)
        group = group.ravel()
        # same prefix, same distribution
        assert np.array_equal(p_true[:, t], p_true[first[group], t])
        observed = np.zeros((len(first), city_lab.V))
        np.add.at(observed, (group, y[:, t]), 1)
        chi2, dof, groups = _chi_square(observed,
                                        observed.sum(axis=1, keepdims=True) * p_true[first, t])
        chi2_total, dof_total, n_prefixes = chi2_total + chi2, dof_total + dof, n_prefixes + groups

    # group the positions by distribution: a random projection names each one (fast), and the
    # array_equal below proves that no two different distributions got the same name
    flat_p, flat_y = p_true.reshape(-1, city_lab.V), y.ravel()
    _, first, group = np.unique(flat_p @ np.random.default_rng(0).random(city_lab.V),
                                return_index=True, return_inverse=True)
    assert np.array_equal(flat_p, flat_p[first[group]])
    observed = np.zeros((len(first), city_lab.V))
    np.add.at(observed, (group, flat_y), 1)
    chi2, dof, _ = _chi_square(observed, observed.sum(axis=1, keepdims=True) * flat_p[first])
    chi2_total, dof_total = chi2_total + chi2, dof_total + dof

    z = (((chi2_total / dof_total) ** (1 / 3) - (1 - 2 / (9 * dof_total)))
         / math.sqrt(2 / (9 * dof_total)))
    assert n_prefixes > 100 and dof_total > 500
    assert abs(z) < 4, \
        f"chi-square {chi2_total:.0f} on {dof_total} degrees of freedom (z = {z:.2f})"


# --------------------------------------------------------------------------------------------------
# Test set, bound, training batches
# --------------------------------------------------------------------------------------------------
def test_lower_bound_recomputed_three_ways():
    test = city_lab.test_set()
    bound = city_lab.lower_bound()
    # from the full distributions of the replayed windows (no use of the sampler's probabilities)
    windows = np.concatenate([test.x, test.y[:, -1:]], axis=1)
    replayed = city_lab.true_distributions(windows)
    from_distributions = -np.log(np.take_along_axis(replayed, test.y[..., None], axis=-1)).mean()
    # from the independent reading of the grammar
    from_reference = -np.mean([np.log(reference_probabilities(city_lab.decode(w).split()))
                               for w in windows])
    assert abs(bound - from_distributions) < 1e-12
    assert abs(bound - from_reference) < 1e-12
    assert test.y.shape == (city_lab.N_TEST, city_lab.SEQ_LEN) == (256, 32)


def test_docstring_numbers():
    """The module docstring states the bound and the
    deterministic fraction as doctests: rerun them."""
    assert doctest.testmod(city_lab, verbose=False).failed == 0


def test_test_set_never_changes():
    a, b = city_lab.test_set(), city_lab.test_set()
    assert a is b
    rebuilt = city_lab.sample(city_lab.N_TEST, np.random.default_rng([city_lab.TEST_SEED, 0]),
                              with_distributions=True)
    for field in ("x", "y", "p_y", "p_true"):
        assert np.array_equal(getattr(a, field), getattr(rebuilt, field))
    # pinned: the same windows on every machine and every run
    assert city_lab.decode(a.x[0, :8]) == "<bos> paul lives in paris . paris is"
    with pytest.raises(ValueError):
        a.x[0, 0] = 1  # read-only, so that no script can change it for the others


def test_training_batches_depend_on_the_seed_and_never_repeat():
    first = next(city_lab.training_batches(seed=0, batch_size=8))
    again = next(city_lab.training_batches(seed=0, batch_size=8))
    other = next(city_lab.training_batches(seed=1, batch_size=8))
    assert first.x.shape == first.y.shape == (8, city_lab.SEQ_LEN)
    assert np.array_equal(first.x, again.x) and np.array_equal(first.p_y, again.p_y)
    assert not np.array_equal(first.x, other.x)
    stream = city_lab.training_batches(seed=0, batch_size=8)
    assert not np.array_equal(next(stream).x, next(stream).x)
    # the caller's seed never reproduces the test set, not even the test set's own seed
    clash = next(city_lab.training_batches(seed=city_lab.TEST_SEED, batch_size=city_lab.N_TEST))
    assert not np.array_equal(clash.x, city_lab.test_set().x)
    assert np.all(first.x[:, 0] == city_lab.BOS) and np.array_equal(first.x[:, 1:], first.y[:, :-1])


# --------------------------------------------------------------------------------------------------
# Scoring models
# --------------------------------------------------------------------------------------------------
def test_excess_of_the_true_model_is_zero_and_of_the_uniform_model_is_log_v():
    test = city_lab.test_set()
    with np.errstate(divide="ignore"):
        assert abs(city_lab.test_excess_mnats(np.log(test.p_true))) < 1e-9
    uniform = np.full(test.y.shape + (city_lab.V,), -math.log(city_lab.V))
    expected = 1000 * (math.log(city_lab.V) - city_lab.lower_bound())
    assert city_lab.test_excess_mnats(uniform) == pytest.approx(expected, abs=1e-9)


def test_baselines_without_attention_stay_far_above_the_bound():
    excess = city_lab.baseline_excess_mnats()
    # the bigram model misses the long-range tokens
    assert excess["unigram"] > excess["bigram"] > 500
    unigram, bigram = city_lab.ngram_tables()
    assert np.allclose(np.exp(unigram).sum(), 1) and np.allclose(np.exp(bigram).sum(axis=1), 1)


# --------------------------------------------------------------------------------------------------
# Scoring text against the language
# --------------------------------------------------------------------------------------------------
def _window(text):
    return city_lab.encode(text)[None]


def test_scoring_counts_what_the_language_allows_with_its_exact_probabilities():
    text = ("<bos> anna lives in paris . she travels from paris to rome by bus . "
            "she returns from rome to paris by bus .")
    window = _window(text)
    r = city_lab.score_against_the_language(window, prompt_len=6)
    # (L - 1, V): p of token t at row t - 1
    p = city_lab.true_distributions(window)[0]
    expected = [math.log(p[t - 1, window[0, t]]) for t in range(6, window.shape[1])]
    assert (r["scored"] == len(expected) and r["forbidden"] == 0 and r["clean"] == 1
            and r["allowed"] == 1.0)
    assert r["log_p_per_token"] == pytest.approx(np.mean(expected), rel=1e-12)
    assert r["sentences"] == 2 and r["repeated"] == 0.0


def test_scoring_stops_at_the_first_forbidden_token():
    # DEST is never HOME
    bad = _window("<bos> anna lives in paris . she travels from paris to paris by bus .")
    r = city_lab.score_against_the_language(bad, prompt_len=6)
    # she travels from paris to [paris]
    assert r["scored"] == 6 and r["forbidden"] == 1 and r["clean"] == 0
    assert r["allowed"] == pytest.approx(5 / 6, rel=1e-15)
    p = city_lab.true_distributions(
        _window("<bos> anna lives in paris . she travels from paris to"))[0]
    allowed = city_lab.encode("she travels from paris to")
    assert r["log_p_per_token"] == pytest.approx(np.mean(np.log(p[np.arange(5, 10), allowed])),
                                                 rel=1e-12)
    assert city_lab.first_forbidden(bad[0], 6) == 11
    assert city_lab.marked_continuation(bad[0], 6) == "she travels from paris to [paris ✗] …"
    derails_at_once = city_lab.score_against_the_language(
        _window("<bos> anna lives in paris . is"), prompt_len=6)
    assert derails_at_once["forbidden"] == derails_at_once["scored"] == 1
    assert math.isnan(derails_at_once["log_p_per_token"])
    again = city_lab.score_against_the_language(
        _window("<bos> anna lives in paris . paris is sunny . paris is sunny ."), 6)
    assert again["sentences"] == 2 and again["repeated"] == 0.5


def test_a_continuation_the_language_allows_is_shown_whole_and_unmarked():
    window = _window("<bos> anna lives in paris . paris is sunny .")[0]
    assert city_lab.first_forbidden(window, 6) is None
    assert city_lab.marked_continuation(window, 6) == "paris is sunny ."
    assert city_lab.complete_sentences(["paris", "is", "sunny", ".", "<eos>", "<bos>", "anna"]) \
        == [("paris", "is", "sunny", "."), ("<eos>", "<bos>")]


def test_the_languages_own_windows_score_their_known_probabilities():
    test = city_lab.test_set()
    windows = np.concatenate([test.x, test.y[:, -1:]], axis=1)[:16, :city_lab.SEQ_LEN]
    r = city_lab.score_against_the_language(windows, prompt_len=6)
    assert r["allowed"] == 1.0 and r["clean"] == 16 and r["scored"] == 16 * 26
    assert r["log_p_per_token"] == pytest.approx(np.log(test.p_y[:16, 5:31]).mean(), rel=1e-12)


# --------------------------------------------------------------------------------------------------
# Clear errors
# --------------------------------------------------------------------------------------------------
def test_bad_input_gets_a_clear_error():
    with pytest.raises(ValueError, match="unknown token"):
        city_lab.encode("<bos> anna lives in Paris .")
    with pytest.raises(ValueError, match="start with <bos>"):
        city_lab.true_distributions(city_lab.encode("anna lives in paris ."))
    with pytest.raises(ValueError, match="'he' cannot follow"):
        city_lab.true_distributions(city_lab.encode("<bos> anna lives in paris . he"))
    with pytest.raises(ValueError, match="integer token ids"):
        city_lab.true_distributions(np.zeros((2, 5)))
    with pytest.raises(ValueError, match=r"\[0, 44\)"):
        city_lab.true_distributions([0, 99])
    with pytest.raises(ValueError, match="n_windows >= 1"):
        city_lab.sample(0, 0)
    test = city_lab.test_set()
    with pytest.raises(ValueError, match="needs"):
        city_lab.test_excess_mnats(np.zeros((8, city_lab.SEQ_LEN, city_lab.V)))
    with pytest.raises(ValueError, match="log_softmax"):
        # raw logits, not log-probabilities
        city_lab.test_excess_mnats(np.zeros(test.y.shape + (city_lab.V,)))
    with pytest.raises(ValueError, match="log_softmax"), warnings.catch_warnings():
        warnings.simplefilter("error")   # large logits overflow exp: an error, not a warning
        city_lab.test_excess_mnats(np.full(test.y.shape + (city_lab.V,), 1000.0))
    with pytest.raises(ValueError, match="up to 0.002 away"):
        city_lab.test_excess_mnats(np.log(test.p_true + 1e-10) + 2e-3)
    with pytest.raises(ValueError, match="nan"):
        city_lab.test_excess_mnats(np.full(test.y.shape + (city_lab.V,), np.nan))
