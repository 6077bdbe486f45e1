"""The city language: a synthetic language whose true next-token distribution is known exactly.

Scripts 04 and 05 train small Transformers on it (notes §5.4, §7.3, §7.6). Because we know the true
distribution p, we know the best possible test cross-entropy too, and every experiment reports its
EXCESS over that bound in milli-nats per token (mnat/token). 0 means the model has learned the
language exactly.

Vocabulary (44 tokens, ids in this order; see VOCAB)
----------------------------------------------------
    specials   <bos> <eos>
    names      anna maria sofia (she) · paul omar lukas (he)
    pronouns   she he
    cities     paris rome berlin madrid vienna lisbon prague athens
    countries  france italy germany spain austria portugal czechia greece
               (in the order of the cities)
    weather    sunny rainy windy cloudy snowy
    transport  train plane bus car
    words      lives in travels returns from to by is .

Grammar
-------
A story introduces a person and their home city, then the person travels and talks about the cities.
Braces mark the random choices, with their probabilities (uniform where none is written). Every
other token is determined by the tokens before it::

    story   :=  {NAME} lives in {HOME} .  sentence sentence ...  until <eos>
    at home, the next sentence is
        {SUBJECT 0.6}  travels from HOME to {DEST} by {TRANSPORT} .    DEST: any city but HOME
        {HOME 0.3}     is  WEATHER-OR-COUNTRY .
        {<eos> 0.1}    <bos>                                            the next story starts
    away in DEST, the next sentence is
        {SUBJECT 0.5}  returns from DEST to HOME by TRANSPORT .         by the transport it went by
        {DEST 0.5}     is  WEATHER-OR-COUNTRY .
    SUBJECT            :=  NAME or its pronoun (she / he), half and half
    WEATHER-OR-COUNTRY :=  {0.6} the city's weather: the one said before in this story,
                               else {uniform}
                         | {0.4} in COUNTRY(city)

For example (running this file prints windows of the test set with the probability of each token)::

    <bos> paul lives in rome . he travels from rome to lisbon by bus . lisbon is windy . lisbon is
    in portugal . paul returns from lisbon to rome by bus . rome is sunny . <eos> <bos> maria lives
    in ...

The first token of a sentence decides which sentence it is. So the story's state (the name, the
home, where the person is, how they went, the weather said so far) is a function of the tokens seen,
and the probability this module reports is exactly p(next token | every token before it): nothing is
hidden.

Long-range dependencies, which a bigram model cannot see and attention can:
    * SUBJECT is the NAME of the story's first sentence, or its pronoun;
    * the home city recurs, after "travels from" and
      after "returns from DEST to"; DEST is never HOME;
    * after SUBJECT comes "travels" or "returns": it depends on whether a trip is under way;
    * a round trip returns from the city it went to, by the transport it went by;
    * a city's weather, once said, is said again word for word.

Data: windows of SEQ_LEN + 1 = 33 tokens of this stream, each starting at <bos> with a fresh story
(so nothing before the window matters). Inputs x = window[:-1], targets y = window[1:]: the model
predicts y[t] from x[:t+1]. Stories are packed one after another, GPT-style:
... . <eos> <bos> NAME ...
The test set is N_TEST = 256 windows from its own fixed seed; training batches come from separate
streams. On the test set (tests/test_city_lab.py runs these lines):

    >>> # the exact bound: mean of -log p(y) over test targets
    >>> print(f"{lower_bound():.4f} nats/token")
    0.4908 nats/token
    >>> print(f"{deterministic_fraction(test_set()):.1%} of the targets have p(y) = 1")
    67.5% of the targets have p(y) = 1

Run ``python code/lecture06/city_lab.py`` for a sample with its probabilities and the unigram and
bigram baselines. This module is the language alone (numpy only): its samples, its exact
probabilities and text scored against them (what 05 part 6's models write); city_train.py trains
models on it.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

# --------------------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------------------
SPECIALS = ("<bos>", "<eos>")
SHE_NAMES = ("anna", "maria", "sofia")
HE_NAMES = ("paul", "omar", "lukas")
NAMES = SHE_NAMES + HE_NAMES
PRONOUNS = ("she", "he")
CITIES = ("paris", "rome", "berlin", "madrid", "vienna", "lisbon", "prague", "athens")
COUNTRIES = ("france", "italy", "germany", "spain", "austria", "portugal", "czechia", "greece")
WEATHER = ("sunny", "rainy", "windy", "cloudy", "snowy")
TRANSPORT = ("train", "plane", "bus", "car")
WORDS = ("lives", "in", "travels", "returns", "from", "to", "by", "is", ".")

VOCAB = SPECIALS + NAMES + PRONOUNS + CITIES + COUNTRIES + WEATHER + TRANSPORT + WORDS
V = len(VOCAB)
TOKEN_ID = {word: i for i, word in enumerate(VOCAB)}
BOS, EOS = TOKEN_ID["<bos>"], TOKEN_ID["<eos>"]

PRONOUN_OF = {**{n: "she" for n in SHE_NAMES}, **{n: "he" for n in HE_NAMES}}
COUNTRY_OF = dict(zip(CITIES, COUNTRIES))

# The probabilities of the random choices (the grammar in the docstring shows them too).
# at home, a sentence is a trip with this probability (name or pronoun first),
P_TRIP_FROM_HOME = 0.6
# the end of the story with this one, and otherwise a sentence about the home city
P_STORY_END = 0.1
P_TRIP_BACK = 0.5       # away, the trip back; otherwise a sentence about the city the person is in
P_WEATHER = 0.6         # "CITY is" goes on with the weather; otherwise "in COUNTRY"

SEQ_LEN = 32  # targets per window; a window holds SEQ_LEN + 1 tokens

# Random streams: numpy seeds a generator from a list of integers, and the last entry names the
# stream, so that no caller's seed can ever reproduce the test set.
TEST_SEED, N_TEST = 20260202, 256  # 20260202: the date of lecture 6
_TEST_STREAM, _TRAIN_STREAM, _BASELINE_STREAM = 0, 1, 2

# --------------------------------------------------------------------------------------------------
# The grammar, written as a program
# --------------------------------------------------------------------------------------------------
# A distribution is a dict {word: probability}. The few distinct ones are built once and shared.


@functools.lru_cache(maxsize=None)
def certain(word: str) -> dict[str, float]:
    """The distribution of a determined token: probability exactly 1."""
    return {word: 1.0}


@functools.lru_cache(maxsize=None)
def uniform(words: tuple[str, ...]) -> dict[str, float]:
    return {word: 1.0 / len(words) for word in words}


@functools.lru_cache(maxsize=None)
def _sentence_start(name: str, city: str, at_home: bool) -> dict[str, float]:
    """How the next sentence begins. Its first token alone decides which sentence it is."""
    p_trip = P_TRIP_FROM_HOME if at_home else P_TRIP_BACK
    p_end = P_STORY_END if at_home else 0.0
    start = {name: p_trip / 2, PRONOUN_OF[name]: p_trip / 2, city: 1.0 - p_trip - p_end}
    if at_home:
        start["<eos>"] = p_end
    return start


@functools.lru_cache(maxsize=None)
def _after_city_is(weather_said: str | None) -> dict[str, float]:
    """After "CITY is": the weather (the one already said for this city, if any) or "in"."""
    if weather_said:
        weather = {weather_said: P_WEATHER}
    else:
        weather = {w: P_WEATHER / len(WEATHER) for w in WEATHER}
    return {**weather, "in": 1.0 - P_WEATHER}


def stories():
    """The city language as a coroutine: it yields the distribution of the next token and is sent
    the token actually chosen (a word). It starts just after a <bos> and runs forever, story after
    story.

    Its state changes only through the tokens sent in, so each distribution it yields is the exact
    conditional distribution of the next token given every token before it.
    """
    while True:  # one story per loop
        name = yield uniform(NAMES)
        yield certain("lives")
        yield certain("in")
        home = yield uniform(CITIES)
        yield certain(".")
        # where the person is, how they went, weather so far
        city, transport, weather_said = home, None, {}
        while True:  # one sentence per loop
            first = yield _sentence_start(name, city, at_home=(city == home))
            if first == "<eos>":
                yield certain("<bos>")  # packed: the next story follows at once
                break
            if first == city:  # "CITY is WEATHER ." or "CITY is in COUNTRY ."
                yield certain("is")
                second = yield _after_city_is(weather_said.get(city))
                if second == "in":
                    yield certain(COUNTRY_OF[city])
                else:
                    weather_said[city] = second
            elif city == home:  # first is the name or the pronoun: a trip out
                for word in ("travels", "from", home, "to"):
                    yield certain(word)
                city = yield uniform(tuple(c for c in CITIES if c != home))
                yield certain("by")
                transport = yield uniform(TRANSPORT)
            else:  # the trip back mirrors the trip out
                for word in ("returns", "from", city, "to", home, "by", transport):
                    yield certain(word)
                city, transport = home, None
            yield certain(".")


def _walk(n_targets: int, choose: Callable[[int, dict], str]) -> tuple[list[str], list[dict]]:
    """Run the grammar from <bos> for n_targets tokens; choose(t, distribution) picks target t.
    Returns the window's words (n_targets + 1, starting with <bos>) and n_targets + 1 distributions:
    one for each target, then the one for the token after the window."""
    story = stories()
    distributions = [next(story)]
    words = ["<bos>"]
    for t in range(n_targets):
        words.append(choose(t, distributions[-1]))
        distributions.append(story.send(words[-1]))
    return words, distributions


def _inverse_cdf(distribution: dict[str, float], u: float) -> str:
    """The word whose cumulative-probability interval holds u (u uniform in [0, 1))."""
    if len(distribution) == 1:   # a determined token (most of them): its interval is [0, 1)
        return next(iter(distribution))
    total = 0.0
    for word, p in distribution.items():
        total += p
        if u < total:
            return word
    return word  # u fell in the rounding gap (1 - 1e-16, 1): the last word


def _as_vectors(distributions: list[dict[str, float]]) -> np.ndarray:
    """(len, V) array of the distributions. They are
    few and shared, so each vector is built once."""
    return np.array([_vector_of(tuple(d.items())) for d in distributions])


@functools.lru_cache(maxsize=None)
def _vector_of(items: tuple[tuple[str, float], ...]) -> np.ndarray:
    vector = np.zeros(V)
    for word, p in items:
        vector[TOKEN_ID[word]] = p
    return vector


# --------------------------------------------------------------------------------------------------
# Batches: sampling, the test set, training batches
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CityBatch:
    """Windows of the city language with their exact probabilities.

    x       (B, S) int64   inputs; x[:, 0] is <bos>
    y       (B, S) int64   targets: y[:, t] = x[:, t + 1], predicted from x[:, :t + 1]
    p_y     (B, S) float64 the true probability of y[:, t] given x[:, :t + 1]
    p_true  (B, S, V) float64 the whole true next-token distribution, or None if not asked for
    """
    x: np.ndarray
    y: np.ndarray
    p_y: np.ndarray
    p_true: np.ndarray | None = None

    @property
    def entropy(self) -> float:
        """Mean of -log p(y) over the batch: the true
        model's cross-entropy, the bound for this batch."""
        return float(-np.log(self.p_y).mean())


