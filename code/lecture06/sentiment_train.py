"""Script 07's movie-review Transformer and its training, built from tensor.py + transformer.py
only: what city_train.py is to scripts 04 and 05.

The model (notes §9.3): token embedding (+ learned positions) -> dropout -> one bidirectional Pre-LN
TransformerLayer (pad mask) -> LayerNorm -> mean over the non-pad tokens -> Linear to 2 classes,
trained with our Adam on lecture 5's reviews (code/lecture05/reviews.py), loss
transformer.softmax_loss.

    model = SentimentTransformer(positions=True)
    trained = train_transformer(positions=True, seed=0, steps=200)   # {"parameters", "losses"}
    model = load_transformer(True, trained["parameters"])            # eval mode, a copy of its own
    results = train_many(transformer_runs(seeds=[0, 1, 2], steps=200))   # train_transformer each

A trained model is plain data (numpy arrays), so a run may come from another process: train_many
hands the runs to runner.py, which trains them side by side on the machine's cores, each once per
process, with the same bits as here.
"""
from __future__ import annotations

from lecture06 import threads  # first: one BLAS thread, set before numpy loads

import numpy as np

from lecture06 import optim, progress
from lecture05 import reviews
from lecture06 import runner, transformer
from lecture05.tensor import Tensor

N_EMBD, N_HEAD, P_DROPOUT = 32, 4, 0.1
LR, BATCH_SIZE = 2e-2, 64   # Adam; the lr decays linearly to 0


class SentimentTransformer(transformer.Module):
    """embedding (+ positions) -> dropout -> one bidirectional layer -> ln -> masked mean ->
    classifier."""

    def __init__(self, positions: bool, n_vocab: int = len(reviews.VOCAB), n_embd: int = N_EMBD,
                 n_head: int = N_HEAD, n_positions: int = reviews.MAX_LEN,
                 p_dropout: float = P_DROPOUT):
        self.token_embeddings = transformer.Embedding(n_vocab, n_embd)
        self.position_embeddings = transformer.Embedding(n_positions, n_embd) if positions else None
        self.dropout = transformer.Dropout(p_dropout)
        self.layer = transformer.TransformerLayer(n_embd, n_head, p_dropout, causal=False)
        self.ln = transformer.LayerNorm(n_embd)
        self.classifier = transformer.Linear(n_embd, 2)

    def forward(self, ids, pad_mask) -> Tensor:
        """
        Args:
            ids: (B, S) token ids; pad_mask: (B, S), True at padding
        Returns:
            logits: (B, 2)
        """
        x = self.token_embeddings(ids)
        if self.position_embeddings is not None:
            x = x + self.position_embeddings(np.arange(ids.shape[1])[None, :])  # (1, S, D) over B
        x = self.ln(self.layer(self.dropout(x), pad_mask=pad_mask))
        keep = ~np.asarray(pad_mask)
        weights = (keep / keep.sum(axis=1, keepdims=True))[:, :, None]    # (B, S, 1), rows sum to 1
        return self.classifier((x * weights).sum(axis=1))            # (B, S, D) -> (B, D) -> (B, 2)


def batch_order(n_examples: int, steps: int, seed: int) -> list:
    """The row indices of each training batch: reshuffled every epoch, the same for both twins."""
    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(n_examples)
                            for _ in range(steps * BATCH_SIZE // n_examples + 1)])
    return [order[i * BATCH_SIZE:(i + 1) * BATCH_SIZE] for i in range(steps)]


def adam_step(model, optimizer, data, rows) -> float:
    logits = model(data.ids[rows], data.pad_mask[rows])
    loss = transformer.softmax_loss(logits, data.labels[rows]).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def train_transformer(positions: bool, seed: int, steps: int) -> dict:
    """Train one SentimentTransformer with our Adam on lecture 5's training set -> {"parameters":
    {name: array}, "losses": [loss of every step]}: plain data (it may come from another process),
    from which load_transformer builds the model."""
    transformer.set_seed(seed)
    model = SentimentTransformer(positions).train()
    data = reviews.train_set()
    optimizer = optim.Adam(model.parameters(), lr=LR)
    losses = []
    for step, rows in enumerate(batch_order(len(data), steps, seed)):
        # linear decay: the last steps settle instead of jumping
        optimizer.lr = LR * (1 - step / steps)
        losses.append(adam_step(model, optimizer, data, rows))
        progress.report_steps(1)
    return {"parameters": {name: p.data for name, p in model.named_parameters()}, "losses": losses}


def load_transformer(positions: bool, parameters: dict) -> SentimentTransformer:
    """A SentimentTransformer in eval mode holding a copy of trained `parameters`
    (train_transformer's): each caller gets a model of its own, so no part changes a model another
    part holds."""
    model = SentimentTransformer(positions)
    names = [name for name, _ in model.named_parameters()]
    if names != list(parameters):
        raise ValueError(f"load_transformer(positions={positions}): the parameters are "
                         f"{list(parameters)}, the model's {names}: load them with the positions "
                         "they were trained with")
    for name, p in model.named_parameters():
        p.data = parameters[name].copy()
    return model.eval()


def transformer_runs(seeds, steps: int, positions=(False, True)) -> list[dict]:
    """The train_transformer arguments of every model: each choice of positions at each seed."""
    return [dict(positions=p, seed=seed, steps=steps) for p in positions for seed in seeds]


def transformer_steps(positions: bool, seed: int, steps: int) -> int:
    """The steps train_transformer(positions, seed, steps) takes: what the progress bar counts
    (runner.map's steps)."""
    return steps


def planned(runs: list) -> tuple:
    """(function, [arguments]) that train_many(runs) hands runner.map: what a script passes
    common.main's train_ahead, so that the runs start before the part that asks for them."""
    return train_transformer, runs


def train_many(runs: list) -> list:
    """[train_transformer(**run) for run in runs]: the same results in the same order, each
    trained once per process (runner.py keeps them, and trains them side by side on the machine's
    cores)."""
    return runner.map(*planned(runs), steps=transformer_steps)
