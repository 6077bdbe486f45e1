"""Script 02 · Positions: sinusoidal encoding, its rotation, learned tables, √d, shared embeddings.

Part 1 · §4.2 Sinusoidal position encoding, d = 512
Part 2 · §4.2 PE(t+k) is a rotation of PE(t); PE(t)·PE(t+k) depends only on k
Part 3 · §4.3 A learned position table fixes the maximum length
Part 4 · §4.4 Why the embeddings are multiplied by √d
Part 5 · §4.1 Parameters of the original Transformer, V = 37,000 shared BPE vocabulary

Serves notes §4.1 (part 5) and §4.2-§4.4 (parts 1-4). The encoding is
transformer.sinusoidal_positions, the one the models use.

    python code/lecture06/02_positions.py [--part N] [--seed S] [--quick] [--no-figures]
"""
from __future__ import annotations

import sys

try:   # first: one BLAS thread before numpy loads
    from lecture06 import common
except ModuleNotFoundError as missing:   # the course's package is not installed in this Python
    sys.exit(f"{missing} in {sys.executable}: run `make venv`, then .venv/bin/python {sys.argv[0]}")

import math


import numpy as np
from lecture06 import transformer
from lecture05.tensor import no_grad

D_MODEL = 512   # the paper's base width, used by parts 1-4


# ---- Part 1 · §4.2 ------------------------------------------------------------------------------
def sinusoidal(d: int = D_MODEL, n_positions: int = 2048) -> dict:
    """Wavelengths, the smallest distance between two positions' encodings, nearest neighbours,
    bounds."""
    pe = transformer.sinusoidal_positions(n_positions, d)                           # (T, d)
    # (d/2,) positions per turn
    wavelengths = 2 * math.pi / transformer.sinusoidal_frequencies(d)
    squared = (pe * pe).sum(axis=1)
    dist = np.sqrt(np.maximum(squared[:, None] + squared[None, :] - 2 * pe @ pe.T, 0.0))  # (T, T)
    np.fill_diagonal(dist, np.inf)
    nearest = dist.argmin(axis=1)
    # the distance between PE(t) and PE(t+1) is the same for every t: √(2 Σᵢ (1 − cos ωᵢ))
    adjacent = math.sqrt(2 * (1 - np.cos(transformer.sinusoidal_frequencies(d))).sum())
    return {"d": d, "n_positions": n_positions, "pe": pe,
            "fastest_wavelength": float(wavelengths[0]),
            "slowest_wavelength": float(wavelengths[-1]),
            "min_distance": float(dist.min()),
            "max_nearest_distance": float(dist.min(axis=1).max()),
            "adjacent_distance_formula": adjacent,
            "nearest_is_adjacent": bool((np.abs(nearest - np.arange(n_positions)) == 1).all()),
            "min_component": float(pe.min()), "max_component": float(pe.max())}


def show_sinusoidal(args):
    common.header(1, __doc__, f"d = {D_MODEL}")
    r = sinusoidal(D_MODEL, n_positions=1024 if args.quick else 2048)
    T, d = r["n_positions"], r["d"]
    common.table([
        ["wavelength of the fastest pair, 2π/ω₀", f"{r['fastest_wavelength']:.1f} positions"],
        [f"wavelength of the slowest pair, 2π·10000^({d - 2}/{d})",
         f"{r['slowest_wavelength']:,.0f} positions"],
        [f"smallest distance between two of the first {T:,} positions", f"{r['min_distance']:.3f}"],
        ["largest nearest-neighbour distance", f"{r['max_nearest_distance']:.3f}"],
        ["√(2 Σ (1 − cos ωᵢ)): the distance from t to t+1, any t",
         f"{r['adjacent_distance_formula']:.3f}"],
        ["every position's nearest neighbour is t − 1 or t + 1", r["nearest_is_adjacent"]],
        ["smallest / largest component", f"{r['min_component']:.6f} / {r['max_component']:.6f}"],
    ], ["quantity", "value"], disable_numparse=True)
    distinct = "different" if r["min_distance"] > 0 else "NOT different"
    nearest = "closest" if r["nearest_is_adjacent"] else "NOT always closest"
    bounded = -1 <= r["min_component"] and r["max_component"] <= 1
    common.note(f"Every encoding is {distinct} (smallest distance {r['min_distance']:.3f} > 0), "
                f"neighbours are {nearest}, and "
                f"{'nothing grows' if bounded else 'something grows'} with t (every component in "
                f"[−1, 1]).")
    draw_pe_heatmap(r, args.figures)


