"""07 · A movie-review Transformer trained on our own framework: lecture 5's contrast sentences (§9.3)

Serves notes §9.3 (and §2.4, exercise 12). The model is built from tensor.py + transformer.py only:
token embedding (+ learned positions) -> dropout -> one bidirectional Pre-LN TransformerLayer (pad mask)
-> LayerNorm -> mean over the non-pad tokens -> Linear to 2 classes; loss transformer.softmax_loss.
The data are lecture 5's reviews (code/lecture05/reviews.py: plain, negation, contrast sentences).

Part 1 · §9.3  parity: the same initialisation, batches and dropout masks as a PyTorch twin (torch_ref
               modules), 20 Adam steps; per-step losses and their max difference (notes: 2.2e-16).
Part 2 · §9.3  accuracy by kind on lecture 5's test set: bag-of-words, the Transformer without and with
               positions; each contrast pair's logits differ by rounding only without positions.
Part 3 · §9.3  attention in "the plot was good but the acting was bad": the weight each position
               receives, averaged over the heads and the 9 queries (the notes: most on position 8).
PyTorch appears only in Part 1; everything else trains with tensor.py.
Runtime: about 10 s whole process on an idle 2-core machine (--quick: about 8 s): the training, the
imports, and torch.optim's first use in Part 1 (it imports torch._dynamo, about 2 s).
"""
from __future__ import annotations

import common  # first: one BLAS thread before numpy loads, and lecture 5's code importable

import functools

import numpy as np
import threads
import transformer as T
import reviews
from bag_of_words import BagOfWords
from tensor import Tensor, no_grad

# the model and its training, shared by all parts
N_EMBD, N_HEAD, P_DROPOUT = 32, 4, 0.1
LR, BATCH_SIZE, STEPS, QUICK_STEPS = 2e-2, 64, 200, 100   # Adam; lr decays linearly to 0
PARITY_STEPS = 20


class SentimentTransformer(T.Module):
    """embedding (+ positions) -> dropout -> one bidirectional layer -> ln -> masked mean -> classifier."""

    def __init__(self, positions: bool, n_vocab: int = len(reviews.VOCAB), n_embd: int = N_EMBD,
                 n_head: int = N_HEAD, n_positions: int = reviews.MAX_LEN, p_dropout: float = P_DROPOUT):
        self.token_embeddings = T.Embedding(n_vocab, n_embd)
        self.position_embeddings = T.Embedding(n_positions, n_embd) if positions else None
        self.dropout = T.Dropout(p_dropout)
        self.layer = T.TransformerLayer(n_embd, n_head, p_dropout, causal=False)
        self.ln = T.LayerNorm(n_embd)
        self.classifier = T.Linear(n_embd, 2)

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
        weights = (keep / keep.sum(axis=1, keepdims=True))[:, :, None]      # (B, S, 1), rows sum to 1
        return self.classifier((x * weights).sum(axis=1))                    # (B, S, D) -> (B, D) -> (B, 2)


