"""Script 01 · Attention: soft lookup, why √d, the causal mask, no positions, RNN vs attention.

Part 1 · §2.1 Attention as a soft lookup
Part 2 · §2.2 Why divide by √d
Part 3 · §2.3 The causal mask: the decoder cannot see the future
Part 4 · §2.4 Without positions attention is permutation-equivariant
Part 5 · §1.2 RNN vs attention, d = 512

Serves notes §1.2 (part 5) and §2.1-§2.4 (parts 1-4). Parts 3 and 4 run the attention layers of
transformer.py, built on lecture 5's tensor.py.

    python code/lecture06/01_attention.py [--part N] [--seed S] [--quick] [--no-figures]
"""
from __future__ import annotations

import sys

try:   # first: one BLAS thread before numpy loads
    from lecture06 import common
except ModuleNotFoundError as missing:   # the course's package is not installed in this Python
    sys.exit(f"{missing} in {sys.executable}: run `make venv`, then .venv/bin/python {sys.argv[0]}")

import math


import numpy as np
from lecture05 import tensor
from lecture06 import transformer
from lecture05.tensor import Tensor, no_grad

ROUNDING = 1e-15  # float64: differences this small are summation order, not information
CONTRAST = ("the plot was good but the acting was bad", "the acting was bad but the plot was good")


def softmax(scores: np.ndarray) -> np.ndarray:
    """transformer.py's softmax (max subtracted, built from tensor.py primitives) on a plain
    array."""
    with no_grad():
        return transformer.softmax(Tensor(scores), dim=-1).data


# ---- Part 1 · §2.1 ------------------------------------------------------------------------------
def soft_lookup(query=(0.1, 0.9, 0.3, 0.0), values=(10.0, 20.0, 30.0, 40.0),
                scales=(1, 4, 16, 64)) -> dict:
    """Attention as a soft dictionary: 4 orthogonal keys (the 4×4 identity), raw scores q·kᵢ times a
    scale.

    best_key: the key with the largest score (numbered from 1), the one a hard lookup would return;
    distances: |output − its value| at each scale."""
    keys = np.eye(len(values))
    query, values = np.asarray(query, dtype=float), np.asarray(values, dtype=float)
    rows = []
    for scale in scales:
        weights = softmax(scale * (keys @ query))
        rows.append({"scale": scale, "weights": weights, "output": float(weights @ values)})
    best = int(np.argmax(keys @ query))
    distances = [abs(row["output"] - values[best]) for row in rows]
    return {"keys": keys, "query": query, "values": values, "rows": rows, "best_key": best + 1,
            "best_value": float(values[best]), "distances": distances,
            "approaches": all(a > b for a, b in zip(distances, distances[1:]))}


def show_soft_lookup(args):
    common.header(1, __doc__)
    r = soft_lookup()
    common.note(f"keys = the 4×4 identity, values = {r['values'].tolist()}, query q = "
                f"{r['query'].tolist()}, scores = scale · q·kᵢ")
    common.table([[row["scale"], *row["weights"], row["output"]] for row in r["rows"]],
                 ["scale", "w₁", "w₂", "w₃", "w₄", "output Σ wᵢvᵢ"], floatfmt=".3f")
    first, last = r["rows"][0], r["rows"][-1]
    trend = "closer at every scale" if r["approaches"] else "NOT closer at every scale"
    common.note(f"Sharper scores, harder lookup: the output moves from {first['output']:.3f} "
                f"(scale {first['scale']}) to {last['output']:.3f} (scale {last['scale']}), "
                f"{trend} to key {r['best_key']}'s value, {r['best_value']:g}\n(key "
                f"{r['best_key']} has the largest score q·kᵢ; notes: 23.795 → 20.000).")


# ---- Part 2 · §2.2 ------------------------------------------------------------------------------
def softmax_jacobian(p: np.ndarray) -> np.ndarray:
    """∂softmax/∂scores = diag(p) − ppᵀ for each row of p: (..., n) -> (..., n, n). Zero at a
    one-hot p."""
    return p[..., :, None] * np.eye(p.shape[-1]) - p[..., :, None] * p[..., None, :]