def sample(n_windows: int, rng: np.random.Generator | int, seq_len: int = SEQ_LEN,
           with_distributions: bool = False) -> CityBatch:
    """Draw n_windows fresh windows of seq_len targets each, every one starting at <bos>."""
    if int(n_windows) < 1 or int(seq_len) < 1:
        raise ValueError(f"need n_windows >= 1 and seq_len >= 1, got {n_windows} and {seq_len}")
    rng = np.random.default_rng(rng)
    uniforms = rng.random((n_windows, seq_len))  # drawn up front: one number per token, in order
    x = np.empty((n_windows, seq_len + 1), dtype=np.int64)
    p_y = np.empty((n_windows, seq_len))
    p_true = np.zeros((n_windows, seq_len, V)) if with_distributions else None
    for b in range(n_windows):
        # _walk written out: a quarter less CPU a batch (0.23 ms for 8 windows, from 0.30)
        story, ids, probabilities, distributions = stories(), [BOS], [], []
        distribution = next(story)
        for u in uniforms[b].tolist():   # Python floats, the same values: cheaper to compare
            word = _inverse_cdf(distribution, u)
            ids.append(TOKEN_ID[word])
            probabilities.append(distribution[word])
            distributions.append(distribution)
            distribution = story.send(word)
        x[b], p_y[b] = ids, probabilities
        if with_distributions:
            p_true[b] = _as_vectors(distributions)
    return CityBatch(x=x[:, :-1], y=x[:, 1:], p_y=p_y, p_true=p_true)


