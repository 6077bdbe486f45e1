"""07 · A movie-review Transformer trained on our own framework: lecture 5's contrast sentences

Part 1 · §9.3 Same initialisation, batches and dropout masks as PyTorch: 20 Adam steps
Part 2 · §9.3 Lecture 5's test set: accuracy by sentence kind
Part 3 · §9.3 What the model with positions attends to in "the plot was good but the acting was
    bad"

Serves notes §9.3 (and §2.4, exercise 12). The model is built from tensor.py + transformer.py only:
token embedding (+ learned positions) -> dropout -> one bidirectional Pre-LN TransformerLayer
(pad mask) -> LayerNorm -> mean over the non-pad tokens -> Linear to 2 classes; loss
transformer.softmax_loss. The data are lecture 5's reviews (code/lecture05/reviews.py: plain,
negation, contrast sentences). The model and its training are in sentiment_train.py
(SentimentTransformer, train_transformer); this script is what they show.

Part 1 trains ours and a PyTorch twin (torch_ref modules) from the same initialisation, batches
and dropout masks, and prints the per-step losses and their largest difference. Part 2 compares
bag-of-words with the Transformer without and with positions, by sentence kind; without positions
each contrast pair's logits differ by rounding only. Part 3 prints the weight each position
receives, averaged over the heads and the 9 queries (the notes: most on position 8).

Parts 2 and 3 train the Transformers at --seeds seeds (default 5): --seed, --seed+1, ...; they
print the first seed's tables and the spread over the seeds, and decide each claim over them.
What rests on a trained Transformer is marked ⚙ (other float kernels can tip a seed), whatever its
margin on this CPU.
Part 3 looks at Part 2's models. PyTorch appears only in Part 1; everything else trains with
tensor.py.
"""
from __future__ import annotations

import sys

try:   # first: one BLAS thread before numpy loads
    from lecture06 import common
except ModuleNotFoundError as missing:   # the course's package is not installed in this Python
    sys.exit(f"{missing} in {sys.executable}: run `make venv`, then .venv/bin/python {sys.argv[0]}")

import functools

import numpy as np
from lecture06 import optim
import torch
from lecture06 import threads, torch_ref, transformer
from lecture05 import reviews
from lecture06 import sentiment_train
from lecture05.bag_of_words import BagOfWords
from lecture05.tensor import no_grad

# the Adam steps of the models of parts 2 and 3 (sentiment_train.py: the model and its training)
STEPS, QUICK_STEPS = 200, 100
PARITY_STEPS = 20
MODELS = {"Transformer, no positions": False, "Transformer, learned positions": True}
# float64 rounding through one layer is ~1e-15: a pair difference below this is "equal"
ROUNDING = 1e-12


@functools.lru_cache(maxsize=None)
def train_bag_of_words() -> BagOfWords:
    """Full-batch gradient descent from zero weights: no randomness, so one model serves every
    seed."""
    model = BagOfWords()
    model.fit(reviews.train_set())
    return model


def steps_of(args) -> int:
    return QUICK_STEPS if args.quick else STEPS


def logits_of(model, data) -> np.ndarray:
    with no_grad():
        return model(data.ids, data.pad_mask).data


# ---- Part 1 ----------------------------------------------------------------------------------
class TorchSentimentTransformer(torch.nn.Module):
    """sentiment_train.SentimentTransformer's PyTorch twin (with positions), from torch_ref's
    modules, with the same parameter names and order; it starts from a copy of `ours`'s
    parameters."""

    def __init__(self, ours: sentiment_train.SentimentTransformer):
        super().__init__()
        n_vocab, n_embd = ours.token_embeddings.weights.shape
        self.token_embeddings = torch_ref.Embedding(n_vocab, n_embd)
        self.position_embeddings = torch_ref.Embedding(reviews.MAX_LEN, n_embd)
        self.dropout = torch_ref.Dropout(sentiment_train.P_DROPOUT)
        self.layer = torch_ref.TransformerLayer(n_embd, sentiment_train.N_HEAD,
                                                sentiment_train.P_DROPOUT, causal=False)
        self.ln = torch_ref.LayerNorm(n_embd)
        self.classifier = torch_ref.Linear(n_embd, 2)
        torch_ref.copy_from(self, ours)

    def forward(self, ids, pad_mask):
        ids, keep = torch.as_tensor(ids), torch.as_tensor(~pad_mask, dtype=torch.float64)
        x = self.token_embeddings(ids) + self.position_embeddings(torch.arange(ids.shape[1]))[None]
        x = self.ln(self.layer(self.dropout(x), pad_mask=pad_mask))
        return self.classifier((x * (keep / keep.sum(1, keepdim=True))[:, :, None]).sum(1))