def score_scaling(dims=(4, 16, 64, 256, 1024), n_keys: int = 32, trials: int = 2000,
                  seed: int = 0) -> dict:
    """One query against n_keys keys, all entries iid N(0, 1), `trials` times for each d.

    For raw scores q·k and scaled ones q·k/√d: the variance of the scores, the softmax's mean max
    weight and entropy, and the mean Frobenius norm of its Jacobian diag(p) − ppᵀ (what the
    gradient to q and k is multiplied by).
    """
    rng = np.random.default_rng(seed)
    rows = []
    for d in dims:
        scores = []
        # chunks keep memory small at d = 1024; float32 draws twice as fast
        for start in range(0, trials, 250):
            c = min(250, trials - start)
            q = rng.standard_normal((c, d, 1), dtype=np.float32)
            keys = rng.standard_normal((c, n_keys, d), dtype=np.float32)
            # (c, n_keys, d) @ (c, d, 1) -> (c, n_keys)
            scores.append((keys @ q)[..., 0])
        raw = np.concatenate(scores).astype(np.float64)       # (trials, n_keys)
        row = {"d": d}
        for name, s in (("raw", raw), ("scaled", raw / math.sqrt(d))):
            p = softmax(s)                                    # (trials, n_keys)
            jacobian = softmax_jacobian(p)                    # (trials, n_keys, n_keys)
            row[name] = {
                "var": float(s.var()),
                "max_weight": float(p.max(axis=1).mean()),
                "entropy": float(-(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1).mean()),
                "jacobian": float(np.linalg.norm(jacobian, axis=(1, 2)).mean()),
            }
        rows.append(row)
    return {"n_keys": n_keys, "trials": trials, "uniform_entropy": math.log(n_keys), "rows": rows}


def show_score_scaling(args):
    common.header(2, __doc__)
    r = score_scaling(trials=200 if args.quick else 2000, seed=args.seed)
    common.note(f"q, k with iid N(0, 1) entries; each query against {r['n_keys']} keys, "
                f"{r['trials']} trials; a uniform softmax has max weight {1 / r['n_keys']:.3f}, "
                f"entropy {r['uniform_entropy']:.3f} nats")
    rows = []
    for row in r["rows"]:
        raw, scaled = row["raw"], row["scaled"]
        rows.append([row["d"], raw["var"], math.sqrt(raw["var"]), scaled["var"],
                     raw["max_weight"], scaled["max_weight"], raw["entropy"], scaled["entropy"],
                     raw["jacobian"], scaled["jacobian"]])
    common.table(rows, ["d", "var(q·k)", "std(q·k)", "var(q·k/√d)", "max weight, raw",
                        "max weight, scaled", "entropy raw (nats)", "entropy scaled (nats)",
                        "‖J‖_F raw", "‖J‖_F scaled"],
                 floatfmt=("g", ".1f", ".2f", ".3f", ".3f", ".3f", ".3f", ".3f", ".3f", ".3f"))
    common.note("J = diag(p) − ppᵀ, the softmax's Jacobian (what the gradient to q and k is "
                "multiplied by); ‖·‖_F its Frobenius norm, the mean over the trials.")
    rows, first, last = r["rows"], r["rows"][0], r["rows"][-1]
    ratios = [row["raw"]["var"] / row["d"] for row in rows]

    def spread(kind, key, digits=3):
        values = [row[kind][key] for row in rows]
        return f"{min(values):.{digits}f}-{max(values):.{digits}f}"

    def moves(key):
        before, after = first["raw"][key], last["raw"][key]
        return f"{'rises' if after > before else 'falls'} {before:.3f} → {after:.3f}"

    common.note(f"Raw scores: var(q·k)/d = {min(ratios):.2f}-{max(ratios):.2f} at every d; from d "
                f"= {first['d']} to {last['d']} the max weight {moves('max_weight')} (one-hot is "
                f"1)\nand ‖J‖_F {moves('jacobian')}: little gradient reaches Q and K. Scaled: var "
                f"{spread('scaled', 'var')}, max weight {spread('scaled', 'max_weight')}, ‖J‖_F "
                f"{spread('scaled', 'jacobian')} at every d.")
    draw_saturation(r, args.figures)


@common.draws_figure
def draw_saturation(r, figures_dir):
    import matplotlib.pyplot as plt
    dims = [row["d"] for row in r["rows"]]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, key, title in ((axes[0], "max_weight", "mean max softmax weight"),
                           (axes[1], "jacobian", "mean ‖diag(p) − ppᵀ‖_F")):
        for name, label, style in (("raw", "raw q·k", "o-"), ("scaled", "q·k / √d", "s-")):
            ax.plot(dims, [row[name][key] for row in r["rows"]], style, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(dims, [str(d) for d in dims])
        ax.minorticks_off()
        ax.set_xlabel("d")
        ax.set_title(title)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].axhline(1 / r["n_keys"], color="grey", lw=0.8, ls=":", label="uniform (1/32)")
    axes[0].legend()
    fig.suptitle(f"Softmax over {r['n_keys']} keys, {r['trials']} trials: raw scores saturate, "
                 f"scaled do not")
    fig.tight_layout()
    common.save_figure(fig, "01_softmax_saturation", figures_dir)


