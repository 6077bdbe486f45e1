"""Tests for code/lecture06/city_lab.py: the city language's exact probabilities, its bound, its data."""
import doctest
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "code" / "lecture06"))
import city_lab as cl  # noqa: E402


@pytest.fixture(scope="module")
def big_sample():
    """10,000 windows (320,000 targets) with their true distributions, from a seed of the tests' own."""
    return cl.sample(10000, np.random.default_rng(12345), with_distributions=True)


# ---------------------------------------------------------------------------------------------------
# An independent reading of the grammar in city_lab's docstring, written sentence by sentence rather
# than as a coroutine: the probability of each target of a window, straight from the docstring's numbers.
# ---------------------------------------------------------------------------------------------------
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
            name = read(lambda w: 1 / 6 if w in cl.NAMES else 0.0)
            pronoun = "she" if name in ("anna", "maria", "sofia") else "he"
            read_exactly("lives", "in")
            home = read(lambda w: 1 / 8 if w in cl.CITIES else 0.0)
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
                                  (0.12 if w in cl.WEATHER else 0.0))
                    if second == "in":
                        read_exactly(cl.COUNTRIES[cl.CITIES.index(here)])
                    else:
                        weather[here] = second
                elif at_home:
                    read_exactly("travels", "from", home, "to")
                    here = read(lambda w: 1 / 7 if (w in cl.CITIES and w != home) else 0.0)
                    read_exactly("by")
                    transport = read(lambda w: 1 / 4 if w in cl.TRANSPORT else 0.0)
                else:
                    read_exactly("returns", "from", here, "to", home, "by", transport)
                    here = home
                read_exactly(".")
    except _WindowEnds:
        return np.array(probs)


# ---------------------------------------------------------------------------------------------------
# The true distribution
# ---------------------------------------------------------------------------------------------------
def test_vocabulary_and_encoding():
    assert cl.V == len(set(cl.VOCAB)) == 44
    assert cl.VOCAB[cl.BOS] == "<bos>" and cl.VOCAB[cl.EOS] == "<eos>"
    text = "<bos> anna lives in paris . she travels from paris to rome by train ."
    assert cl.decode(cl.encode(text)) == text
    assert cl.encode(text.split()).tolist() == cl.encode(text).tolist()


def test_distributions_sum_to_one_and_give_the_sampled_token_its_probability(big_sample):
    p_true, p_y, y = big_sample.p_true, big_sample.p_y, big_sample.y
    assert p_true.shape == y.shape + (cl.V,)
    assert np.max(np.abs(p_true.sum(axis=-1) - 1.0)) < 1e-12
    assert np.all(p_true >= 0.0)
    # the reported probability of each sampled token is, bit for bit, its entry in the full distribution
    assert np.array_equal(np.take_along_axis(p_true, y[..., None], axis=-1)[..., 0], p_y)
    assert np.all(p_y > 0.0)


def test_replaying_the_tokens_gives_the_same_distributions(big_sample):
    """The distribution depends on the tokens alone: replaying a window without the sampler's random
    numbers gives the sampler's distributions exactly (nothing hidden from the model)."""
    windows = np.concatenate([big_sample.x[:300], big_sample.y[:300, -1:]], axis=1)
    assert np.array_equal(cl.true_distributions(windows), big_sample.p_true[:300])


def test_probabilities_agree_with_an_independent_reading_of_the_grammar(big_sample):
    for b in range(500):
        words = cl.decode(np.append(big_sample.x[b], big_sample.y[b, -1])).split()
        np.testing.assert_allclose(reference_probabilities(words), big_sample.p_y[b], rtol=0, atol=1e-15)


def test_the_docstring_example_is_a_sentence_of_the_language():
    example = cl.__doc__.split("For example")[1].split("::")[1].split("...")[0]
    words = example.split()
    probs = cl.true_distributions(cl.encode(words))[0]
    assert np.all(probs[np.arange(len(words) - 1), cl.encode(words[1:])] > 0)