# torch's default is one thread per core; on matrices this small two threads only wait for each
# other, and on a loaded machine OpenMP's waiting made these 20 steps 6-10x slower (threads.py)
@threads.torch_threads(1)
def parity(seed: int = common.DEFAULT_SEED, steps: int = PARITY_STEPS) -> dict:
    """Our model and its torch twin, same init, batches and dropout masks, `steps` Adam steps
    each."""
    transformer.set_seed(seed)
    ours = sentiment_train.SentimentTransformer(positions=True).train()
    twin = TorchSentimentTransformer(ours)
    data = reviews.train_set()
    optimizer = optim.Adam(ours.parameters(), lr=sentiment_train.LR)
    torch_optimizer = torch.optim.Adam(twin.parameters(), lr=sentiment_train.LR)
    ours_losses, torch_losses = [], []
    for rows in sentiment_train.batch_order(len(data), steps, seed):
        # ours first: the twin reuses its masks
        ours_losses.append(sentiment_train.adam_step(ours, optimizer, data, rows))
        loss = torch.nn.functional.cross_entropy(twin(data.ids[rows], data.pad_mask[rows]),
                                                 torch.as_tensor(data.labels[rows]))
        torch_optimizer.zero_grad()
        loss.backward()
        torch_optimizer.step()
        torch_losses.append(loss.item())
    difference = np.abs(np.array(ours_losses) - np.array(torch_losses))
    return {"ours": ours_losses, "torch": torch_losses, "max_difference": float(difference.max())}


def show_parity(args):
    common.header(1, __doc__, f"{PARITY_STEPS} Adam steps")
    r = parity(args.seed)
    rows = [(i + 1, a, b, abs(a - b)) for i, (a, b) in enumerate(zip(r["ours"], r["torch"]))]
    # the last digits of a float64 loss depend on the CPU's float kernels (the order of BLAS's
    # sums): ⚙
    common.table(rows, ["step", "loss, ours (tensor.py)", "loss, PyTorch twin", "|difference|"],
                 floatfmt=(".0f", ".15f", ".15f", ".1e"), kernel_dependent=True)
    common.kernel_note(f"max difference over {len(rows)} steps: {r['max_difference']:.1e}   "
                       "(notes: 2.2e-16)")
    agree = sum(abs(a - b) <= 1e-14 for _, a, b, _ in rows)
    common.note(f"the two losses agree to float64 rounding (≤ 1e-14) at {agree} of {len(rows)} "
                "steps")


# ---- Part 2 ----------------------------------------------------------------------------------
def accuracy_by_kind(predictions: np.ndarray, data) -> dict:
    return {kind: float(np.mean(predictions[data.kinds == kind] == data.labels[data.kinds == kind]))
            for kind in reviews.KINDS}


def smallest_margin(logits: np.ndarray, data) -> dict:
    """kind -> min over its sentences of z_label - z_other: > 0 iff every one is right, and by how
    much; < 0: how far the worst one is wrong."""
    rows = np.arange(len(data.labels))
    margin = logits[rows, data.labels] - logits[rows, 1 - data.labels]
    return {kind: float(margin[data.kinds == kind].min()) for kind in reviews.KINDS}


def decided_by(logits: np.ndarray, data) -> dict:
    """kind -> min over its sentences of |z1 - z0|: how far the closest one is from changing its
    prediction, and so the kind's accuracy."""
    gap = np.abs(logits[:, 1] - logits[:, 0])
    return {kind: float(gap[data.kinds == kind].min()) for kind in reviews.KINDS}