# ---- Part 3 · §2.3 ------------------------------------------------------------------------------
def causal_mask(seq_len: int = 5, n_embd: int = 16, n_head: int = 2, n_vocab: int = 10,
                seed: int = 0) -> dict:
    """The causal mask, a random-init DecoderLM's attention weights, and replacing token j.

    Replacing token j must leave every output at positions < j bit-identical (0.0 change) and
    change every output at positions ≥ j.
    """
    transformer.set_seed(seed)
    # (1, 1, S, S) -> (S, S)
    mask = transformer.MultiHeadAttention.create_causal_mask(seq_len).data[0, 0]
    model = transformer.DecoderLM(n_vocab, n_embd, n_head, n_positions=seq_len, n_layers=2,
                                  p_dropout=0.0).eval()
    ids = np.random.default_rng(seed).integers(0, n_vocab, (1, seq_len))
    with no_grad():
        logits = model(ids).data[0]                                         # (S, V)
        # (L, h, S, S)
        weights = np.stack([layer.attention.last_attention.data[0] for layer in model.layers])
        replaced = []
        for j in range(seq_len):
            other = ids.copy()
            other[0, j] = (ids[0, j] + 1) % n_vocab
            # (S,): max |Δ logit| per position
            change = np.abs(model(other).data[0] - logits).max(axis=-1)
            replaced.append({"j": j, "old": int(ids[0, j]), "new": int(other[0, j]),
                             "change": change})
    above = np.triu(np.ones((seq_len, seq_len), dtype=bool), k=1)
    return {"mask": mask, "ids": ids[0], "weights": weights,
            "max_weight_above_diagonal": float(np.abs(weights[..., above]).max()),
            "visible_per_row": (mask == 0).sum(axis=1), "masked": int((mask != 0).sum()),
            "replaced": replaced}


def mask_text(value: float) -> str:
    return "0" if value == 0 else f"{value:.0e}".replace("e+0", "e")   # -1e+09 -> -1e9


def show_causal_mask(args):
    common.header(3, __doc__)
    common.note(f"Additive mask (row = query, column = key), {mask_text(tensor.MASK_VALUE)} "
                f"where the key is in the future:")
    r = causal_mask(seed=args.seed)
    seq_len = len(r["ids"])
    common.table([[i, *map(mask_text, row)] for i, row in enumerate(r["mask"])],
                 ["query \\ key", *range(seq_len)], disable_numparse=True)
    half = seq_len * (seq_len - 1) // 2
    common.note(f"Position i sees {', '.join(map(str, r['visible_per_row']))} positions; "
                f"{r['masked']} of {seq_len * seq_len} entries are masked "
                f"({'=' if r['masked'] == half else '≠'} S(S−1)/2 = {half}).")
    common.note(f"\nAttention weights of a random-init 2-layer DecoderLM (layer 0, head 0), "
                f"tokens {r['ids'].tolist()}:")
    common.table([[i, *row] for i, row in enumerate(r["weights"][0, 0])],
                 ["query \\ key", *range(seq_len)],
                 floatfmt=".4f")
    common.note(f"Largest weight above the diagonal, over every layer and head: "
                f"{r['max_weight_above_diagonal']!r}")
    rows = []
    for rep in r["replaced"]:
        j, change = rep["j"], rep["change"]
        rows.append([j, f"{rep['old']} → {rep['new']}", repr(float(change[:j].max())) if j
                     else "— (none)",
                     f"{change[j:].min():.3g}", f"{int((change[j:] > 0).sum())} of {seq_len - j}"])
    common.note("\nReplace token j and compare the logits at every position:")
    common.table(rows,
                 ["j", "token", "max |Δ| at positions < j", "min over positions ≥ j of max |Δ|",
                        "positions ≥ j changed"], disable_numparse=True)
    draw_causal_weights(r, args.figures)