def test_deterministic_tokens_have_probability_exactly_one(big_sample):
    p_true, p_y = big_sample.p_true, big_sample.p_y
    certain = p_true.max(axis=-1) == 1.0
    assert np.array_equal(p_y == 1.0, certain)          # p(y) = 1 exactly where the distribution is one-hot
    assert np.all(p_true.max(axis=-1)[~certain] <= 0.6)  # and every other target is genuinely random
    assert 0.5 < certain.mean() < 0.8
    # some of them by name: "lives" after the opening name, "in" after "lives"
    after_name = np.isin(big_sample.x, cl.encode(cl.NAMES)) & (np.roll(big_sample.x, 1, axis=1) == cl.BOS)
    assert np.all(p_y[after_name] == 1.0) and np.all(big_sample.y[after_name] == cl.TOKEN_ID["lives"])


def test_long_range_dependencies():
    def dist(text):
        return dict(zip(cl.VOCAB, cl.next_token_distribution(text)))

    opening = "<bos> anna lives in paris ."
    assert dist(opening + " she travels from")["paris"] == 1.0               # the home city recurs
    to = dist(opening + " she travels from paris to")
    assert to["paris"] == 0.0 and all(to[c] == 1 / 7 for c in cl.CITIES if c != "paris")
    trip = opening + " she travels from paris to rome by bus ."
    start = dist(trip)
    assert start["anna"] == start["she"] == 0.25 and start["he"] == 0.0       # the subject matches anna
    assert dist(trip + " rome is in italy . anna")["returns"] == 1.0           # a trip is under way
    assert dist(trip + " anna returns from rome to paris by")["bus"] == 1.0    # the way back mirrors it
    said = "<bos> anna lives in paris . paris is rainy . she travels from paris to rome by bus ."
    again = dist(said + " she returns from rome to paris by bus . paris is")
    assert again["rainy"] == 0.6 and again["sunny"] == 0.0 and again["in"] == 0.4  # the weather is repeated
    next_story = dist("<bos> anna lives in paris . <eos> <bos> omar lives in rome .")
    assert next_story["anna"] == next_story["paris"] == 0.0 and next_story["omar"] == 0.3  # a new story