def _replay(windows) -> list[list[dict]]:
    """Check windows of token ids (or text) and run each through the grammar: for a window of L
    tokens, the L distributions of the tokens after each of its prefixes."""
    if isinstance(windows, str):
        windows = encode(windows)
    windows = np.asarray(windows)
    if windows.ndim == 1:
        windows = windows[None]
    if windows.ndim != 2 or windows.size == 0 or not np.issubdtype(windows.dtype, np.integer):
        raise ValueError(f"windows must be integer token ids of shape (L,) or (B, L), got dtype "
                         f"{windows.dtype} and shape {windows.shape}; use encode() to turn text "
                         "into ids")
    if windows.min() < 0 or windows.max() >= V:
        raise ValueError(f"token ids must lie in [0, {V}), got {windows.min()}..{windows.max()}")
    if np.any(windows[:, 0] != BOS):
        raise ValueError("every window must start with <bos> (id 0): the true distribution is "
                         "known only from the start of a story")
    replayed = []
    for b, window in enumerate(windows):
        given = [VOCAB[i] for i in window]

        def choose(t, dist):
            if given[t + 1] not in dist:
                raise ValueError(f"window {b}, token {t + 1}: {given[t + 1]!r} cannot follow "
                                 f"{' '.join(given[:t + 1])!r}; the grammar allows only "
                                 f"{sorted(dist)}")
            return given[t + 1]

        replayed.append(_walk(len(given) - 1, choose)[1])
    return replayed