@common.draws_figure
def draw_causal_weights(r, figures_dir):
    import matplotlib.pyplot as plt
    w = r["weights"][0, 0]
    fig, ax = plt.subplots(figsize=(4.4, 3.8))
    image = ax.imshow(w, cmap="viridis", vmin=0, vmax=1)
    for (i, j), value in np.ndenumerate(w):
        ax.text(j, i, "0" if value == 0 else f"{value:.2f}", ha="center", va="center",
                color="white" if value < 0.6 else "black", fontsize=9)
    ax.set_xlabel("key position")
    ax.set_ylabel("query position")
    ax.set_title("Causal attention weights (random init)\nabove the diagonal: exactly 0",
                 fontsize=10)
    fig.colorbar(image, ax=ax, fraction=0.046)
    common.save_figure(fig, "01_causal_weights", figures_dir)


# ---- Part 4 · §2.4 ------------------------------------------------------------------------------
POOLINGS = ("no positions", "learned positions", "no positions, causal mask")


def permutation(n_embd: int = 16, n_head: int = 2, seed: int = 0) -> dict:
    """Embedding → one bidirectional TransformerLayer → mean pooling (script 07's encoder), at
    random init.

    pooled[name] = (max |Δ|, ‖Δ‖₂) between the two contrast sentences' pooled vectors: the notes do
    not say which norm their 0.084 is. causal=False: a causal mask ties each query to its position,
    so a causal layer is NOT permutation-equivariant (the last row shows it: GPT without position
    embeddings still sees order).
    """
    words = sorted(set(" ".join(CONTRAST).split()))
    sentences = [np.array([[words.index(w) for w in s.split()]]) for s in CONTRAST]   # 2 × (1, 9)
    seq_len = sentences[0].shape[1]
    transformer.set_seed(seed)
    tokens = transformer.Embedding(len(words), n_embd)
    positions = transformer.Embedding(seq_len, n_embd)
    layer = transformer.TransformerLayer(n_embd, n_head, p_dropout=0.0, causal=False).eval()

    def encode(ids, with_positions: bool) -> np.ndarray:
        x = tokens(ids)                                              # (1, S, D)
        if with_positions:
            x = x + positions(np.arange(ids.shape[1])[None, :])
        return layer(x).data[0]                                      # (S, D)

    with no_grad():
        perm = np.random.default_rng(seed).permutation(seq_len)
        shuffle_error = np.abs(encode(sentences[0][:, perm],
                                      False) - encode(sentences[0], False)[perm]).max()
        pooled = {}
        for name, with_positions, causal in zip(POOLINGS, (False, True, False),
                                                (False, False, True)):
            # the same weights, mask on or off
            layer.attention.causal = causal
            # mean pooling -> (D,)
            a, b = (encode(s, with_positions).mean(axis=0) for s in sentences)
            pooled[name] = (float(np.abs(a - b).max()), float(np.linalg.norm(a - b)))
        layer.attention.causal = False
    return {"sentences": CONTRAST, "n_tokens": seq_len, "same_words": sorted(CONTRAST[0].split()) ==
            sorted(CONTRAST[1].split()), "perm": perm, "shuffle_error": float(shuffle_error),
            "pooled": pooled}


def permutation_over_seeds(seeds=range(10), n_embd: int = 16, n_head: int = 2) -> dict:
    """permutation() at each seed (a new random init and shuffle each): per pooling and norm, the
    values over the seeds with their median and range, and the largest shuffle error."""
    runs = [permutation(n_embd, n_head, seed) for seed in seeds]
    spread = {}
    for name in POOLINGS:
        for i, norm in enumerate(("max", "l2")):
            values = [run["pooled"][name][i] for run in runs]
            spread[name, norm] = dict(values=values, median=float(np.median(values)),
                                      min=min(values), max=max(values))
    return {"seeds": list(seeds), "n_embd": n_embd, "runs": runs, "spread": spread,
            "shuffle_error": max(run["shuffle_error"] for run in runs)}


NOTES_WITH_POSITIONS = 0.084   # §2.4's "加上位置嵌入后两者差 0.084", in a norm the notes do not name