def pair_difference(scores: np.ndarray, data) -> float:
    """max |scores(s) - scores(twin of s)| over the contrast sentences: ~0 for a model blind to
    order."""
    pairs = data.twin >= 0
    return float(np.abs(scores - scores[data.twin])[pairs].max())


def accuracy(seeds=(common.DEFAULT_SEED,), steps: int = STEPS) -> dict:
    """Accuracy by kind on lecture 5's test set, the Transformers trained `steps` Adam steps at each
    seed.

    Returns {"seeds": seeds, "bag-of-words": {kind: accuracy, "pair_difference": max |Δ score| over
    the contrast pairs} (no randomness: one model for every seed), for each name in MODELS a list
    with one such dict per seed (with its "seed", "margin": smallest_margin, "decided_by":
    decided_by and "undecided": the smallest |z1 - z0| of a contrast sentence), "claims": each
    claim's margin at every seed (see accuracy_claims)}.
    """
    seeds = list(seeds)
    test = reviews.test_set()
    bag = train_bag_of_words()
    results = {"seeds": seeds,
               "bag-of-words": dict(accuracy_by_kind(bag.predict(test.ids), test),
                                    pair_difference=pair_difference(bag.score(test.ids).data,
                                                                    test))}
    runs = sentiment_train.transformer_runs(seeds, steps)
    trained = {(run["positions"], run["seed"]):
               sentiment_train.load_transformer(run["positions"], result["parameters"])
               for run, result in zip(runs, sentiment_train.train_many(runs))}
    contrast = test.kinds == "contrast"
    for name, positions in MODELS.items():
        results[name] = []
        for seed in seeds:
            logits = logits_of(trained[positions, seed], test)
            results[name].append(dict(accuracy_by_kind(logits.argmax(axis=1), test), seed=seed,
                                      pair_difference=pair_difference(logits, test),
                                      margin=smallest_margin(logits, test),
                                      decided_by=decided_by(logits, test),
                                      undecided=float(np.abs(logits[contrast, 1] -
                                                             logits[contrast, 0]).min())))
    results["claims"] = accuracy_claims(results)
    return results


def accuracy_claims(r: dict) -> dict:
    """§9.3's and exercise 12's claims -> their margin at each seed: > 0 where the claim holds, < 0
    where it fails; how far from tipping either way."""
    blind, learned = r["Transformer, no positions"], r["Transformer, learned positions"]
    # Twins whose logits agree to rounding land on the same side of 0 unless a logit gap is itself
    # at rounding level, so one of the two is right: exactly 50%, however small the gap is
    # otherwise.
    return {"blind_pairs_equal": [v["undecided"]
                                  if v["pair_difference"] <= ROUNDING and v["contrast"] == 0.5
                                  else -v["pair_difference"] for v in blind],
            "blind_negation": [v["margin"]["negation"] for v in blind],
            "positions_contrast": [v["margin"]["contrast"] for v in learned]}


def _percent(values) -> str:
    low, high = min(values), max(values)
    return f"{100 * low:.1f}%" if low == high else f"{100 * low:.1f}-{100 * high:.1f}%"


def _difference(values) -> str:
    low, high = min(values), max(values)
    return f"{low:.1e}" if low == high else f"{low:.1e} to {high:.1e}"


def accuracy_seeds(args) -> list:
    return common.seeds_of(args)


def part2_runs(args) -> tuple:
    """The models show_accuracy will ask for, so that common.main can start training them before
    Part 1."""
    return sentiment_train.planned(sentiment_train.transformer_runs(accuracy_seeds(args),
                                                                    steps_of(args)))


def part3_runs(args) -> tuple:
    """The models show_attention will ask for (those Part 2 trains too are trained once)."""
    return sentiment_train.planned(sentiment_train.transformer_runs(common.seeds_of(args),
                                                                    steps_of(args),
                                                                    positions=(True,)))


def accuracy_row(name: str, results: list) -> list:
    """A model's accuracy by kind, lowest-highest over its seeds. Bag-of-words has no randomness; a
    Transformer's row, trained, carries ⚙ (other float kernels can tip a sentence)."""
    return ([name if name == "bag-of-words" else f"{common.KERNELS} {name}"]
            + [_percent([v[kind] for v in results]) for kind in reviews.KINDS])


