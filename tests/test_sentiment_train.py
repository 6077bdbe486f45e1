"""Tests for code/lecture06/sentiment_train.py: script 07's model and its training (its claims are
tested in test_07_sentiment.py)."""
import numpy as np
import pytest

from lecture06 import sentiment_train


def test_a_worker_trains_the_same_bits():
    """Models trained in worker processes (sent home as arrays) equal the ones trained here, bit
    for bit."""
    from lecture06 import runner
    runs = [dict(positions=True, seed=7, steps=3), dict(positions=False, seed=7, steps=3)]
    here = [sentiment_train.train_transformer(**run) for run in runs]
    there = runner.map(sentiment_train.train_transformer, runs, workers=2)
    for a, b in zip(here, there):
        assert a["losses"] == b["losses"]
        assert list(a["parameters"]) == list(b["parameters"])
        assert all(np.array_equal(a["parameters"][name], b["parameters"][name])
                   for name in a["parameters"])


def test_training_returns_plain_arrays_and_every_caller_loads_a_model_of_its_own():
    trained = sentiment_train.train_transformer(positions=True, seed=7, steps=2)
    assert all(type(value) is np.ndarray for value in trained["parameters"].values())
    first, second = (sentiment_train.load_transformer(True, trained["parameters"])
                     for _ in range(2))
    assert not first.training
    first.classifier.weights.data += 1.0
    assert np.array_equal(second.classifier.weights.data,
                          trained["parameters"]["classifier.weights"])
    with pytest.raises(ValueError, match="load them with the positions they were trained with"):
        sentiment_train.load_transformer(False, trained["parameters"])


def test_the_runs_are_every_choice_of_positions_at_every_seed_and_train_many_trains_them():
    runs = sentiment_train.transformer_runs([3, 4], steps=2)
    assert runs == [dict(positions=False, seed=3, steps=2), dict(positions=False, seed=4, steps=2),
                    dict(positions=True, seed=3, steps=2), dict(positions=True, seed=4, steps=2)]
    assert sentiment_train.planned(runs) == (sentiment_train.train_transformer, runs)
    for run, trained in zip(runs, sentiment_train.train_many(runs)):
        assert trained["losses"] == sentiment_train.train_transformer(**run)["losses"]