def show_permutation(args):
    common.header(4, __doc__)
    seeds = range(args.seed, args.seed + 10)     # no training: ten random inits cost milliseconds
    r = permutation_over_seeds(seeds)
    first, n, spread = r["runs"][0], len(r["seeds"]), r["spread"]
    common.note(f"Embedding (d = {r['n_embd']}) → one bidirectional Transformer layer (random "
                f"init), {first['n_tokens']} tokens; seed {args.seed} shuffles them by "
                f"{first['perm'].tolist()}:")
    # which of many rounding-level differences is the largest, and so its digits, depends on the
    # BLAS kernels
    common.kernel_note(f"max |layer(shuffled x) − shuffled layer(x)| = "
                       f"{first['shuffle_error']:.1e} (the largest over {n} seeds: "
                       f"{r['shuffle_error']:.1e})")
    common.note(f"\nMean-pooled representations of “{first['sentences'][0]}” "
                f"and\n“{first['sentences'][1]}” ({first['n_tokens']} tokens each, the same words: "
                f"{first['same_words']}); Δ = their difference; {n} seeds, "
                f"{r['seeds'][0]}-{r['seeds'][-1]}.")
    rounding = sum(max(run["pooled"]["no positions"]) <= ROUNDING for run in r["runs"])
    common.note(f"No positions: max |Δ| and ‖Δ‖₂ ≤ {ROUNDING:.0e} on {rounding} of {n} seeds, "
                f"rounding: the same words, summed in another order.")
    common.kernel_note(f"no positions, the largest over the seeds: max |Δ| "
                       f"{spread['no positions', 'max']['max']:.1e}, ‖Δ‖₂ "
                       f"{spread['no positions', 'l2']['max']:.1e}")
    rows = []
    for name in POOLINGS[1:]:
        row = [name]
        for i, norm in enumerate(("max", "l2")):
            s = spread[name, norm]
            row += [f"{first['pooled'][name][i]:.3f}", f"{s['median']:.3f}",
                    f"{s['min']:.3f} to {s['max']:.3f}"]
        rows.append(row)
    common.table(rows, ["model", f"max |Δ|, seed {args.seed}", "max |Δ|, median",
                        "max |Δ|, range over seeds", f"‖Δ‖₂, seed {args.seed}", "‖Δ‖₂, median",
                        "‖Δ‖₂, range over seeds"],
                 disable_numparse=True)
    inside = lambda norm: ("inside" if spread["learned positions",
                                              norm]["min"] <= NOTES_WITH_POSITIONS
                           <= spread["learned positions", norm]["max"] else "outside")
    common.note(f"The notes' {NOTES_WITH_POSITIONS} with positions (norm not named) is "
                f"{inside('max')} the range of max |Δ| and {inside('l2')} that of ‖Δ‖₂.\nWithout "
                f"positions the two sentences are one bag of words; position embeddings tell them "
                f"apart.\nA causal mask also breaks the symmetry: a position sees only its prefix.")


# ---- Part 5 · §1.2 ------------------------------------------------------------------------------
D_MODEL = 512   # §1.2's width


def tanh(x: Tensor) -> Tensor:
    """tanh from tensor.py's primitives: 2σ(2x) − 1."""
    return (x * 2.0).sigmoid() * 2.0 - 1.0


def unrolled_rnn(inputs: list, w_h: Tensor, w_x: Tensor) -> Tensor:
    """h_t = tanh(h_{t−1} W_h + x_t W_x) from h_0 = 0 over the (1, d) inputs x_1 … x_n: W [h; x]
    with W = [W_h; W_x] of size 2d × d, as two (d, d) mat-vecs a step. Returns h_n."""
    h = Tensor(np.zeros((1, w_h.shape[0])))
    for x in inputs:                 # each step needs the h of the step before
        h = tanh(h @ w_h + x @ w_x)
    return h


def matmul_chains(output: Tensor) -> dict:
    """id of every tensor `output` was computed from (its own included) -> (fewest, most) matmuls on
    a path from it to `output`: a walk over tensor.py's graph, children before parents."""
    chains = {id(output): (0, 0)}
    for node in reversed(tensor.graph(output)):
        fewest, most = chains[id(node)]
        step = int(node._op == "matmul")
        for parent in node._parents:
            known = chains.get(id(parent), (math.inf, -math.inf))
            chains[id(parent)] = (min(known[0], fewest + step), max(known[1], most + step))
    return chains


def depends(output: Tensor, grad: np.ndarray, source: Tensor, row=...) -> bool:
    """Whether `output` (where grad is nonzero) depends on source[row]: backward() through the graph
    gives it a nonzero gradient. The walk sees whole tensors; this sees rows inside them."""
    output.backward(grad)
    return bool(np.any(source.grad[row] != 0))