def batch_order(n_examples: int, steps: int, seed: int) -> list:
    """The row indices of each training batch: reshuffled every epoch, the same for both twins."""
    rng = np.random.default_rng(seed)
    order = np.concatenate([rng.permutation(n_examples) for _ in range(steps * BATCH_SIZE // n_examples + 1)])
    return [order[i * BATCH_SIZE:(i + 1) * BATCH_SIZE] for i in range(steps)]


def adam_step(model, optimizer, data, rows) -> float:
    logits = model(data.ids[rows], data.pad_mask[rows])
    loss = T.softmax_loss(logits, data.labels[rows]).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


@functools.lru_cache(maxsize=None)
def train_transformer(positions: bool, seed: int, steps: int) -> tuple:
    """Train one SentimentTransformer with our Adam on lecture 5's training set -> (model, losses)."""
    T.set_seed(seed)
    model = SentimentTransformer(positions).train()
    data = reviews.train_set()
    optimizer = T.Adam(model.parameters(), lr=LR)
    losses = []
    for step, rows in enumerate(batch_order(len(data), steps, seed)):
        optimizer.lr = LR * (1 - step / steps)   # linear decay: the last steps settle instead of jumping
        losses.append(adam_step(model, optimizer, data, rows))
    return model.eval(), losses


@functools.lru_cache(maxsize=None)
def train_bag_of_words() -> BagOfWords:
    model = BagOfWords()
    model.fit(reviews.train_set())
    return model


def logits_of(model, data) -> np.ndarray:
    with no_grad():
        return model(data.ids, data.pad_mask).data


# ---- Part 1 ----------------------------------------------------------------------------------
# torch's default is one thread per core; on matrices this small two threads only wait for each other,
# and on a loaded machine OpenMP's waiting made these 20 steps 6-10x slower (threads.py)
@threads.torch_threads(1)
def parity(seed: int = common.DEFAULT_SEED, steps: int = PARITY_STEPS) -> dict:
    """Our model and its torch twin, same init, batches and dropout masks, `steps` Adam steps each."""
    import torch
    import torch_ref

    class TorchSentimentTransformer(torch.nn.Module):
        """The twin, from torch_ref's modules, with the same parameter names and order."""

        def __init__(self, ours: SentimentTransformer):
            super().__init__()
            n_vocab, n_embd = ours.token_embeddings.weights.shape
            self.token_embeddings = torch_ref.Embedding(n_vocab, n_embd)
            self.position_embeddings = torch_ref.Embedding(reviews.MAX_LEN, n_embd)
            self.dropout = torch_ref.Dropout(P_DROPOUT)
            self.layer = torch_ref.TransformerLayer(n_embd, N_HEAD, P_DROPOUT, causal=False)
            self.ln = torch_ref.LayerNorm(n_embd)
            self.classifier = torch_ref.Linear(n_embd, 2)
            torch_ref.copy_from(self, ours)

        def forward(self, ids, pad_mask):
            ids, keep = torch.as_tensor(ids), torch.as_tensor(~pad_mask, dtype=torch.float64)
            x = self.token_embeddings(ids) + self.position_embeddings(torch.arange(ids.shape[1]))[None]
            x = self.ln(self.layer(self.dropout(x), pad_mask=pad_mask))
            return self.classifier((x * (keep / keep.sum(1, keepdim=True))[:, :, None]).sum(1))

    T.set_seed(seed)
    ours = SentimentTransformer(positions=True).train()
    twin = TorchSentimentTransformer(ours)
    data = reviews.train_set()
    optimizer = T.Adam(ours.parameters(), lr=LR)
    torch_optimizer = torch.optim.Adam(twin.parameters(), lr=LR)
    ours_losses, torch_losses = [], []
    for rows in batch_order(len(data), steps, seed):
        ours_losses.append(adam_step(ours, optimizer, data, rows))   # ours first: the twin reuses its masks
        loss = torch.nn.functional.cross_entropy(twin(data.ids[rows], data.pad_mask[rows]),
                                                 torch.as_tensor(data.labels[rows]))
        torch_optimizer.zero_grad()
        loss.backward()
        torch_optimizer.step()
        torch_losses.append(loss.item())
    difference = np.abs(np.array(ours_losses) - np.array(torch_losses))
    return {"ours": ours_losses, "torch": torch_losses, "max_difference": float(difference.max())}


def show_parity(args):
    r = parity(args.seed)
    common.header(1, "§9.3", "Same initialisation, batches and dropout masks as PyTorch: 20 Adam steps")
    rows = [(i + 1, a, b, abs(a - b)) for i, (a, b) in enumerate(zip(r["ours"], r["torch"]))]
    common.table(rows, ["step", "loss, ours (tensor.py)", "loss, PyTorch twin", "|difference|"],
                 floatfmt=(".0f", ".15f", ".15f", ".1e"))
    print(f"max difference over {len(rows)} steps: {r['max_difference']:.1e}   (notes: 2.2e-16)")


# ---- Part 2 ----------------------------------------------------------------------------------
def accuracy_by_kind(predictions: np.ndarray, data) -> dict:
    return {kind: float(np.mean(predictions[data.kinds == kind] == data.labels[data.kinds == kind]))
            for kind in reviews.KINDS}


def accuracy(seed: int = common.DEFAULT_SEED, quick: bool = False) -> dict:
    """model -> {kind: accuracy on the test set, "pair_difference": max |logits(s) - logits(twin(s))|}."""
    steps = QUICK_STEPS if quick else STEPS
    test = reviews.test_set()
    pairs = test.twin >= 0
    bag = train_bag_of_words()
    scores = bag.score(test.ids).data
    results = {"bag-of-words": dict(accuracy_by_kind(bag.predict(test.ids), test),
                                    pair_difference=float(np.abs(scores - scores[test.twin])[pairs].max()))}
    for name, positions in (("Transformer, no positions", False), ("Transformer, learned positions", True)):
        model, _ = train_transformer(positions, seed, steps)
        logits = logits_of(model, test)
        results[name] = dict(accuracy_by_kind(logits.argmax(axis=1), test),
                             pair_difference=float(np.abs(logits - logits[test.twin])[pairs].max()))
    return results


def show_accuracy(args):
    with common.stopwatch() as elapsed:
        r = accuracy(args.seed, args.quick)
    test = reviews.test_set()
    counts = {kind: int(np.sum(test.kinds == kind)) for kind in reviews.KINDS}
    common.header(2, "§9.3", "Lecture 5's test set: accuracy by sentence kind")
    rows = [[name] + [f"{100 * v[kind]:.1f}%" for kind in reviews.KINDS] + [f"{v['pair_difference']:.1e}"]
            for name, v in r.items()]
    common.table(rows, ["model"] + [f"{kind} ({counts[kind]})" for kind in reviews.KINDS]
                 + ["contrast pairs: max |Δ score|"], disable_numparse=True)
    print("A contrast pair has the same words in another order: without positions both sentences get the same\n"
          "scores (to rounding), so exactly one of the two is right: 50%. Bag-of-words gives \"not\" one weight\n"
          "whatever it negates; trained mostly on plain reviews, it reads \"not bad\" as \"bad\".")
    common.timing(f"training (bag-of-words + 2 Transformers, {QUICK_STEPS if args.quick else STEPS} Adam steps "
                  f"each): {elapsed():.1f} s")
    draw_accuracy(r, args.figures)


def draw_accuracy(r: dict, figures_dir):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.26
    for i, (name, v) in enumerate(r.items()):
        x = np.arange(len(reviews.KINDS)) + (i - 1) * width
        bars = ax.bar(x, [100 * v[kind] for kind in reviews.KINDS], width, label=name)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.axhline(50, color="grey", lw=0.8, ls="--")
    ax.set_xticks(np.arange(len(reviews.KINDS)), reviews.KINDS)
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, 115)
    ax.set_title("Lecture 5's test set: who reads negation and contrast")
    ax.legend(fontsize=8, loc="upper center", ncol=3, bbox_to_anchor=(0.5, -0.1))
    common.save_figure(fig, "07_accuracy", figures_dir)


# ---- Part 3 ----------------------------------------------------------------------------------
def attention(seed: int = common.DEFAULT_SEED, quick: bool = False, sentence: str = reviews.NOTES_SENTENCE) -> dict:
    """Attention of the trained with-positions model on `sentence`.

    Returns: words; weights (h, S, S) for that sentence; received (S,) the weight each position
    receives, averaged over the heads and over the (non-pad) queries; argmax and order of `received`.
    """
    model, _ = train_transformer(True, seed, QUICK_STEPS if quick else STEPS)
    ids, pad_mask = reviews.encode([sentence])
    with no_grad():
        logits = model(ids, pad_mask).data[0]
    n_words = len(sentence.split())
    weights = model.layer.attention.last_attention.data[0][:, :n_words, :n_words]   # (h, S, S)
    received = weights.mean(axis=(0, 1))
    return {"words": sentence.split(), "weights": weights, "received": received,
            "argmax": int(received.argmax()), "order": [int(i) for i in np.argsort(-received)],
            "prediction": int(logits.argmax()), "label": reviews.label_of(sentence)}


def show_attention(args):
    r = attention(args.seed, args.quick)
    common.header(3, "§9.3", f"What the model with positions attends to in \"{reviews.NOTES_SENTENCE}\"")
    rows = [(i, w, r["received"][i], *(r["weights"][:, :, i].mean(axis=1))) for i, w in enumerate(r["words"])]
    heads = [f"head {h}" for h in range(r["weights"].shape[0])]
    common.table(rows, ["position", "word", "weight received (mean over heads, queries)"] + heads,
                 floatfmt=".3f")
    first, second = r["order"][:2]
    print(f"most attention: position {first} ({r['words'][first]!r}), then position {second} "
          f"({r['words'][second]!r})   (notes: position 8, then 'but')")
    name = ("negative", "positive")
    print(f"predicted: {name[r['prediction']]} (label: {name[r['label']]})")
    draw_attention(r, args.figures)


def draw_attention(r: dict, figures_dir):
    import matplotlib.pyplot as plt
    words = [f"{i} {w}" for i, w in enumerate(r["words"])]
    fig, (ax, bar) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [1.2, 1]},
                                  layout="constrained")
    image = ax.imshow(r["weights"].mean(axis=0), cmap="Blues", vmin=0)
    ax.set_xticks(range(len(words)), words, rotation=60, ha="right")
    ax.set_yticks(range(len(words)), words)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query")
    ax.set_title("attention weights, mean over heads")
    fig.colorbar(image, ax=ax, fraction=0.046)
    bar.bar(range(len(words)), r["received"], color=["C3" if i == r["argmax"] else "C0" for i in range(len(words))])
    bar.set_xticks(range(len(words)), words, rotation=60, ha="right")
    bar.set_title("weight received, mean over heads and queries")
    fig.suptitle(f"\"{' '.join(r['words'])}\": the Transformer with learned positions")
    common.save_figure(fig, "07_attention", figures_dir)


PARTS = {1: show_parity, 2: show_accuracy, 3: show_attention}

if __name__ == "__main__":
    common.main(__doc__, PARTS)