@common.draws_figure
def draw_pe_heatmap(r, figures_dir, n_shown: int = 256):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 3.6))
    image = ax.imshow(r["pe"][:n_shown], aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1,
                      interpolation="nearest")
    ax.set_xlabel("dimension (even: sin, odd: cos; frequency falls to the right)")
    ax.set_ylabel("position t")
    ax.set_title(f"Sinusoidal position encoding, d = {r['d']}, first {n_shown} positions")
    fig.colorbar(image, ax=ax, fraction=0.03)
    common.save_figure(fig, "02_pe_heatmap", figures_dir)


# ---- Part 2 · §4.2 ------------------------------------------------------------------------------
def rotation(d: int = D_MODEL, ks=(1, 5, 10, 100), t_rotate: int = 512, t_dot: int = 64) -> dict:
    """PE(t+k) = PE(t) R_k with R_k block-diagonal (one 2×2 rotation by ωᵢk per pair), and
    PE(t)·PE(t+k) = Σᵢ cos(ωᵢk) whatever t: both are rounding-level checks over t < t_rotate / t <
    t_dot.
    """
    omega = transformer.sinusoidal_frequencies(d)
    pe = transformer.sinusoidal_positions(max(t_rotate, t_dot) + max(ks), d)
    rows = []
    for k in ks:
        c, s = np.cos(omega * k), np.sin(omega * k)
        R = np.zeros((d, d))     # row vector PE(t) @ R: sin' = sin·c + cos·s, cos' = cos·c − sin·s
        R[0::2, 0::2], R[1::2, 0::2] = np.diag(c), np.diag(s)
        R[0::2, 1::2], R[1::2, 1::2] = np.diag(-s), np.diag(c)
        rotated = pe[:t_rotate] @ R                                        # (T, d)
        # max over each row, t < t_rotate
        errors = np.abs(rotated - pe[k:k + t_rotate]).max(axis=1)
        # PE(t)·PE(t+k), t < t_rotate; the table's mean and std over t < t_dot
        all_dots = (pe[:t_rotate] * pe[k:k + t_rotate]).sum(axis=1)
        dots, sum_cos = all_dots[:t_dot], float(np.cos(omega * k).sum())
        dot_errors = np.abs(all_dots - sum_cos)
        rows.append({"k": k, "rotation_error": float(errors.max()),
                     "dot_mean": float(dots.mean()), "dot_std": float(dots.std()),
                     "sum_cos": sum_cos,
                     # the first t_dot positions against the last t_dot below t_rotate
                     "rotation_error_early": float(errors[:t_dot].max()),
                     "rotation_error_late": float(errors[-t_dot:].max()),
                     "dot_error_early": float(dot_errors[:t_dot].max()),
                     "dot_error_late": float(dot_errors[-t_dot:].max())})
    return {"d": d, "t_rotate": t_rotate, "t_dot": t_dot, "rows": rows}


def dot_curves(d: int = D_MODEL, starts=(0, 100, 1000), max_k: int = 200) -> dict:
    """PE(t)·PE(t+k) against k for a few t, and Σᵢ cos(ωᵢk): the figure of part 2."""
    pe = transformer.sinusoidal_positions(max(starts) + max_k + 1, d)
    k = np.arange(max_k + 1)
    return {"k": k, "curves": {t: pe[t + k] @ pe[t] for t in starts},
            "sum_cos": np.cos(np.outer(k, transformer.sinusoidal_frequencies(d))).sum(axis=1)}