def dependency_walk(n: int, d: int = 8, seed: int = 0) -> dict:
    """Serial steps and path length counted in tensor.py's graph, in matmuls: an RNN unrolled over n
    inputs and one attention layer (transformer.MultiHeadAttention, 1 head, no mask) over n tokens.

    serial: the most matmuls on any path from an input to the output, the chain that must run one
    matmul after another; path: the fewest matmuls from the first token's input to the last
    position's output (None if backward finds no dependency). Neither depends on d."""
    rng = np.random.default_rng(seed)
    w_h, w_x = (Tensor(rng.standard_normal((d, d)) / math.sqrt(d)) for _ in range(2))
    inputs = [Tensor(rng.standard_normal((1, d)), requires_grad=True) for _ in range(n)]
    h_n = unrolled_rnn(inputs, w_h, w_x)
    chains = matmul_chains(h_n)
    reached = [chains[id(x)] for x in inputs if id(x) in chains]
    rnn = {"serial": max(most for _, most in reached),
           "path": chains[id(inputs[0])][0] if id(inputs[0]) in chains
           and depends(h_n, np.ones(h_n.shape), inputs[0]) else None}
    transformer.set_seed(seed)
    layer = transformer.MultiHeadAttention(d, 1, causal=False, p_dropout=0.0).eval()
    x = Tensor(rng.standard_normal((1, n, d)), requires_grad=True)       # (B, S, D)
    y = layer(x)                                                          # (B, S, D)
    fewest, most = matmul_chains(y)[id(x)]
    last = np.zeros(y.shape)
    last[0, -1] = 1.0                                                     # the last position only
    attention = {"serial": most, "path": fewest if depends(y, last, x, (0, 0)) else None}
    return {"n": n, "d": d, "rnn": rnn, "attention": attention}


def counted_flops(d: int = D_MODEL, n: int = 128, seed: int = 0) -> dict:
    """FLOPs per token of the matmuls tensor.py runs (its count: 2 per multiply-add, from each
    matmul's shapes): an RNN over n inputs (unrolled_rnn), and one attention layer over n tokens
    split into its four projections (Q, K, V, then O) and its core (q kᵀ and weights · v)."""
    rng = np.random.default_rng(seed)
    w_h, w_x = (Tensor(rng.standard_normal((d, d)) / math.sqrt(d)) for _ in range(2))
    transformer.set_seed(seed)
    layer = transformer.MultiHeadAttention(d, 1, causal=False, p_dropout=0.0).eval()
    x = Tensor(rng.standard_normal((1, n, d)))                            # (B, S, D)
    with no_grad():
        with tensor.count_traffic() as rnn:
            unrolled_rnn([Tensor(x.data[:, t]) for t in range(n)], w_h, w_x)
        with tensor.count_traffic() as projections:
            q, kT, v = layer.project_to_query_key_value(x)
        with tensor.count_traffic() as core:
            heads = layer.self_attention(q, kT, v)
        with tensor.count_traffic() as out:
            layer.out_projection(heads)
    per_token = lambda *counts: sum(c.total("flops", "forward") for c in counts) / n
    counted = {"d": d, "n": n, "rnn": per_token(rnn), "projections": per_token(projections, out),
               "core": per_token(core)}
    counted["projections_over_rnn"] = counted["projections"] / counted["rnn"]
    return counted


def flop_formulas(d: int, lengths) -> list[dict]:
    """Per-token FLOPs of the matmuls (2 per multiply-add) at each length n: an RNN step
    h_t = tanh(W [h_{t−1}; x_t]), W of size d × 2d, makes 4d²; an attention layer makes 8d² in its
    Q, K, V, O projections and 4nd in its scores QKᵀ and weights·V."""
    return [{"n": n, "rnn": 4 * d * d, "attention": 8 * d * d + 4 * n * d,
             "ratio": (8 * d * d + 4 * n * d) / (4 * d * d)} for n in lengths]


def arithmetic_intensity(d: int, lengths, size: int) -> tuple[dict, list[dict]]:
    """(the RNN step's, the attention layer's at each n) FLOPs / bytes moved, each matmul reading
    its operands once and writing its result once (elements of `size` bytes): the RNN step reads W
    (2d²) and [h; x] (2d), writes h (d); the attention layer over n tokens moves 4d² weights, 10nd
    activations (x and q, k, v, the mixed values, the output, in and out of the four projections
    and the two attention matmuls) and 2n² scores."""
    rnn_step = {"flops": 4 * d * d, "weight_bytes": 2 * d * d * size,
                "bytes": (2 * d * d + 3 * d) * size}
    rnn_step["intensity"] = rnn_step["flops"] / rnn_step["bytes"]
    intensity = []
    for n in lengths:
        flops, moved = (8 * d * d + 4 * n * d) * n, (4 * d * d + 10 * n * d + 2 * n * n) * size
        intensity.append({"n": n, "flops": flops, "bytes": moved, "attention": flops / moved,
                          "rnn": rnn_step["intensity"],
                          "ratio": flops / moved / rnn_step["intensity"]})
    return rnn_step, intensity