def true_distributions(windows) -> np.ndarray:
    """Replay windows through the grammar. windows: token ids (L,) or (B, L), or text, each starting
    with <bos>. Returns (B, L - 1, V): row t is p(next token | windows[:, :t + 1]), the target y[:,
    t]'s. Raises ValueError if a window holds a token the grammar cannot produce where it stands."""
    replayed = _replay(windows)
    if len(replayed[0]) < 2:
        raise ValueError("a window needs at least 2 tokens (<bos> and one target); for the "
                         "distribution after a prefix, use next_token_distribution()")
    return np.stack([_as_vectors(distributions[:-1]) for distributions in replayed])


def next_token_distribution(prefix) -> np.ndarray:
    """p(next token | prefix) as a (V,) vector. prefix: token ids or text, starting with <bos>.

    >>> p = next_token_distribution("<bos> anna lives in paris . she travels from paris to rome by")
    >>> print({VOCAB[i]: float(p[i]) for i in np.flatnonzero(p)})
    {'train': 0.25, 'plane': 0.25, 'bus': 0.25, 'car': 0.25}
    """
    replayed = _replay(prefix)
    if len(replayed) != 1:
        raise ValueError(f"next_token_distribution takes one prefix, got {len(replayed)}")
    return _vector_of(tuple(replayed[0][-1].items())).copy()


def _read_only(batch: CityBatch) -> CityBatch:
    for array in (batch.x, batch.y, batch.p_y, batch.p_true):
        if array is not None:
            array.flags.writeable = False
    return batch


@functools.lru_cache(maxsize=None)
def test_set() -> CityBatch:
    """The fixed test set: N_TEST windows of SEQ_LEN targets, with true distributions. Read-only,
    and the same in every script and every run (its generator is seeded by TEST_SEED alone)."""
    return _read_only(sample(N_TEST, np.random.default_rng([TEST_SEED, _TEST_STREAM]),
                             with_distributions=True))


def lower_bound() -> float:
    """The exact lower bound on test cross-entropy, in nats/token: the mean of -log p(y) over the
    test set's N_TEST * SEQ_LEN targets. No model can do better on average (Gibbs' inequality)."""
    return test_set().entropy


def training_batches(seed: int, batch_size: int, seq_len: int = SEQ_LEN,
                     with_distributions: bool = False) -> Iterator[CityBatch]:
    """An endless stream of fresh batches. The generator is seeded by [seed, 1] and the test set's
    by [TEST_SEED, 0], so no seed reproduces the test set. Every batch is new data, never trained on
    before, so a batch's loss minus batch.entropy is a held-out excess for free."""
    rng = np.random.default_rng([int(seed), _TRAIN_STREAM])
    while True:
        yield sample(batch_size, rng, seq_len, with_distributions)