# Part 2's rounding, with room for any CPU's sin, cos and summation order. The rotation compares
# sin(ω(t+k)) with sin(ωt)cos(ωk) + cos(ωt)sin(ωk): each angle is stored to half its float64
# spacing, at ω₀ = 1 and t + k = 611 together 9.2e-14, plus a few units of 1e-16 from sin and cos.
ROTATION_ROUNDING = 1e-13
# A dot product sums 512 products to ≈ 250, whose float64 spacing is 2.8e-14; summed one by one
# instead of in numpy's pairwise order, its std over t comes near 1e-13.
DOT_ROUNDING = 1e-12


def show_rotation(args):
    common.header(2, __doc__)
    r = rotation()
    common.table([[row["k"], common.at_most(row["rotation_error"], ROTATION_ROUNDING),
                   f"{row['dot_mean']:.6f}", f"{row['sum_cos']:.6f}",
                   common.at_most(abs(row["dot_mean"] - row["sum_cos"]), DOT_ROUNDING),
                   common.at_most(row["dot_std"], DOT_ROUNDING)] for row in r["rows"]],
                 ["k", f"max |PE(t)R_k − PE(t+k)|, t < {r['t_rotate']}",
                  f"mean PE(t)·PE(t+k), t < {r['t_dot']}",
                  "Σᵢ cos(ωᵢk)", "|mean − Σ cos|", "std over t"],
                 disable_numparse=True, colalign=("right",) * 6)
    common.note("R_k depends on k only: one fixed linear map takes any position t to t + k.\nBoth "
                "errors are rounding, and grow with t: float64 holds an angle t·ω to half its "
                "spacing, at most 2⁻⁵³·t.")
    largest = {key: max(row[key] for row in r["rows"])
               for key in ("rotation_error_early", "rotation_error_late", "dot_error_early",
                           "dot_error_late")}
    t_dot, t_rotate = r["t_dot"], r["t_rotate"]
    common.kernel_note(f"Largest at t < {t_dot} against {t_rotate - t_dot} ≤ t < {t_rotate} "
                       f"(any k): |PE(t)R_k − PE(t+k)| {largest['rotation_error_early']:.1e} "
                       f"against {largest['rotation_error_late']:.1e}, |PE(t)·PE(t+k) − Σ cos| "
                       f"{largest['dot_error_early']:.1e} against {largest['dot_error_late']:.1e}.")
    if args.figures:  # the curves are the figure's alone
        draw_pe_dot(dot_curves(), args.figures)


@common.draws_figure
def draw_pe_dot(c, figures_dir):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.plot(c["k"], c["sum_cos"], color="black", lw=4, alpha=0.25, label="Σᵢ cos(ωᵢk)")
    for (t, curve), style in zip(c["curves"].items(), ("-", "--", ":")):
        ax.plot(c["k"], curve, style, lw=1.3, label=f"PE({t})·PE({t}+k)")
    ax.set_xlabel("distance k")
    ax.set_ylabel("dot product")
    ax.set_title("The dot product of two encodings depends only on their distance")
    ax.grid(alpha=0.3)
    ax.legend()
    common.save_figure(fig, "02_pe_dot", figures_dir)


# ---- Part 3 · §4.3 ------------------------------------------------------------------------------
def learned_limit(n_positions: int = 8, far: int = 9999, seed: int = 0) -> dict:
    """A learned position table has n_positions rows: a longer input is refused. The sinusoidal
    encoding is a formula: it has a value at any t."""
    transformer.set_seed(seed)
    ids = np.random.default_rng(seed).integers(0, 10, (1, n_positions + 1))
    results = {}
    for positions in ("learned", "sinusoidal"):
        model = transformer.DecoderLM(10, 16, 2, n_positions=n_positions, n_layers=1, p_dropout=0.0,
                                      positions=positions)
        with no_grad():
            fits = model(ids[:, :n_positions]).shape
            try:
                longer, error = model(ids).shape, None
            except ValueError as e:
                longer, error = None, str(e)
        results[positions] = {"fits": fits, "longer": longer, "error": error}
    pe_far = transformer.sinusoidal_positions(far + 1, D_MODEL)[far]
    return {"n_positions": n_positions, "models": results, "far": far, "pe_far": pe_far,
            "pe_far_finite": bool(np.isfinite(pe_far).all()), "pe_far_min": float(pe_far.min()),
            "pe_far_max": float(pe_far.max()), "pe_far_norm": float(np.linalg.norm(pe_far))}