def _chi_square(observed, expected):
    """Chi-square statistic and degrees of freedom of count tables (groups x V), ignoring groups with
    fewer than 50 draws; each group's cells of probability 0 must be empty and are left out."""
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

    1. Exact prefixes of up to 8 tokens: every window that shares a prefix reports the same distribution
       after it (a conditional distribution is a function of the prefix), and the tokens drawn after the
       prefix follow that distribution.
    2. Every position, grouped by its distribution: the tokens drawn follow it.
    The seed is fixed, so the test is deterministic; |z| < 4 on the Wilson-Hilferty normal approximation
    of the chi-square distribution.
    """
    x, y, p_true = big_sample.x, big_sample.y, big_sample.p_true
    chi2_total, dof_total, n_prefixes = 0.0, 0, 0
    for t in range(8):
        _, first, group = np.unique(x[:, :t + 1], axis=0, return_index=True, return_inverse=True)
        group = group.ravel()
        assert np.array_equal(p_true[:, t], p_true[first[group], t])  # same prefix, same distribution
        observed = np.zeros((len(first), cl.V))
        np.add.at(observed, (group, y[:, t]), 1)
        chi2, dof, groups = _chi_square(observed, observed.sum(axis=1, keepdims=True) * p_true[first, t])
        chi2_total, dof_total, n_prefixes = chi2_total + chi2, dof_total + dof, n_prefixes + groups

    # group the positions by distribution: a random projection names each one (fast), and the
    # array_equal below proves that no two different distributions got the same name
    flat_p, flat_y = p_true.reshape(-1, cl.V), y.ravel()
    _, first, group = np.unique(flat_p @ np.random.default_rng(0).random(cl.V),
                                return_index=True, return_inverse=True)
    assert np.array_equal(flat_p, flat_p[first[group]])
    observed = np.zeros((len(first), cl.V))
    np.add.at(observed, (group, flat_y), 1)
    chi2, dof, _ = _chi_square(observed, observed.sum(axis=1, keepdims=True) * flat_p[first])
    chi2_total, dof_total = chi2_total + chi2, dof_total + dof

    z = ((chi2_total / dof_total) ** (1 / 3) - (1 - 2 / (9 * dof_total))) / math.sqrt(2 / (9 * dof_total))
    assert n_prefixes > 100 and dof_total > 500
    assert abs(z) < 4, f"chi-square {chi2_total:.0f} on {dof_total} degrees of freedom (z = {z:.2f})"


# ---------------------------------------------------------------------------------------------------
# Test set, bound, training batches
# ---------------------------------------------------------------------------------------------------
def test_lower_bound_recomputed_three_ways():
    test = cl.test_set()
    bound = cl.lower_bound()
    # from the full distributions of the replayed windows (no use of the sampler's probabilities)
    windows = np.concatenate([test.x, test.y[:, -1:]], axis=1)
    replayed = cl.true_distributions(windows)
    from_distributions = -np.log(np.take_along_axis(replayed, test.y[..., None], axis=-1)).mean()
    # from the independent reading of the grammar
    from_reference = -np.mean([np.log(reference_probabilities(cl.decode(w).split())) for w in windows])
    assert abs(bound - from_distributions) < 1e-12
    assert abs(bound - from_reference) < 1e-12
    assert test.y.shape == (cl.N_TEST, cl.SEQ_LEN) == (256, 32)


def test_docstring_numbers():
    """The module docstring states the bound and the deterministic fraction as doctests: rerun them."""
    assert doctest.testmod(cl, verbose=False).failed == 0


def test_test_set_never_changes():
    a, b = cl.test_set(), cl.test_set()
    assert a is b
    rebuilt = cl.sample(cl.N_TEST, np.random.default_rng([cl.TEST_SEED, 0]), with_distributions=True)
    for field in ("x", "y", "p_y", "p_true"):
        assert np.array_equal(getattr(a, field), getattr(rebuilt, field))
    # pinned: the same windows on every machine and every run
    assert cl.decode(a.x[0, :8]) == "<bos> paul lives in paris . paris is"
    with pytest.raises(ValueError):
        a.x[0, 0] = 1  # read-only, so that no script can change it for the others


def test_training_batches_depend_on_the_seed_and_never_repeat():
    first = next(cl.training_batches(seed=0, batch_size=8))
    again = next(cl.training_batches(seed=0, batch_size=8))
    other = next(cl.training_batches(seed=1, batch_size=8))
    assert first.x.shape == first.y.shape == (8, cl.SEQ_LEN)
    assert np.array_equal(first.x, again.x) and np.array_equal(first.p_y, again.p_y)
    assert not np.array_equal(first.x, other.x)
    stream = cl.training_batches(seed=0, batch_size=8)
    assert not np.array_equal(next(stream).x, next(stream).x)
    # the caller's seed never reproduces the test set, not even the test set's own seed
    clash = next(cl.training_batches(seed=cl.TEST_SEED, batch_size=cl.N_TEST))
    assert not np.array_equal(clash.x, cl.test_set().x)
    assert np.all(first.x[:, 0] == cl.BOS) and np.array_equal(first.x[:, 1:], first.y[:, :-1])


# ---------------------------------------------------------------------------------------------------
# Scoring models
# ---------------------------------------------------------------------------------------------------
def test_excess_of_the_true_model_is_zero_and_of_the_uniform_model_is_log_v():
    test = cl.test_set()
    with np.errstate(divide="ignore"):
        assert abs(cl.test_excess_mnats(np.log(test.p_true))) < 1e-9
    uniform = np.full(test.y.shape + (cl.V,), -math.log(cl.V))
    expected = 1000 * (math.log(cl.V) - cl.lower_bound())
    assert cl.test_excess_mnats(uniform) == pytest.approx(expected, abs=1e-9)


def test_baselines_without_attention_stay_far_above_the_bound():
    excess = cl.baseline_excess_mnats()
    assert excess["unigram"] > excess["bigram"] > 500  # the bigram model misses the long-range tokens
    unigram, bigram = cl.ngram_tables()
    assert np.allclose(np.exp(unigram).sum(), 1) and np.allclose(np.exp(bigram).sum(axis=1), 1)


# ---------------------------------------------------------------------------------------------------
# Clear errors
# ---------------------------------------------------------------------------------------------------
def test_bad_input_gets_a_clear_error():
    with pytest.raises(ValueError, match="unknown token"):
        cl.encode("<bos> anna lives in Paris .")
    with pytest.raises(ValueError, match="start with <bos>"):
        cl.true_distributions(cl.encode("anna lives in paris ."))
    with pytest.raises(ValueError, match="'he' cannot follow"):
        cl.true_distributions(cl.encode("<bos> anna lives in paris . he"))
    with pytest.raises(ValueError, match="integer token ids"):
        cl.true_distributions(np.zeros((2, 5)))
    with pytest.raises(ValueError, match=r"\[0, 44\)"):
        cl.true_distributions([0, 99])
    with pytest.raises(ValueError, match="n_windows >= 1"):
        cl.sample(0, 0)
    test = cl.test_set()
    with pytest.raises(ValueError, match="needs"):
        cl.test_excess_mnats(np.zeros((8, cl.SEQ_LEN, cl.V)))
    with pytest.raises(ValueError, match="log_softmax"):
        cl.test_excess_mnats(np.zeros(test.y.shape + (cl.V,)))  # raw logits, not log-probabilities
    with pytest.raises(ValueError, match="nan"):
        cl.test_excess_mnats(np.full(test.y.shape + (cl.V,), np.nan))


# ---------------------------------------------------------------------------------------------------
# The training harness (tiny configurations, so the whole block runs in a few seconds)
# ---------------------------------------------------------------------------------------------------
TINY = dict(n_layers=1, n_embd=16, n_head=2, lr=1e-2, steps=20, eval_every=10)


def test_a_one_layer_model_trains_below_the_bigram_baseline():
    result = cl.run(dict(n_layers=1, n_embd=32, n_head=2, lr=3e-3, steps=150, eval_every=50))
    steps, train_excess, test_excess = zip(*result.curve)
    assert steps == (0, 50, 100, 150) and train_excess[0] is None and len(result.train_excess) == 150
    assert test_excess[0] > cl.baseline_excess_mnats()["unigram"]        # untrained: worse than unigram
    assert result.final_excess == test_excess[-1] < cl.baseline_excess_mnats()["bigram"]
    assert result.best_excess == min(test_excess)
    # every batch is fresh data, so the batch excess tracks the test excess
    assert abs(train_excess[-1] - test_excess[-1]) < 0.5 * test_excess[-1]
    assert result.train_excess[0] == pytest.approx(test_excess[0], rel=0.1)


def test_runs_are_deterministic_and_parallel_runs_equal_sequential_ones():
    torch = pytest.importorskip("torch")
    configs = [dict(TINY, seed=0), dict(TINY, seed=1), dict(TINY, seed=0)]
    threads = torch.get_num_threads()
    parallel = cl.train_many(configs, workers=2)
    sequential = cl.train_many(configs, workers=1)
    assert torch.get_num_threads() == threads  # train() restores the caller's thread count
    for p, s in zip(parallel, sequential):
        assert p.curve == s.curve and p.train_excess == s.train_excess  # bit for bit
    assert parallel[0].curve == parallel[2].curve
    assert parallel[0].curve != parallel[1].curve


def test_inits():
    torch_ref = pytest.importorskip("torch_ref")
    import torch
    for init in cl.INITS:
        model = cl.build_model(n_layers=2, n_embd=64, n_head=4, init=init, seed=3)
        assert all(p.dtype == torch.float32 for p in model.parameters())
        w = model.layers[0].ff.linear_in.weights.detach()                              # (64, 256)
        emb = model.token_embeddings.weights.detach()
        b = model.layers[0].ff.linear_in.bias.detach()
        if init == "xavier":  # U(±√(6/(fan_in + fan_out))): variance 2/(fan_in + fan_out)
            assert float(w.abs().max()) <= (6 / 320) ** 0.5 and float(w.var()) == pytest.approx(2 / 320, rel=0.1)
        elif init == "gpt2":
            assert float(w.std()) == pytest.approx(0.02, rel=0.1)
        else:  # PyTorch's default: U(±1/√fan_in), embeddings N(0, 1)
            assert float(w.abs().max()) <= 1 / 8 and float(w.var()) == pytest.approx(1 / 192, rel=0.1)
        assert float(emb.std()) == pytest.approx(1.0 if init == "default" else 0.02, rel=0.1)
        assert (float(b.abs().max()) == 0.0) == (init != "default")
    # the same seed gives the same model; Pre-LN ends with a final LayerNorm (GPT-2's ln_f), Post-LN does not
    a, b = cl.build_model(n_layers=2, seed=5), cl.build_model(n_layers=2, seed=5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert isinstance(a.ln, torch_ref.LayerNorm) and cl.build_model(n_layers=2, pre_ln=False).ln is None


def test_learning_rate_schedules():
    f = cl._lr_factor
    assert [f(s, 10, 4, "constant") for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert f(0, 10, 0, "constant") == 1.0
    assert f(4, 10, 4, "linear") == 1.0 and f(7, 10, 4, "linear") == 0.5
    assert f(2, 10, 0, "cosine") == pytest.approx(0.5 + 0.5 * math.cos(0.2 * math.pi))
    assert f(2, 10, 0, "cosine") + f(8, 10, 0, "cosine") == pytest.approx(1.0)  # symmetric about the middle


def test_checkpoints_and_their_average():
    import torch
    model = cl.build_model(n_layers=1, n_embd=16, n_head=2)
    result = cl.train(model, steps=20, lr=1e-2, eval_every=10, checkpoint_every=5)
    assert [step for step, _ in result.checkpoints] == [5, 10, 15, 20]
    last = result.checkpoints[-1][1]
    assert all(torch.equal(last[k], v) for k, v in model.state_dict().items())
    first = result.checkpoints[0][1]
    mean = cl.average_state_dicts([first, last])
    assert all(torch.allclose(mean[k], (first[k] + last[k]) / 2) for k in first)
    model.load_state_dict(last)
    assert cl.evaluate(model) == result.final_excess


def test_harness_bad_input_gets_a_clear_error():
    with pytest.raises(ValueError, match="init must be one of"):
        cl.build_model(init="he")
    with pytest.raises(ValueError, match="multiple of n_head"):
        cl.build_model(n_embd=30, n_head=4)
    model = cl.build_model(n_layers=1, n_embd=16, n_head=2)
    with pytest.raises(ValueError, match="schedule must be one of"):
        cl.train(model, schedule="step")
    with pytest.raises(ValueError, match="warmup <= steps"):
        cl.train(model, steps=10, warmup=20)
    with pytest.raises(ValueError, match="unknown run setting"):
        cl.run(dict(n_layer=2))
    with pytest.raises(ValueError, match="at least one"):
        cl.average_state_dicts([])


def test_train_many_after_the_parent_used_several_threads_does_not_hang():
    """A forked worker that went back to the parent's thread count hung in OpenMP sending its results home."""
    import subprocess
    import sys
    from conftest import LECTURE06
    program = ("import sys; sys.path.insert(0, %r)\n"
               "import torch; torch.set_num_threads(2); a = torch.randn(256, 256)\n"
               "for _ in range(10): a @ a\n"
               "import city_lab\n"
               "cfg = dict(n_layers=1, n_embd=16, n_head=2, steps=4, eval_every=2, checkpoint_every=2)\n"
               "runs = city_lab.train_many([dict(cfg, seed=0), dict(cfg, seed=1)], workers=2)\n"
               "print(len(runs))\n") % LECTURE06
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "2"