def deterministic_fraction(batch: CityBatch) -> float:
    """The fraction of targets whose true probability is exactly 1."""
    return float((batch.p_y == 1.0).mean())


# --------------------------------------------------------------------------------------------------
# Scoring a model: excess over the bound
# --------------------------------------------------------------------------------------------------


def excess_mnats(log_probs, batch: CityBatch) -> float:
    """A model's excess cross-entropy on `batch` over the true model's, in milli-nats per token.

    log_probs: (B, S, V) log-probabilities the model gives each next token at each position of
    batch.x (log_softmax of its logits). Returns 1000 * (mean -log q(y) - mean -log p(y)).
    """
    log_probs = np.asarray(log_probs, dtype=np.float64)
    expected = batch.y.shape + (V,)
    if log_probs.shape != expected:
        raise ValueError(f"log_probs has shape {log_probs.shape}, but this batch needs (B, S, V) = "
                         f"{expected}: run the model on batch.x (test_set().x for the test excess) "
                         f"and pass one row of {V} log-probabilities per input position")
    if not np.all(np.isfinite(log_probs) | (log_probs == -np.inf)):
        raise ValueError("log_probs contains nan or +inf: the model has diverged "
                         "(check its loss curve)")
    with np.errstate(over="ignore", divide="ignore"):   # logits that overflow: caught below
        total = np.log(np.exp(log_probs).sum(axis=-1))   # 6× cheaper than np.logaddexp.reduce
    if not np.max(np.abs(total)) <= 1e-3:
        raise ValueError(f"log_probs do not sum to 1 over the vocabulary (log of the sum is up to "
                         f"{np.max(np.abs(total)):.3g} away from 0): pass log_softmax(logits), "
                         "not logits")
    log_q_y = np.take_along_axis(log_probs, batch.y[..., None], axis=-1)[..., 0]
    return 1000.0 * (float(-log_q_y.mean()) - batch.entropy)


def test_excess_mnats(log_probs) -> float:
    """excess_mnats on the test set: log_probs (N_TEST, SEQ_LEN, V) for the inputs test_set().x."""
    return excess_mnats(log_probs, test_set())


