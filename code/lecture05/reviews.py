"""Lecture 5's movie-review data set: template-generated
one-line reviews whose label is known by rule.

Lecture 5 ended on sentences a bag-of-words model cannot read; lecture 6 (script 07, notes §9.3)
trains a Transformer on the same data. Everything here is fixed by two seeds, so "lecture 5's test
set" is one well-defined object: `test_set()`.

Vocabulary (27 tokens, ids in this order; see VOCAB)
----------------------------------------------------
    pad         <pad>                     id 0, fills every sentence up to MAX_LEN = 9 tokens
    words       the was not but
    nouns       plot acting music ending script cast dialogue story pacing humor soundtrack
                direction
    positive    good great fun clever moving
    negative    bad boring dull weak awful

Templates and label rules (label 1 = positive, 0 = negative; see label_of)
--------------------------------------------------------------------------
    plain     the N was A                       4 tokens  A's polarity
    negation  the N was not A                   5 tokens  the opposite of A's polarity
    contrast  the N1 was A1 but the N2 was A2   9 tokens  N1 != N2, A1 and A2 of opposite polarity;
                                                          the clause after "but"
                                                          decides: A2's polarity
Every contrast sentence has a swapped twin (the clauses exchanged): the same words, so the same word
counts, and the opposite label. In "the plot was good but the acting was bad" (label 0) "but" is at
0-based position 4 and the deciding adjective "bad" at position 8 (A2 is always at position 8).
All sentences: 120 plain, 120 negation, 6600 contrast (3300 twin pairs).

The two sets (each ordered plain, negation, contrast; contrast twins in adjacent rows 2k, 2k+1)
--------------------------------------------------------------------------------------------
    test_set()    fixed by TEST_SEED, 200 sentences:
                  40 plain     every adjective with 4 of the 12 nouns, on a diagonal pattern over
                               the nouns in a random order, so that every noun is held out with as
                               many positive as negative adjectives (no noun predicts the label in
                               training)
                  40 negation  chosen the same way, independently
                  120 contrast 60 twin pairs: the notes' sentence and its swap, then 59 pairs drawn
                               without replacement from the other 3299
    train_set()   fixed by TRAIN_SEED, from the sentences NOT in the test set, n = 2000:
                  n/2 plain and n/4 negation drawn with replacement (from 80 sentences each), n/8
                  contrast twin pairs drawn without replacement (plain reviews are the common case)
No test sentence is ever trained on. Contrast sentences come in twin pairs in both sets, so a model
that cannot see order learns to answer 50/50 on them instead of memorising noise.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import permutations

import numpy as np

PAD = "<pad>"
NOUNS = ("plot", "acting", "music", "ending", "script", "cast", "dialogue", "story", "pacing",
         "humor", "soundtrack", "direction")
POSITIVE = ("good", "great", "fun", "clever", "moving")
NEGATIVE = ("bad", "boring", "dull", "weak", "awful")
VOCAB = (PAD, "the", "was", "not", "but") + NOUNS + POSITIVE + NEGATIVE
WORD_ID = {word: i for i, word in enumerate(VOCAB)}
PAD_ID = WORD_ID[PAD]
KINDS = ("plain", "negation", "contrast")
MAX_LEN = 9
TEST_SEED = 5
TRAIN_SEED = 55
NOTES_SENTENCE = "the plot was good but the acting was bad"


def polarity(adjective: str) -> int:
    return 1 if adjective in POSITIVE else 0


def plain(noun: str, adjective: str) -> str:
    return f"the {noun} was {adjective}"


def negation(noun: str, adjective: str) -> str:
    return f"the {noun} was not {adjective}"


def contrast(clause_1: tuple, clause_2: tuple) -> str:
    """clause = (noun, adjective): "the N1 was A1 but the N2 was A2"."""
    (n1, a1), (n2, a2) = clause_1, clause_2
    return f"the {n1} was {a1} but the {n2} was {a2}"


def kind_of(sentence: str) -> str:
    words = sentence.split()
    return "contrast" if "but" in words else "negation" if "not" in words else "plain"


def label_of(sentence: str) -> int:
    """The label rules: the last word is the adjective that decides (after "but" in a contrast
    sentence); its polarity, flipped by "not"."""
    words = sentence.split()
    if words[-1] not in POSITIVE + NEGATIVE:
        raise ValueError(f"label_of: {sentence!r} does not end in one of the adjectives "
                         f"{POSITIVE + NEGATIVE}")
    return 1 - polarity(words[-1]) if kind_of(sentence) == "negation" else polarity(words[-1])


def contrast_pairs() -> list:
    """All 1400 unordered twin pairs as (clause_1, clause_2),
    each sentence's twin is (clause_2, clause_1)."""
    pairs = []
    for n1, n2 in permutations(NOUNS, 2):
        for a1 in POSITIVE + NEGATIVE:
            for a2 in (NEGATIVE if a1 in POSITIVE else POSITIVE):
                if (n1, a1) < (n2, a2):              # one of the two orders names the pair
                    pairs.append(((n1, a1), (n2, a2)))
    return pairs