def pair_differences(r: dict, pick) -> str:
    """Each Transformer's contrast-pair differences over the seeds `pick` chooses from its list (a
    trained Transformer's are its float kernels' digits: ⚙)."""
    return ", ".join(f"{name.removeprefix('Transformer, ')} "
                     f"{_difference([v['pair_difference'] for v in pick(r[name])])}"
                     for name in MODELS)


def show_accuracy(args):
    common.header(2, __doc__)
    seeds, steps = accuracy_seeds(args), steps_of(args)
    r = accuracy(seeds, steps)
    test = reviews.test_set()
    headers = ["model"] + [f"{kind} ({int(np.sum(test.kinds == kind))})" for kind in reviews.KINDS]
    common.note(f"seed {seeds[0]}, the Transformers after {steps} Adam steps:")
    common.table([accuracy_row("bag-of-words", [r["bag-of-words"]])]
                 + [accuracy_row(name, r[name][:1]) for name in MODELS],
                 headers, disable_numparse=True)
    common.note(f"contrast pairs, max |Δ score| between a sentence and its twin: bag-of-words "
                f"{r['bag-of-words']['pair_difference']:.1e}; the Transformers:")
    common.kernel_note(f"seed {seeds[0]}: {pair_differences(r, lambda results: results[:1])}")
    if len(seeds) > 1:
        common.note(f"\nlowest-highest over {len(seeds)} seeds ({', '.join(map(str, seeds))}) "
                    "(bag-of-words has no randomness:\nfull-batch gradient descent from zero "
                    "weights, the same model at every seed):")
        common.table([accuracy_row(name, r[name]) for name in MODELS], headers,
                     disable_numparse=True)
        common.kernel_note(f"contrast pairs, max |Δ score|: {pair_differences(r, lambda x: x)}")
    print()
    print_accuracy_claims(r)
    draw_accuracy(r, args.figures)


def print_accuracy_claims(r: dict):
    """accuracy_claims, each counted over the seeds, and why contrast needs positions."""
    c, n = r["claims"], len(r["claims"]["blind_pairs_equal"])
    equal = common.holds(c["blind_pairs_equal"])
    # a structural fact (the model cannot tell the order of words), not a training claim: a
    # bound that holds at every seed, on any CPU; a seed where it failed would be a finding
    (common.note if equal == n else common.kernel_note)(
        f"without positions, every contrast pair's logits are equal to rounding "
        f"(≤ {ROUNDING:.0e}), so contrast is exactly 50%: at {common.seeds_text(equal, n)}")
    logits = "logits (the right class's over the wrong, the least over the {} sentences)"
    common.count_line("without positions, negation all correct", c["blind_negation"],
                      logits.format("negation"), digits=2)
    common.count_line("with learned positions, contrast all correct", c["positions_contrast"],
                      logits.format("contrast"), digits=2)
    blind_contrast = _percent([v["contrast"] for v in r["Transformer, no positions"]])
    common.note("A contrast pair has the same words in another order: without positions both "
                "sentences get the same\nscores (to rounding), so one of the two is right and the "
                f"other wrong: contrast {blind_contrast} without positions.\nBag-of-words gives "
                "\"not\" one weight whatever it negates; trained mostly on plain reviews, it "
                "reads \"not bad\" as \"bad\".")


@common.draws_figure
def draw_accuracy(r: dict, figures_dir):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.26
    models = {"bag-of-words": [r["bag-of-words"]], **{name: r[name] for name in MODELS}}
    for i, (name, results) in enumerate(models.items()):
        x = np.arange(len(reviews.KINDS)) + (i - 1) * width
        # (seeds, kinds)
        values = np.array([[100 * v[kind] for kind in reviews.KINDS] for v in results])
        mean = values.mean(axis=0)
        bars = ax.bar(x, mean, width, label=name,
                      yerr=[mean - values.min(axis=0), values.max(axis=0) - mean], capsize=2,
                      error_kw={"lw": 0.8})
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
    ax.axhline(50, color="grey", lw=0.8, ls="--")
    ax.set_xticks(np.arange(len(reviews.KINDS)), reviews.KINDS)
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, 115)
    seeds = r["seeds"]
    ax.set_title("Lecture 5's test set: who reads negation and contrast\n(Transformers: mean over "
                 f"{len(seeds)} seed{'s' if len(seeds) > 1 else ''}, whiskers "
                 "lowest-highest)", fontsize=10)
    ax.legend(fontsize=8, loc="upper center", ncol=3, bbox_to_anchor=(0.5, -0.1))
    common.save_figure(fig, "07_accuracy", figures_dir)


