"""Lecture 5's baseline: logistic regression on word counts, trained with tensor.py.

A review becomes its vector of word counts (PAD not counted), and the score is z = counts · w + b:
positive if z > 0. Training minimises the mean logistic loss −log σ(±z) by full-batch gradient
descent (the loss is convex, so it needs nothing more). Order is thrown away before the model sees
anything, which is why it fails where lecture 6 starts (notes §2.4, §9.3, exercise 12):
- negation: "not" gets one weight, added whatever it negates, so it cannot turn "good" down and
  "bad" up at once; trained mostly on plain reviews, the model reads "not bad" as "bad";
- contrast: a sentence and its swapped twin have the same counts, hence the same score, and opposite
  labels: exactly one of the two is right.
"""
from __future__ import annotations

import numpy as np

from lecture05.reviews import PAD_ID, VOCAB, Reviews
from lecture05.tensor import Tensor, no_grad


def word_counts(ids: np.ndarray) -> np.ndarray:
    """(N, S) token ids -> (N, V) counts of each vocabulary word, padding left out."""
    counts = np.zeros((len(ids), len(VOCAB)))
    np.add.at(counts, (np.arange(len(ids))[:, None], ids), 1.0)
    counts[:, PAD_ID] = 0.0
    return counts


class BagOfWords:
    def __init__(self):
        self.weights = Tensor(np.zeros((len(VOCAB), 1)), requires_grad=True)
        self.bias = Tensor(np.zeros(1), requires_grad=True)

    def score(self, ids: np.ndarray, counts: Tensor | None = None) -> Tensor:
        """(N, S) ids (or their precomputed word counts) -> (N,) scores z; z > 0 means positive."""
        counts = Tensor(word_counts(ids)) if counts is None else counts
        return (counts @ self.weights + self.bias).view(-1)

    def predict(self, ids: np.ndarray) -> np.ndarray:
        with no_grad():
            return (self.score(ids).data > 0).astype(np.int64)

    def fit(self, data: Reviews, steps: int = 300, lr: float = 1.0) -> list:
        """Full-batch gradient descent on the mean logistic loss; returns the loss per step."""
        sign = 2.0 * data.labels - 1.0                      # +1 positive, -1 negative
        counts, losses = Tensor(word_counts(data.ids)), []
        for _ in range(steps):
            loss = -(self.score(data.ids, counts) * sign).sigmoid().log().mean()
            self.weights.grad = self.bias.grad = None
            loss.backward()
            for p in (self.weights, self.bias):
                p.data -= lr * p.grad
            losses.append(loss.item())
        return losses