@dataclass
class Reviews:
    """A set of reviews, padded to MAX_LEN.

    sentences: N strings; ids: (N, MAX_LEN) token ids, PAD_ID after the sentence's end;
    pad_mask: (N, MAX_LEN), True at padding; labels: (N,) 1 = positive; kinds: (N,) one of KINDS;
    twin: (N,) row of the swapped twin in this set, -1 if it has none.
    """
    sentences: list
    ids: np.ndarray
    pad_mask: np.ndarray
    labels: np.ndarray
    kinds: np.ndarray
    twin: np.ndarray

    def __len__(self):
        return len(self.sentences)


def encode(sentences) -> tuple:
    """Sentences (strings of VOCAB words) -> ids (N, MAX_LEN) padded with PAD_ID,
    pad_mask (N, MAX_LEN)."""
    ids = np.full((len(sentences), MAX_LEN), PAD_ID, dtype=np.int64)
    for row, sentence in enumerate(sentences):
        words = sentence.split()
        unknown = [w for w in words if w not in WORD_ID or w == PAD]
        if unknown:
            raise ValueError(f"encode: {unknown} in {sentence!r} are not words of the review "
                             f"vocabulary; the words are {VOCAB[1:]}")
        if len(words) > MAX_LEN:
            raise ValueError(f"encode: {sentence!r} has {len(words)} words, "
                             f"more than MAX_LEN = {MAX_LEN}")
        ids[row, :len(words)] = [WORD_ID[w] for w in words]
    return ids, ids == PAD_ID


def _reviews(sentences: list) -> Reviews:
    """Sentences in the order plain, negation, contrast
    (contrast in adjacent twin pairs) -> Reviews."""
    ids, pad_mask = encode(sentences)
    kinds = [kind_of(s) for s in sentences]
    first = kinds.index("contrast") if "contrast" in kinds else len(kinds)
    twin = [-1] * first + [i ^ 1 for i in range(first, len(kinds))]   # rows 2k and 2k+1 are twins
    return Reviews(sentences, ids, pad_mask,
                   np.array([label_of(s) for s in sentences], dtype=np.int64),
                   np.array(kinds), np.array(twin, dtype=np.int64))


def _split(seed: int):
    """The test set's sentences and, per kind, what is
    left for training (contrast: as twin pairs)."""
    rng = np.random.default_rng(seed)
    test, pools = [], {}
    for kind, make in (("plain", plain), ("negation", negation)):
        # every third (noun, adjective) on a diagonal pattern, the nouns in random order: every
        # adjective is held out with 4 nouns, and every noun with as many positive as negative
        # adjectives (so no noun predicts the label in training)
        rank = rng.permutation(len(NOUNS))
        held = [(noun, adjective) for group in (POSITIVE, NEGATIVE)
                for j, adjective in enumerate(group)
                for noun, r in zip(NOUNS, rank) if (r + j) % 3 == 0]
        test += [make(*c) for c in held]
        pools[kind] = [make(n, a) for a in POSITIVE + NEGATIVE for n in NOUNS if (n, a) not in held]
    pairs = contrast_pairs()
    notes_pair = (("acting", "bad"), ("plot", "good"))
    others = [p for p in pairs if p != notes_pair]
    chosen = [notes_pair] + [others[i]
                             for i in sorted(rng.choice(len(others), size=59, replace=False))]
    for first, second in chosen:
        order = (second, first) if contrast(second, first) == NOTES_SENTENCE else (first, second)
        test += [contrast(*order), contrast(*order[::-1])]
    chosen = set(chosen)
    pools["contrast"] = [p for p in pairs if p not in chosen]
    return test, pools


def test_set() -> Reviews:
    """Lecture 5's test set: fixed, 40 plain, 40 negation,
    60 contrast twin pairs (see the module docstring)."""
    return _reviews(_split(TEST_SEED)[0])


def train_set(n: int = 2000, seed: int = TRAIN_SEED) -> Reviews:
    """n sentences (a multiple of 8) not in the test set: n/2 plain and n/4 negation drawn with
    replacement, n/8 contrast twin pairs drawn without replacement, each pair adjacent."""
    _, pools = _split(TEST_SEED)
    if n < 8 or n % 8 or n // 8 > len(pools["contrast"]):
        raise ValueError(f"train_set: n must be a multiple of 8 from 8 to "
                         f"{8 * len(pools['contrast'])} (n/8 distinct contrast pairs), got {n}")
    rng = np.random.default_rng(seed)
    sentences = []
    for kind, count in (("plain", n // 2), ("negation", n // 4)):
        sentences += [pools[kind][i] for i in rng.integers(len(pools[kind]), size=count)]
    for i in rng.choice(len(pools["contrast"]), size=n // 8, replace=False):
        first, second = pools["contrast"][i]
        sentences += [contrast(first, second), contrast(second, first)]
    return _reviews(sentences)


__all__ = ["PAD", "PAD_ID", "VOCAB", "WORD_ID", "NOUNS", "POSITIVE", "NEGATIVE", "KINDS", "MAX_LEN",
           "NOTES_SENTENCE", "Reviews", "encode", "kind_of", "label_of", "test_set", "train_set",
           "contrast_pairs"]

test_set.__test__ = False   # a data set, not a pytest test, even when imported into a test module