# ---- Part 3 ----------------------------------------------------------------------------------
# in a contrast sentence: the adjective after "but" (it decides the label), and "but"
DECIDING, BUT = 8, 4


def attention(model: sentiment_train.SentimentTransformer,
              sentence: str = reviews.NOTES_SENTENCE) -> dict:
    """Attention of a model with positions (its forward keeps its last weights) on `sentence`.

    Returns: words; weights (h, S, S) for that sentence; received (S,) the weight each position
    receives, averaged over the heads and over the (non-pad) queries; argmax and order of
    `received`; the model's prediction, the sentence's label and the logit margin of the label.
    """
    ids, pad_mask = reviews.encode([sentence])
    with no_grad():
        logits = model(ids, pad_mask).data[0]
    n_words = len(sentence.split())
    weights = model.layer.attention.last_attention.data[0][:, :n_words, :n_words]   # (h, S, S)
    received = weights.mean(axis=(0, 1))
    return {"words": sentence.split(), "weights": weights, "received": received,
            "argmax": int(received.argmax()), "order": [int(i) for i in np.argsort(-received)],
            "prediction": int(logits.argmax()), "label": reviews.label_of(sentence),
            "logit_margin": float(logits[reviews.label_of(sentence)] -
                                  logits[1 - reviews.label_of(sentence)])}


def attention_over_seeds(seeds=(common.DEFAULT_SEED,), steps: int = STEPS,
                         sentence: str = reviews.NOTES_SENTENCE) -> dict:
    """attention() of the model with positions trained `steps` Adam steps at every seed (Part 2's,
    if it ran: sentiment_train keeps them) -> {"seeds", "per_seed": [one attention() per seed, with
    its "seed"], "claims": the margin at each seed (> 0 where it holds) by which position 8
    receives the most, "but" (position 4) the second most, the prediction is right}."""
    seeds = list(seeds)
    trained = sentiment_train.train_many(sentiment_train.transformer_runs(seeds, steps,
                                                                          positions=(True,)))
    per_seed = [dict(attention(sentiment_train.load_transformer(True, result["parameters"]),
                               sentence), seed=seed)
                for seed, result in zip(seeds, trained)]
    return {"seeds": seeds, "per_seed": per_seed,
            "claims": {"most_on_deciding": [most_margin(r["received"], DECIDING) for r in per_seed],
                       "but_second": [second_margin(r["received"], BUT) for r in per_seed],
                       "correct": [r["logit_margin"] for r in per_seed]}}


def most_margin(received: np.ndarray, i: int) -> float:
    """How much more position i receives than any other (< 0: how much less than the most)."""
    return float(received[i] - np.delete(received, i).max())


def second_margin(received: np.ndarray, i: int) -> float:
    """> 0: position i is second, by the smaller of its gaps to the first and the third; < 0: minus
    its gap to whatever is second."""
    order = np.argsort(-received)
    if order[1] == i:
        return float(min(received[order[0]] - received[i], received[i] - received[order[2]]))
    return -float(abs(received[order[1]] - received[i]))


LABEL_NAMES = ("negative", "positive")


def ranked_word(result: dict, place: int) -> str:
    """The position and word that receives the place-th most attention (0: the most)."""
    i = result["order"][place]
    return f"{i} {result['words'][i]!r}"


def place_of(result: dict, i: int) -> str:
    """Position i's place in the attention it receives: '1st', '2nd', ..."""
    rank = result["order"].index(i) + 1
    return f"{rank}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(rank, 'th')}"