def show_learned_limit(args):
    common.header(3, __doc__)
    r = learned_limit(seed=args.seed)
    n = r["n_positions"]
    common.table([[f"DecoderLM(n_positions={n}, positions={name!r})", f"logits {m['fits']}",
                   "ValueError" if m["error"] else f"logits {m['longer']}"] for name, m
                  in r["models"].items()],
                 ["model", f"input of length {n}", f"input of length {n + 1}"],
                 disable_numparse=True)
    common.note(f"The learned model's message:\n  {r['models']['learned']['error']}")
    common.note(f"\nSinusoidal PE at t = {r['far']} (d = {D_MODEL}): finite {r['pe_far_finite']}, "
                f"components in [{r['pe_far_min']:.4f}, {r['pe_far_max']:.4f}], norm "
                f"{r['pe_far_norm']:.4f}; first four {np.round(r['pe_far'][:4], 4).tolist()}")
    common.note(f"Computable is not the same as usable: a model never trained at t = {r['far']} "
                "may still fail there.")


# ---- Part 4 · §4.4 ------------------------------------------------------------------------------
def embedding_scale(d: int = D_MODEL, n_positions: int = 2048, seed: int = 0) -> dict:
    """N(0, 1/d) embeddings e, one per position, added to PE(t) with and without the paper's √d
    factor."""
    rng = np.random.default_rng(seed)
    pe = transformer.sinusoidal_positions(n_positions, d)
    e = rng.standard_normal((n_positions, d)) / math.sqrt(d)

    def cosine(a, b):
        return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))

    plain, scaled = cosine(e + pe, e), cosine(math.sqrt(d) * e + pe, e)
    pe_norm, e_norm = np.linalg.norm(pe, axis=1), np.linalg.norm(e, axis=1)
    return {"d": d, "n_positions": n_positions, "pe_norm_min": float(pe_norm.min()),
            "pe_norm_max": float(pe_norm.max()), "pe_norm_formula": math.sqrt(d / 2),
            "e_norm_mean": float(e_norm.mean()), "e_norm_std": float(e_norm.std()),
            "cos_plain": float(plain.mean()), "cos_plain_std": float(plain.std()),
            "cos_scaled": float(scaled.mean()), "cos_scaled_std": float(scaled.std()),
            # E‖e‖² = 1 and ‖PE‖² = d/2, and e is nearly orthogonal to PE:
            "cos_plain_expected": 1 / math.sqrt(1 + d / 2),
            "cos_scaled_expected": math.sqrt(d / (d + d / 2)),
            "plain": plain, "scaled": scaled}


def show_embedding_scale(args):
    common.header(4, __doc__)
    r = embedding_scale(seed=args.seed)
    d, T = r["d"], r["n_positions"]
    common.table([
        ["‖PE(t)‖ (min / max over t)", f"{r['pe_norm_min']:.6f} / {r['pe_norm_max']:.6f}",
         f"√(d/2) = {r['pe_norm_formula']:g}"],
        ["‖e‖, e ~ N(0, 1/d) (mean ± std)", f"{r['e_norm_mean']:.3f} ± {r['e_norm_std']:.3f}",
         "≈ 1"],
        ["cos(e + PE, e)", f"{r['cos_plain']:.3f} ± {r['cos_plain_std']:.3f}",
         f"1/√(1 + d/2) = {r['cos_plain_expected']:.3f}"],
        ["cos(√d·e + PE, e)", f"{r['cos_scaled']:.3f} ± {r['cos_scaled_std']:.3f}",
         f"√(2/3) = {r['cos_scaled_expected']:.3f}"],
    ], [f"d = {d}, averaged over {T:,} positions", "measured", "expected"], disable_numparse=True)
    plain, scaled = r["e_norm_mean"], math.sqrt(d) * r["e_norm_mean"]
    pe = r["pe_norm_formula"]
    common.note(f"Unscaled, the position encoding drowns the token (‖e‖ ≈ {plain:.2f} against ‖PE‖ "
                f"= {pe:g}: cos {r['cos_plain']:.3f}); scaled by √d, the token "
                f"{'dominates' if scaled > pe else 'does NOT dominate'} again\n(‖√d·e‖ ≈ "
                f"{scaled:.1f} against {pe:g}: cos {r['cos_scaled']:.3f}; notes: 0.064 and 0.816).")
    if args.figures:  # the sweep over d is the figure's alone
        dims = (64, 128, 256, 512, 1024)
        draw_embedding_scale([embedding_scale(dd, 512 if args.quick else T,
                                              args.seed) for dd in dims], args.figures)