def measured_gflops(d: int, timed, repeats: int, seed: int, dtype) -> list[dict]:
    """At each n of `timed`: the best of `repeats` wall-clock times of numpy's RNN over n inputs (n
    dependent mat-vecs) and of its attention layer over n tokens (one pass), and their GFLOP/s."""
    rng = np.random.default_rng(seed)
    w_rnn = (rng.standard_normal((d, 2 * d)) / math.sqrt(2 * d)).astype(dtype)
    w_qkv = (rng.standard_normal((d, 3 * d)) / math.sqrt(d)).astype(dtype)
    w_o = (rng.standard_normal((d, d)) / math.sqrt(d)).astype(dtype)

    def rnn(x):
        z = np.zeros(2 * d, dtype=dtype)               # [h; x_t]
        for x_t in x:                                  # n serial steps: each needs the previous h
            z[d:] = x_t
            z[:d] = np.tanh(w_rnn @ z)                 # one (d, 2d) mat-vec
        return z[:d]

    def attention(x):
        q, k, v = np.split(x @ w_qkv, 3, axis=1)       # (n, d) @ (d, 3d) -> 3 × (n, d)
        s = q @ k.T / np.dtype(dtype).type(math.sqrt(d))  # (n, n)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        return (p / p.sum(axis=1, keepdims=True)) @ v @ w_o

    timings = []
    for n in timed:
        x = rng.standard_normal((n, d)).astype(dtype)
        row = {"n": n}
        for name, fn, flops in (("rnn", rnn, 4 * d * d * n),
                                ("attention", attention, (8 * d * d + 4 * n * d) * n)):
            best = math.inf
            for _ in range(repeats):
                with common.stopwatch() as elapsed:
                    fn(x)
                best = min(best, elapsed())
            row[name] = {"seconds": best, "gflops": flops / best / 1e9}
        timings.append(row)
    return timings


def rnn_vs_attention(d: int = D_MODEL, lengths=(128, 512, 1024, 2048, 4096, 8192),
                     timed=(512, 2048), repeats: int = 3, seed: int = 0, dtype=np.float32,
                     counted_at: int = 128, walked=(1, 2, 8, 32, 128)) -> dict:
    """Per-token FLOPs (flop_formulas; counted_flops counts them from the matmuls tensor.py runs,
    at n = counted_at); serial steps and path length walked in the graph (dependency_walk, at each
    n of `walked`); arithmetic intensity (in elements of `dtype`); measured GFLOP/s."""
    size = np.dtype(dtype).itemsize
    rnn_step, intensity = arithmetic_intensity(d, lengths, size)
    timings = measured_gflops(d, timed, repeats, seed, dtype)
    return {"d": d, "dtype": np.dtype(dtype).name, "itemsize": size,
            "rows": flop_formulas(d, lengths), "rnn_step": rnn_step,
            "counted": counted_flops(d, counted_at, seed),
            "walks": [dependency_walk(n, seed=seed) for n in walked],
            "intensity": intensity, "timings": timings}


def show_rnn_vs_attention(args):
    common.header(5, __doc__, f"d = {D_MODEL}")
    r = rnn_vs_attention(D_MODEL, timed=(256,) if args.quick else (512, 1024), repeats=3,
                         seed=args.seed)
    print_flops(r["d"], r["rows"], r["counted"])
    print_walks(r["walks"])
    print_intensity(r)
    for row in r["timings"]:
        rnn, att = row["rnn"], row["attention"]
        common.timing(f"n = {row['n']}: RNN {rnn['gflops']:.1f} GFLOP/s ({row['n']} mat-vecs, "
                      f"{rnn['seconds'] * 1e3:.1f} ms); attention {att['gflops']:.1f} GFLOP/s "
                      f"(one pass, {att['seconds'] * 1e3:.1f} ms)")