# --------------------------------------------------------------------------------------------------
# Baselines: what a model without attention can reach
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def ngram_tables(n_windows: int = 20000, smoothing: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    """Unigram (V,) and bigram (V, V) log-probability tables, fitted by counting on n_windows
    training windows of their own fixed seed (add-`smoothing` counts so no test token gets
    probability 0). bigram[a, b] = log q(next = b | current = a)."""
    data = sample(n_windows, np.random.default_rng([TEST_SEED, _BASELINE_STREAM]))
    unigram = np.bincount(data.y.ravel(), minlength=V) + smoothing
    bigram = np.full((V, V), smoothing)
    np.add.at(bigram, (data.x.ravel(), data.y.ravel()), 1.0)
    return (np.log(unigram / unigram.sum()),
            np.log(bigram / bigram.sum(axis=1, keepdims=True)))


def baseline_excess_mnats() -> dict[str, float]:
    """Test excess of the unigram model (no context) and
    of the bigram model (the current token only)."""
    unigram, bigram = ngram_tables()
    x = test_set().x
    return {"unigram": test_excess_mnats(np.broadcast_to(unigram, x.shape + (V,))),
            "bigram": test_excess_mnats(bigram[x])}


# --------------------------------------------------------------------------------------------------
# Text <-> ids
# --------------------------------------------------------------------------------------------------


def encode(text: str | list[str]) -> np.ndarray:
    """Token ids of a space-separated string (or a list of words)."""
    words = text.split() if isinstance(text, str) else list(text)
    unknown = [w for w in words if w not in TOKEN_ID]
    if unknown:
        raise ValueError(f"unknown token(s) {unknown}: the city language has only the {V} words in "
                         f"city_lab.VOCAB (lower case; '.' is a token of its own, separated by "
                         f"spaces)")
    return np.array([TOKEN_ID[w] for w in words], dtype=np.int64)


def decode(ids) -> str:
    ids = np.asarray(ids).ravel()
    if ids.size and (ids.min() < 0 or ids.max() >= V):
        raise ValueError(f"token ids must lie in [0, {V}), got {ids.min()}..{ids.max()}")
    return " ".join(VOCAB[i] for i in ids)


def describe_window(batch: CityBatch, b: int) -> str:
    """Window b as text, each random target followed by its true probability in brackets."""
    words = [VOCAB[batch.x[b, 0]]]
    for word_id, p in zip(batch.y[b], batch.p_y[b]):
        words.append(VOCAB[word_id] if p == 1.0 else f"{VOCAB[word_id]}[{p:.3g}]")
    return " ".join(words)


# --------------------------------------------------------------------------------------------------
# Scoring text against the language: what a model writes, replayed through the grammar
# --------------------------------------------------------------------------------------------------


def complete_sentences(words: list) -> list:
    """Split at "." (and <bos>, which ends a story): the complete sentences, each a tuple of
    words."""
    sentences, current = [], []
    for w in words:
        current.append(w)
        if w in (".", "<bos>"):
            sentences.append(tuple(current))
            current = []
    return sentences


def score_against_the_language(windows: np.ndarray, prompt_len: int) -> dict:
    """Replay each window (token ids from <bos>) through the grammar (stories) and score the tokens
    after the prompt by their true probability p(token | every token before it). A token with p = 0
    is one the language forbids; after it the story's state is undefined, so scoring stops there
    (at most one per window). Also: the continuation's complete sentences that repeat an earlier
    sentence of the same window."""
    scored = forbidden = clean = repeated = sentences = 0
    log_p = 0.0
    for window in windows:
        words = [VOCAB[i] for i in window]
        story = stories()              # starts just after a <bos>
        distribution = next(story)
        for w in words[1:prompt_len]:
            distribution = story.send(w)
        end = len(words)
        for t in range(prompt_len, len(words)):
            p = distribution.get(words[t], 0.0)
            scored += 1
            if p == 0.0:
                forbidden += 1
                end = t
                break
            log_p += math.log(p)
            distribution = story.send(words[t])
        clean += end == len(words)
        seen = set(complete_sentences(words[1:prompt_len]))
        for sentence in complete_sentences(words[prompt_len:end]):
            sentences += 1
            repeated += sentence in seen
            seen.add(sentence)
    return dict(windows=len(windows), scored=scored, forbidden=forbidden,
                allowed=1 - forbidden / scored, clean=clean,
                # nan where every window derails at its first token: no allowed token to average
                log_p_per_token=log_p / (scored - forbidden) if scored > forbidden else math.nan,
                sentences=sentences,
                repeated=repeated / max(sentences, 1))


def first_forbidden(window: np.ndarray, prompt_len: int) -> int | None:
    """The position of the first token after the prompt that the language forbids (None: there is
    none)."""
    story = stories()
    distribution = next(story)
    for t, i in enumerate(window[1:], start=1):
        word = VOCAB[i]
        if t >= prompt_len and distribution.get(word, 0.0) == 0.0:
            return t
        distribution = story.send(word)
    return None


def marked_continuation(window: np.ndarray, prompt_len: int) -> str:
    """The continuation as text; the first token the language forbids shown as [word ✗], the rest
    cut."""
    stop = first_forbidden(window, prompt_len)
    text = decode(window[prompt_len:stop])
    return text if stop is None else f"{text} [{VOCAB[window[stop]]} ✗] …".lstrip()


def _main():
    import textwrap

    test = test_set()
    print(f"The city language: {V} tokens; windows of {SEQ_LEN} targets; "
          f"the test set has {N_TEST}.")
    print("Three test windows; [p] is the true probability of a random token, "
          "the others have p = 1:")
    for b in range(3):
        print(textwrap.indent(textwrap.fill(describe_window(test, b), 96), "    ") + "\n")
    print(f"exact lower bound        {lower_bound():.4f} nats/token")
    print(f"deterministic targets    {deterministic_fraction(test):.1%}")
    for model, excess in baseline_excess_mnats().items():
        print(f"{model + ' model':<24} {excess:+.0f} mnat/token above the bound")


if __name__ == "__main__":
    _main()