def show_attention(args):
    common.header(3, __doc__, f'"{reviews.NOTES_SENTENCE}"')
    seeds, steps = common.seeds_of(args), steps_of(args)
    s = attention_over_seeds(seeds, steps)
    r = s["per_seed"][0]
    common.note(f"seed {seeds[0]}, after {steps} Adam steps, the weight each position receives "
                f"(mean over the queries):")
    # positions and words in the (unmarked) header; the weights, digits of the float kernels, on ⚙
    # rows
    rows = [["mean over heads", *r["received"]]] + [[f"head {h}", *head.mean(axis=0)]
                                                    for h, head in enumerate(r["weights"])]
    common.table(rows, ["position, word", *(f"{i} {w}" for i, w in enumerate(r["words"]))],
                 floatfmt=".3f", kernel_dependent=True)
    if len(seeds) > 1:
        common.note(f"\nat each of {len(seeds)} seeds (the ⚙ row under a seed: the weights):")
        print_places(s["per_seed"])
    c = s["claims"]
    common.count_line(f"position {DECIDING} ('bad', the adjective after 'but') gets the most "
                      "attention", c["most_on_deciding"],
                      "of the weight (its weight − the next most's)", digits=3, notes="position 8")
    common.count_line(f"position {BUT} ('but') gets the second most", c["but_second"],
                      "of the weight (its least gap to 1st and 3rd; where not second, minus its "
                      "gap to the second)", digits=3, notes="then 'but'")
    common.count_line(f"predicted {LABEL_NAMES[r['label']]}, the label", c["correct"],
                      "logits (the label's − the other's)", digits=2)
    draw_attention(s, args.figures)


def print_places(per_seed: list):
    """At each seed: the three positions that receive the most attention, the place of 'but' and
    the prediction; under it, on a ⚙ row, their weights."""
    rows = []
    for result in per_seed:
        seed = str(result["seed"])
        rows.append([f"{common.KERNELS} {seed}",
                     *(ranked_word(result, k) for k in range(3)),
                     place_of(result, BUT), LABEL_NAMES[result["prediction"]]])
        rows.append([f"{common.KERNELS} weight",
                     *(f"{result['received'][result['order'][k]]:.3f}" for k in range(3)),
                     f"{result['received'][BUT]:.3f}", ""])
    common.table(rows, ["seed", "most attention", "second most", "third most", "'but' comes",
                        "predicted as"], disable_numparse=True)


@common.draws_figure
def draw_attention(s: dict, figures_dir):
    import matplotlib.pyplot as plt
    r = s["per_seed"][0]
    words = [f"{i} {w}" for i, w in enumerate(r["words"])]
    fig, (ax, bar) = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [1.2, 1]},
                                  layout="constrained")
    image = ax.imshow(r["weights"].mean(axis=0), cmap="Blues", vmin=0)
    ax.set_xticks(range(len(words)), words, rotation=60, ha="right")
    ax.set_yticks(range(len(words)), words)
    ax.set_xlabel("key (attended to)")
    ax.set_ylabel("query")
    ax.set_title(f"attention weights at seed {r['seed']}, mean over heads")
    fig.colorbar(image, ax=ax, fraction=0.046)
    others_of_seed = [i for i in range(len(words)) if i != r["argmax"]]
    bar.bar(others_of_seed, r["received"][others_of_seed], color="C0", label=f"seed {r['seed']}")
    bar.bar([r["argmax"]], [r["received"][r["argmax"]]], color="C3",
            label=f"seed {r['seed']}: the most attention")
    others = s["per_seed"][1:]
    for j, other in enumerate(others):
        bar.plot(range(len(words)), other["received"], "k.", ms=5,
                 label="other seeds" if j == 0 else None)
    bar.set_xticks(range(len(words)), words, rotation=60, ha="right")
    bar.set_title("weight received, mean over heads and queries")
    bar.legend(fontsize=8)
    fig.suptitle(f"\"{' '.join(r['words'])}\": the Transformer with learned positions")
    common.save_figure(fig, "07_attention", figures_dir)


SEEDS = 5   # the default of --seeds: how many seeds a training claim is counted over
PARTS = {1: show_parity, 2: show_accuracy, 3: show_attention}

if __name__ == "__main__":
    # Part 2's models may train while Part 1 computes
    common.main(__doc__, PARTS, seeds=SEEDS, train_ahead={2: part2_runs, 3: part3_runs})