def print_flops(d: int, rows: list[dict], counted: dict):
    common.table([[row["n"], row["rnn"], row["attention"], row["ratio"]] for row in rows],
                 ["n (tokens)", "RNN FLOPs/token (4d²)", "attention FLOPs/token (8d²+4nd)",
                  "FLOPs/token, attention / RNN (2 + n/d)"],
                 floatfmt=("g", ",", ",", ".2f"), intfmt=",")
    cheaper = [row["n"] for row in rows if row["ratio"] < 1]
    verdict = ("attention saves no FLOPs at any n here" if not cheaper
               else f"attention costs fewer FLOPs at n = {', '.join(map(str, cheaper))}")
    common.note(f"Look at the last column: {verdict}, and the ratio grows with n: "
                f"{rows[0]['ratio']:.2f} at n = {rows[0]['n']:,}, {rows[-1]['ratio']:.2f} at n = "
                f"{rows[-1]['n']:,}.")
    agrees = lambda value, formula: "=" if value == formula else "≠"
    common.note(f"Counted from the matmuls tensor.py runs (FLOPs per token, n = "
                f"{counted['n']}): an RNN step {counted['rnn']:,.0f} "
                f"({agrees(counted['rnn'], 4 * d * d)} 4d²);\n"
                f"attention's four projections {counted['projections']:,.0f} "
                f"({agrees(counted['projections'], 8 * d * d)} 8d²), alone "
                f"{counted['projections_over_rnn']:g}× the RNN's step (notes: 2×), and its core "
                f"(q kᵀ, weights · v)\n{counted['core']:,.0f} "
                f"({agrees(counted['core'], 4 * counted['n'] * d)} 4nd).")


def print_walks(walks: list[dict]):
    path = lambda steps: "no path" if steps is None else steps
    common.note(f"\nSerial steps and path length, counted in matmuls by walking tensor.py's graph "
                f"(d = {walks[0]['d']}; neither depends on d):\nan RNN unrolled over n inputs, and "
                f"one attention layer over n tokens.")
    common.table([[w["n"], w["rnn"]["serial"], w["attention"]["serial"], path(w["rnn"]["path"]),
                   path(w["attention"]["path"])] for w in walks],
                 ["n (tokens)", "serial steps: RNN", "serial steps: attention",
                  "path first→last token: RNN", "path: attention"], intfmt=",")
    grows = all(w["rnn"]["serial"] == w["rnn"]["path"] == w["n"] for w in walks)
    flat = len({(w["attention"]["serial"], w["attention"]["path"]) for w in walks}) == 1
    common.note(f"Serial steps: the most matmuls on any chain from an input to the output; path: "
                f"the fewest from the first\ntoken's input to the last position's output "
                f"(backward() confirms that output depends on it). For the RNN\nboth "
                f"{'equal n' if grows else 'do NOT equal n'}; for attention they are "
                f"{'the same at every n' if flat else 'NOT the same at every n'} (the chain: q "
                f"or k projection, q kᵀ,\nweights · v, out projection; the path from x₁ through v "
                f"skips q kᵀ).")


def print_intensity(r: dict):
    d, step = r["d"], r["rnn_step"]
    common.note(f"\nArithmetic intensity ({r['dtype']}, {r['itemsize']} bytes an element): FLOPs "
                f"per byte the matmuls read and write.\nAn RNN step is one ({d}, {2 * d}) mat-vec: "
                f"{step['flops']:,} FLOPs (4d²) on {step['weight_bytes']:,} bytes of weights "
                f"({2 * r['itemsize']}d²)\nplus 3d vector elements: {step['intensity']:.2f} "
                f"FLOP/byte at every n, order 1 (the notes' \"about 1\").")
    common.table([[row["n"], row["flops"], row["bytes"], row["attention"], row["rnn"], row["ratio"]]
                  for row in r["intensity"]],
                 ["n (tokens)", "attention layer FLOPs, (8d²+4nd)·n",
                  f"bytes moved, {r['itemsize']}·(4d²+10nd+2n²)",
                  "attention (FLOP/byte)", "RNN step (FLOP/byte)",
                  "intensity, attention / RNN (×)"],
                 floatfmt=("g", ",", ",", ".0f", ".2f", ".0f"), intfmt=",")
    common.note(f"A mat-vec uses each weight it fetches once, so memory bandwidth bounds it; "
                f"attention's big matmuls reuse each weight\nn times, and it runs them in one pass "
                f"instead of n dependent mat-vecs. What that buys on your CPU ({r['dtype']}, numpy "
                f"BLAS,\none thread each) is printed when you run it, on the ⏱ lines.")


PARTS = {1: show_soft_lookup, 2: show_score_scaling, 3: show_causal_mask, 4: show_permutation,
         5: show_rnn_vs_attention}

if __name__ == "__main__":
    common.main(__doc__, PARTS, uses_torch=False)