@common.draws_figure
def draw_embedding_scale(results, figures_dir):
    import matplotlib.pyplot as plt
    dims = [r["d"] for r in results]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for key, label, style in (("scaled", "cos(√d·e + PE, e)", "s-"),
                              ("plain", "cos(e + PE, e)", "o-")):
        mean = [r[key].mean() for r in results]
        low, high = zip(*[np.percentile(r[key], [10, 90]) for r in results])
        ax.plot(dims, mean, style, label=label)
        ax.fill_between(dims, low, high, alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_xticks(dims, [str(d) for d in dims])
    ax.minorticks_off()
    ax.set_ylim(0, 1)
    ax.set_xlabel("d")
    ax.set_ylabel("cosine similarity with e")
    ax.set_title(f"Embedding e ~ N(0, 1/d) plus PE(t): mean over {results[0]['n_positions']:,} "
                 f"positions\n(band: 10th-90th percentile)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    common.save_figure(fig, "02_embedding_scale", figures_dir)


# ---- Part 5 · §4.1 ------------------------------------------------------------------------------
CONFIGS = {"base": dict(d=512, d_ff=2048, n_head=8, n_layers=6),     # Vaswani et al. 2017, Table 3
           "big": dict(d=1024, d_ff=4096, n_head=16, n_layers=6)}
PAPER = {"base": 65e6, "big": 213e6}                                  # as the paper reports them
# the shared En-De BPE vocabulary
VOCAB = 37000


def parameters_by_formula(d: int, d_ff: int, n_layers: int, n_vocab: int, tables: int, **_) -> dict:
    """Every Linear has a bias; 2 LayerNorms per encoder layer, 3 per decoder layer, no final one;
    sinusoidal positions (no parameters); `tables` V×d embedding tables."""
    attention = 4 * (d * d + d)                       # Q, K, V, O
    ffn = 2 * d * d_ff + d_ff + d
    layer_norm = 2 * d
    encoder_layer = attention + ffn + 2 * layer_norm
    decoder_layer = 2 * attention + ffn + 3 * layer_norm   # self-attention and cross-attention
    body = n_layers * (encoder_layer + decoder_layer)
    return {"body": body, "total": body + tables * n_vocab * d}


def parameters_by_modules(d: int, d_ff: int, n_head: int, n_layers: int, n_vocab: int,
                          tables: int) -> dict:
    """Build the model from torch.nn on the meta device (shapes only, no memory) and count."""
    import torch
    from torch import nn

    # nn.Embedding(V, d) without its normal_ init, which on meta first imports torch._dynamo (5 s)
    def table():
        return nn.Embedding.from_pretrained(torch.empty(n_vocab, d, device="meta"), freeze=False)

    with torch.device("meta"):
        # layout: no parameters
        body = nn.Transformer(d, n_head, n_layers, n_layers, d_ff, batch_first=True)
        source = table()
        target = source if tables == 1 else table()
        output = nn.Linear(d, n_vocab, bias=False)
        if tables == 1:
            output.weight = source.weight            # three-way tying: one V×d table
    # nn.Transformer ends each stack with a LayerNorm; the 2017 Post-LN model has none, so count the
    # layers.
    stacks = nn.ModuleList([body.encoder.layers, body.decoder.layers])
    # .parameters() lists a shared table once
    model = nn.ModuleList([stacks, source, target, output])
    return {"body": sum(p.numel() for p in stacks.parameters()),
            "total": sum(p.numel() for p in model.parameters()),
            "final_norms": sum(p.numel() for p in (*body.encoder.norm.parameters(),
                                                   *body.decoder.norm.parameters()))}


def parameter_table(n_vocab: int = VOCAB) -> dict:
    rows = {}
    for name, config in CONFIGS.items():
        counts = {tables: (parameters_by_formula(**config, n_vocab=n_vocab, tables=tables),
                           parameters_by_modules(**config, n_vocab=n_vocab,
                                                 tables=tables)) for tables in (1, 3)}
        shared, unshared = counts[1][0]["total"], counts[3][0]["total"]
        two_tables = parameters_by_formula(**config, n_vocab=n_vocab, tables=2)["total"]
        rows[name] = {"config": config, "counts": counts, "shared": shared, "unshared": unshared,
                      "saving": 1 - shared / unshared, "saving_two_tables": 1 - shared / two_tables,
                      "paper": PAPER[name]}
    return {"n_vocab": n_vocab, "rows": rows}


def show_parameter_table(args):
    common.header(5, __doc__, f"V = {VOCAB:,}")
    r = parameter_table(VOCAB)
    rows = []
    for name, row in r["rows"].items():
        c = row["config"]
        for tables, label in ((1, "shared: 1 table"), (3, "unshared: 3 tables")):
            formula, modules = row["counts"][tables]
            rows.append([f"{name} (d={c['d']}, d_ff={c['d_ff']}, h={c['n_head']})", label,
                         formula["body"],
                         modules["body"], formula["total"], modules["total"],
                         "yes" if formula == {k: modules[k] for k in formula} else "NO"])
    common.table(rows,
                 ["model", "embeddings", "body (formula)", "body (nn.Transformer)",
                  "total (formula)",
                        "total (modules)", "equal"], intfmt=",")
    common.table([[name, row["shared"] / 1e6, row["unshared"] / 1e6, 100 * row["saving"],
                   f"{row['paper'] / 1e6:.0f}", 100 * (row["shared"] / row["paper"] - 1)]
                  for name, row in r["rows"].items()],
                 ["model", "shared (millions)", "unshared (millions)", "saving (%)",
                  "paper (millions)", "shared vs paper (%)"],
                 floatfmt=("", ".2f", ".2f", ".2f", "", "+.1f"))
    base = r["rows"]["base"]
    layers = base["config"]["n_layers"]
    common.note(f"Counted: {layers} encoder + {layers} decoder layers, biases everywhere, no final "
                f"LayerNorm (nn.Transformer's two would add "
                f"{base['counts'][1][1]['final_norms']:,} on base), sinusoidal positions.\n"
                f"“Unshared” = three V×d tables (encoder input, "
                f"decoder input, pre-softmax); against two (source = target, output separate) "
                f"sharing would save {100 * base['saving_two_tables']:.2f}% on base.")
    big = r["rows"]["big"]
    table_share = {name: row["config"]["d"] * r["n_vocab"] / row["shared"] for name, row
                   in r["rows"].items()}
    common.note(f"The saving is {'larger' if base['saving'] > big['saving'] else 'NOT larger'} for "
                f"the smaller model ({100 * base['saving']:.2f}% against "
                f"{100 * big['saving']:.2f}%): the table is a bigger share of it "
                f"({100 * table_share['base']:.1f}% of base, {100 * table_share['big']:.1f}% of "
                f"big).")


PARTS = {1: show_sinusoidal, 2: show_rotation, 3: show_learned_limit, 4: show_embedding_scale,
         5: show_parameter_table}

if __name__ == "__main__":
    # part 5 imports torch itself, and draws nothing random
    common.main(__doc__, PARTS, uses_torch=False)
