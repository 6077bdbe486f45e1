"""Lecture 5's review data (code/lecture05/reviews.py) and its bag-of-words features."""
from collections import Counter

import numpy as np
import pytest

from lecture05 import reviews
from lecture05.bag_of_words import BagOfWords, word_counts


@pytest.fixture(scope="module")
def test():
    return reviews.test_set()


@pytest.fixture(scope="module")
def train():
    return reviews.train_set()


def same(a, b):
    return (a.sentences == b.sentences and np.array_equal(a.ids, b.ids)
            and np.array_equal(a.labels, b.labels)
            and np.array_equal(a.kinds, b.kinds) and np.array_equal(a.twin, b.twin))


def test_generator_is_deterministic(test, train):
    assert same(reviews.test_set(), test)
    assert same(reviews.train_set(), train)
    assert not same(reviews.train_set(seed=reviews.TRAIN_SEED + 1), train)


def test_the_notes_sentence_S2_4_d(test):
    words = reviews.NOTES_SENTENCE.split()
    assert len(words) == 9 and words[4] == "but" and words[8] == "bad"
    assert test.sentences[80] == reviews.NOTES_SENTENCE and test.labels[80] == 0
    twin = test.sentences[test.twin[80]]
    assert twin == "the acting was bad but the plot was good" and test.labels[81] == 1
    assert Counter(twin.split()) == Counter(words)
    assert test.ids[80].tolist() == [reviews.WORD_ID[w] for w in words]


def test_test_set_kinds_sizes_and_padding(test):
    assert len(test) == 200
    assert Counter(test.kinds.tolist()) == {"plain": 40, "negation": 40, "contrast": 120}
    lengths = (~test.pad_mask).sum(axis=1)
    assert set(lengths[test.kinds == "plain"]) == {4}
    assert set(lengths[test.kinds == "negation"]) == {5}
    assert set(lengths[test.kinds == "contrast"]) == {9}
    assert np.array_equal(test.pad_mask, test.ids == reviews.PAD_ID)
    assert len(set(test.sentences)) == len(test)
    for kind in ("plain", "negation"):   # every adjective held out with 4 nouns
        last_words = Counter(s.split()[-1] for s, k in zip(test.sentences, test.kinds) if k == kind)
        assert last_words == {a: 4 for a in reviews.POSITIVE + reviews.NEGATIVE}


def test_every_contrast_sentence_comes_with_its_swapped_twin(test, train):
    for data in (test, train):
        rows = np.flatnonzero(data.kinds == "contrast")
        assert np.all(data.twin[data.kinds != "contrast"] == -1)
        for i in rows:
            j = data.twin[i]
            assert data.twin[j] == i and j != i and data.kinds[j] == "contrast"
            first, second = data.sentences[i].split(" but ")
            assert data.sentences[j] == f"{second} but {first}"
            assert data.labels[j] == 1 - data.labels[i]
            assert np.array_equal(word_counts(data.ids[[i]]), word_counts(data.ids[[j]]))


def test_label_rules(test, train):
    assert reviews.label_of("the plot was good") == 1
    assert reviews.label_of("the acting was not bad") == 1
    assert reviews.label_of("the plot was good but the acting was bad") == 0
    for data in (test, train):
        for sentence, label, kind in zip(data.sentences, data.labels, data.kinds):
            words = sentence.split()
            polarity = int(words[-1] in reviews.POSITIVE)
            assert label == (1 - polarity if kind == "negation" else polarity)
            if kind == "contrast":   # the first clause's adjective has the opposite polarity
                assert int(words[3] in reviews.POSITIVE) == 1 - polarity and words[1] != words[6]


def test_train_set_shares_and_no_test_sentence(test, train):
    assert Counter(train.kinds.tolist()) == {"plain": 1000, "negation": 500, "contrast": 500}
    assert not set(train.sentences) & set(test.sentences)
    for kind in ("plain", "negation"):
        # each noun is held out with as many positive as negative adjectives, so what is left for
        # training is balanced too: no noun predicts the label
        held = Counter((s.split()[1], s.split()[-1] in reviews.POSITIVE)
                       for s, k in zip(test.sentences, test.kinds) if k == kind)
        assert all(held[(noun, True)] == held[(noun, False)] for noun in reviews.NOUNS)


def test_word_counts_leave_out_padding():
    ids, _ = reviews.encode(["the plot was good", "the plot was good but the acting was bad"])
    counts = word_counts(ids)
    assert counts[0].sum() == 4 and counts[1].sum() == 9 and counts[1, reviews.WORD_ID["the"]] == 2
    assert counts[:, reviews.PAD_ID].sum() == 0


def test_bag_of_words_scores_twins_identically(test, train):
    model = BagOfWords()
    model.fit(train, steps=50)
    scores = model.score(test.ids).data
    pairs = test.twin >= 0
    assert np.array_equal(scores[pairs], scores[test.twin[pairs]])


def test_bad_input_is_explained():
    with pytest.raises(ValueError, match="not words of the review vocabulary"):
        reviews.encode(["the plot was superb"])
    with pytest.raises(ValueError, match="more than MAX_LEN"):
        reviews.encode(["the plot was good but the plot was good but"])
    with pytest.raises(ValueError, match="multiple of 8"):
        reviews.train_set(n=100)
    with pytest.raises(ValueError, match="does not end in one of the adjectives"):
        reviews.label_of("the plot was")
