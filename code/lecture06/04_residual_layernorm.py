"""Script 04 · Residuals, LayerNorm, Post-LN vs Pre-LN: gradient gain, LN vs BatchNorm, training stability.

Serves notes §5.2 (part 1), §5.3 (part 2) and §5.4 (parts 3 and 4). Parts 1-3 measure at initialisation;
part 4 trains six 6-layer models on the city language (city_lab.py), two at a time in worker processes.
Runtime: about 55 s on 2 idle cores (about 95 s of CPU, most of it part 4's six runs in two worker
processes); `--quick` (four runs of 100 steps in part 4) about 16 s.

    python code/lecture06/04_residual_layernorm.py [--part N] [--seed S] [--quick] [--no-figures]
"""
from __future__ import annotations

import common  # first: one BLAS thread before numpy loads, and lecture 5's code importable

import math


import numpy as np

import torch
from torch import nn

import city_lab
import city_train
import transformer as tf
from tensor import Tensor, no_grad
from threads import torch_threads

VARIANTS = ("no residual", "residual", "residual + LN")


# ---- Part 1 · §5.2 ------------------------------------------------------------------------------
class Block(nn.Module):
    """One layer of part 1's stack: ReLU(Linear(x)), with a residual path and a LayerNorm or not."""

    def __init__(self, width: int, variant: str):
        super().__init__()
        self.variant = variant
        self.linear = nn.Linear(width, width, dtype=torch.float64)  # PyTorch's default init: U(±1/√width)
        self.ln = nn.LayerNorm(width, dtype=torch.float64) if variant == "residual + LN" else None

    def forward(self, x):
        if self.variant == "no residual":
            return torch.relu(self.linear(x))
        if self.variant == "residual":
            return x + torch.relu(self.linear(x))
        return x + torch.relu(self.linear(self.ln(x)))  # Pre-LN: the LayerNorm sits on the branch


@torch_threads(1)  # small tensors: one thread is fastest, and the same everywhere
def gradient_gain(depths=(1, 2, 4, 8, 16, 32, 64), width: int = 256, batch: int = 32, seeds=(0, 1, 2)) -> dict:
    """For each variant and depth L: the gradient gain ‖∂(g·y_L)/∂x‖ / ‖g‖ from the output y_L of the first
    L layers back to the input x (g a random N(0, 1) output gradient), and the std of y_L. Means over seeds.

    With PyTorch's default init, Var(W) = 1/(3·width): a Linear + ReLU layer keeps 1/6 of the gradient's
    variance, so without residuals the gain is about (1/6)^(L/2) (1.3e-25 at L = 64; CLAIMS §D.8).
    """
    gains = {v: np.zeros(len(depths)) for v in VARIANTS}
    stds = {v: np.zeros(len(depths)) for v in VARIANTS}
    for seed in seeds:
        for variant in VARIANTS:
            torch.manual_seed(seed)
            blocks = [Block(width, variant) for _ in range(max(depths))]
            x = torch.randn(batch, width, dtype=torch.float64, requires_grad=True)
            outputs, y = {}, x
            for depth, block in enumerate(blocks, 1):
                y = block(y)
                if depth in depths:
                    outputs[depth] = y
            for i, depth in enumerate(depths):
                g = torch.randn(batch, width, dtype=torch.float64)
                (grad_x,) = torch.autograd.grad(outputs[depth], x, g, retain_graph=True)
                gains[variant][i] += float(grad_x.norm() / g.norm()) / len(seeds)
                stds[variant][i] += float(outputs[depth].detach().std()) / len(seeds)
    return {"depths": list(depths), "width": width, "batch": batch, "seeds": list(seeds),
            "gain": gains, "std": stds, "theory_no_residual": [(1 / 6) ** (L / 2) for L in depths]}


def show_gradient_gain(args):
    r = gradient_gain(seeds=(args.seed,) if args.quick else tuple(args.seed + i for i in range(3)))
    common.header(1, "§5.2", "Residuals: letting the gradient take the straight road")
    common.note(f"L × (Linear {r['width']}→{r['width']} + ReLU), PyTorch's default init U(±1/√{r['width']}), "
                f"input N(0, 1) of batch {r['batch']}; gain = ‖∂/∂input‖ / ‖∂/∂output‖; "
                f"mean over seed(s) {r['seeds']}")
    rows = [[L, r["gain"]["no residual"][i], r["theory_no_residual"][i], r["gain"]["residual"][i],
             r["gain"]["residual + LN"][i], r["std"]["no residual"][i], r["std"]["residual"][i],
             r["std"]["residual + LN"][i]] for i, L in enumerate(r["depths"])]
    common.table(rows, ["L", "gain: no residual", "(1/6)^(L/2)", "gain: residual", "gain: res + LN",
                        "std: no residual", "std: residual", "std: res + LN"], floatfmt=".2g")
    last = len(r["depths"]) - 1
    common.note(f"No residual: after {r['depths'][last]} layers the gradient is {r['gain']['no residual'][last]:.1e} "
                f"of itself (vanishes). Residual only: the stream doubles every few layers, output std "
                f"{r['std']['residual'][last]:.1e} (explodes). Residual + LayerNorm (x + ReLU(Linear(LN(x)))): "
                f"gain {r['gain']['residual + LN'][last]:.1f}, std {r['std']['residual + LN'][last]:.1f}.")
    draw_gradient_gain(r, args.figures)


def draw_gradient_gain(r, figures_dir):
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for variant, style in zip(VARIANTS, ("o-", "s-", "^-")):
        axes[0].plot(r["depths"], r["gain"][variant], style, label=variant)
        axes[1].plot(r["depths"], r["std"][variant], style, label=variant)
    axes[0].plot(r["depths"], r["theory_no_residual"], "k:", lw=1, label="(1/6)^(L/2)")
    for ax, title in ((axes[0], "gradient gain, output → input"), (axes[1], "std of the output")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(r["depths"], [str(d) for d in r["depths"]])
        ax.minorticks_off()
        ax.set_xlabel("depth L")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(f"Linear + ReLU, width {r['width']}, PyTorch's default init: residual + LayerNorm "
                 "neither vanishes nor explodes")
    fig.tight_layout()
    common.save_figure(fig, "04_gradient_gain", figures_dir)


# ---- Part 2 · §5.3 ------------------------------------------------------------------------------
def layer_norm(x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """transformer.py's LayerNorm (γ = 1, β = 0) on a plain array."""
    with no_grad():
        return tf.LayerNorm(x.shape[-1], eps)(Tensor(x)).data


def batch_norm(x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """BatchNorm in training mode: each feature normalised over the whole batch (B, S, D), like
    torch.nn.BatchNorm1d on (B, D, S) with γ = 1, β = 0."""
    mu, var = x.mean(axis=(0, 1)), x.var(axis=(0, 1))  # statistics per feature, over sequences and positions
    return (x - mu) / np.sqrt(var + eps)


def batch_companions(seq_len: int = 4, d: int = 8, batch: int = 2, trials: int = 5, scale: float = 7.5,
                     seed: int = 0) -> dict:
    """Batch one sequence with `trials` different sets of companions: how much its LayerNorm and
    BatchNorm outputs change against the first batch; and LayerNorm of the input scaled by `scale`."""
    rng = np.random.default_rng(seed)
    sequence = rng.standard_normal((seq_len, d))
    outputs = []
    for _ in range(trials + 1):
        x = np.concatenate([sequence[None], rng.standard_normal((batch - 1, seq_len, d))])  # (B, S, D)
        outputs.append((layer_norm(x)[0], batch_norm(x)[0]))
    rows = [{"ln_change": float(np.abs(ln - outputs[0][0]).max()),
             "bn_change": float(np.abs(bn - outputs[0][1]).max())} for ln, bn in outputs[1:]]
    scaled = {eps: float(np.abs(layer_norm(scale * sequence, eps) - layer_norm(sequence, eps)).max())
              for eps in (1e-5, 0.0)}
    return {"seq_len": seq_len, "d": d, "batch": batch, "scale": scale, "rows": rows, "scaled": scaled}


def show_batch_companions(args):
    r = batch_companions(seed=args.seed)
    common.header(2, "§5.3", "LayerNorm normalises each token on its own")
    common.note(f"one sequence ({r['seq_len']} tokens × {r['d']} features) batched with {r['batch'] - 1} other "
                f"random sequence(s), fresh companions in each trial;\nmax |change| of its output against its "
                f"output in trial 0's batch")
    common.table([[i + 1, row["ln_change"], row["bn_change"]] for i, row in enumerate(r["rows"])],
                 ["trial", "LayerNorm", "BatchNorm"], floatfmt=("d", ".1f", ".2f"))
    common.note(f"Input scaled by {r['scale']}: LayerNorm output changes by {r['scaled'][1e-5]:.1e} with eps = 1e-5 "
                f"and {r['scaled'][0.0]:.1e} with eps = 0: the change comes from eps alone.")


# ---- Part 3 · §5.4 ------------------------------------------------------------------------------
@torch_threads(1)  # small tensors: one thread is fastest, and the same everywhere
def layer_grad_norms(depths=(2, 4, 8, 16, 32), seeds=(0, 1, 2), n_embd: int = 64, n_head: int = 4,
                     seq_len: int = 16, batch: int = 8, init: str = "xavier") -> dict:
    """Gradient norm of each layer's parameters at initialisation, for Post-LN and Pre-LN DecoderLMs of
    each depth, on one batch of the city language (windows of seq_len), averaged over seeds.

    init: see city_train.build_model; "xavier" (the original Transformer's) is the one part 4 trains.
    """
    import torch.nn.functional as F
    norms = {}
    for placement, pre_ln in (("Post-LN", False), ("Pre-LN", True)):
        for depth in depths:
            total = np.zeros(depth)
            for seed in seeds:
                model = city_train.build_model(depth, n_embd, n_head, pre_ln=pre_ln, init=init, seed=seed)
                data = next(city_lab.training_batches(seed, batch, seq_len))
                logits = model(torch.from_numpy(data.x))  # (B, S, V)
                F.cross_entropy(logits.reshape(-1, city_lab.V), torch.from_numpy(data.y).reshape(-1)).backward()
                total += [math.sqrt(sum(float((p.grad ** 2).sum()) for p in layer.parameters()))
                          for layer in model.layers]
            norms[placement, depth] = total / len(seeds)
    return {"depths": list(depths), "seeds": list(seeds), "n_embd": n_embd, "n_head": n_head,
            "seq_len": seq_len, "batch": batch, "init": init, "norms": norms}


@torch_threads(1)
def branch_scale(init: str = "xavier", seed: int = 0, n_layers: int = 6, n_embd: int = 64, n_head: int = 4,
                 batch: int = 8, pre_ln: bool = False) -> dict:
    """How large the first layer's FFN branch starts: std of its output over the std of its input, at
    initialisation (city_train.build_model(init=...), Post-LN as part 4 trains it), on one city-language batch
    (batch × SEQ_LEN tokens; `seed` seeds the weights and the batch, as in parts 3 and 4).

    A small ratio means LN(x + F(x)) starts close to LN(x): Post-LN's blocks start near the identity.
    """
    model = city_train.build_model(n_layers, n_embd, n_head, pre_ln=pre_ln, init=init, seed=seed)
    seen = {}
    hook = model.layers[0].ff.register_forward_hook(lambda module, inputs, output: seen.update(x=inputs[0], y=output))
    data = next(city_lab.training_batches(seed, batch, city_lab.SEQ_LEN))
    with torch.no_grad():
        model(torch.from_numpy(data.x))
    hook.remove()
    x_std, y_std = float(seen["x"].std()), float(seen["y"].std())
    return {"init": init, "seed": seed, "pre_ln": pre_ln, "n_layers": n_layers, "n_embd": n_embd,
            "tokens": data.x.shape, "input_std": x_std, "branch_std": y_std, "ratio": y_std / x_std}


def show_layer_grad_norms(args):
    r = layer_grad_norms(depths=(2, 4, 8, 16) if args.quick else (2, 4, 8, 16, 32),
                         seeds=tuple(args.seed + i for i in range(3)))
    common.header(3, "§5.4", "Post-LN vs Pre-LN: gradient norms at initialisation")
    common.note(f"DecoderLM, d = {r['n_embd']}, h = {r['n_head']}, {r['init']} init as in part 4, one city-language batch "
                f"of {r['batch']} × {r['seq_len']} tokens; ‖gradient‖ of a layer's parameters, mean over seeds "
                f"{r['seeds']}")
    rows = []
    for depth in r["depths"]:
        post, pre = r["norms"]["Post-LN", depth], r["norms"]["Pre-LN", depth]
        rows.append([depth, post[0], post[-1], pre[0], pre[-1], post[-1] / pre[-1]])
    common.table(rows, ["L", "Post-LN first", "Post-LN last", "Pre-LN first", "Pre-LN last",
                        "last: Post / Pre"], floatfmt=".3f")
    first, last = r["depths"][0], r["depths"][-1]
    post_first, post_last = r["norms"]["Post-LN", first][-1], r["norms"]["Post-LN", last][-1]
    common.note(f"Pre-LN's last layer gets {r['norms']['Pre-LN', last][-1] / r['norms']['Pre-LN', first][-1]:.2f}× "
                f"the gradient at L = {last} that it gets at L = {first}: L branches add to one stream, so each "
                f"one's share shrinks. Post-LN's last layer: {post_first:.2f} at L = {first}, {post_last:.2f} at "
                f"L = {last}, {rows[-1][-1]:.1f}× Pre-LN's: a large lr pushes the layers near the output hardest.")
    scales = {init: branch_scale(init, args.seed) for init in ("xavier", "default", "gpt2")}
    b = scales["xavier"]
    common.note(f"How large layer 1's FFN branch starts ({b['n_layers']}-layer Post-LN as in part 4, d = {b['n_embd']}, "
                f"one city-language batch of {b['tokens'][0]} × {b['tokens'][1]} tokens, seed {args.seed}): "
                f"std(FFN(x)) / std(x)")
    for (init, s), what in zip(scales.items(), ("Xavier-uniform, parts 3-4", "PyTorch's default",
                                                "GPT-2's N(0, 0.02²)")):
        common.note(f"  {init:<8}({what}): {s['ratio']:#.3g}")
    draw_layer_grad_norms(r, args.figures)


def draw_layer_grad_norms(r, figures_dir):
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), sharey=True)
    for ax, placement in zip(axes, ("Post-LN", "Pre-LN")):
        for depth in r["depths"]:
            norms = r["norms"][placement, depth]
            ax.plot(np.arange(1, depth + 1) / depth, norms, "o-" if depth < 16 else "-", ms=3, label=f"L = {depth}")
        ax.set_yscale("log")
        ax.set_xlabel("layer / L  (1 = next to the output)")
        ax.set_title(placement)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("‖gradient‖ of the layer's parameters")
    axes[1].legend()
    fig.suptitle(f"Gradient norm per layer at initialisation, mean over {len(r['seeds'])} seeds")
    fig.tight_layout()
    common.save_figure(fig, "04_grad_norm_per_layer", figures_dir)


# ---- Part 4 · §5.4 ------------------------------------------------------------------------------
SMALL_LR, LARGE_LR, WARMUP = 1e-3, 6e-3, 100
RUNS = (("Post-LN", SMALL_LR, 0), ("Pre-LN", SMALL_LR, 0),
        ("Post-LN", LARGE_LR, 0), ("Post-LN", LARGE_LR, WARMUP), ("Pre-LN", LARGE_LR, 0), ("Pre-LN", LARGE_LR, WARMUP))
FULL = dict(runs=RUNS, steps=400, eval_every=50)
# --quick: four runs, 100 steps, a 50-step warmup: Post-LN at the small lr; at the large lr Post-LN without and
# with warmup, and Pre-LN. It shows who fails and who trains; it is too short to show the instability.
QUICK = dict(runs=(("Post-LN", SMALL_LR, 0), ("Post-LN", LARGE_LR, 0), ("Post-LN", LARGE_LR, 50),
                   ("Pre-LN", LARGE_LR, 0)), steps=100, eval_every=50)


def training_stability(runs=RUNS, steps: int = 400, eval_every: int = 50, n_layers: int = 6, n_embd: int = 64,
                       n_head: int = 4, batch_size: int = 8, init: str = "xavier", seed: int = 0,
                       workers: int = 2, progress: str | None = None) -> dict:
    """Train one DecoderLM per (placement, lr, warmup) in `runs` on the city language: Adam, the lr
    constant after the warmup, the same seed (parameters and data) for every run. Returns each run's
    city_train.TrainResult with its settings, and the unigram/bigram levels for comparison.

    init="xavier" (the original Transformer's) makes every branch start about as large as the
    residual stream; with "gpt2" or "default" the early failure of Post-LN did not show (README).
    """
    specs = [dict(model=dict(n_layers=n_layers, n_embd=n_embd, n_head=n_head, pre_ln=(placement == "Pre-LN"),
                             init=init, seed=seed),
                  training=dict(lr=lr, warmup=warmup, steps=steps, batch_size=batch_size, eval_every=eval_every,
                                seed=seed))
             for placement, lr, warmup in runs]
    results = city_train.train_many(specs, workers=workers, progress=progress)
    return {"runs": [dict(placement=p, lr=lr, warmup=w, result=res) for (p, lr, w), res in zip(runs, results)],
            "steps": steps, "n_layers": n_layers, "n_embd": n_embd, "n_head": n_head, "batch_size": batch_size,
            "init": init, "seed": seed, "baselines": city_lab.baseline_excess_mnats()}


def show_training_stability(args):
    with common.stopwatch() as elapsed:
        r = training_stability(**(QUICK if args.quick else FULL), seed=args.seed, progress="part 4")
    common.header(4, "§5.4", "Post-LN vs Pre-LN: training with and without warmup")
    common.note(f"{r['n_layers']}-layer DecoderLM, d = {r['n_embd']}, h = {r['n_head']}, {r['init']} init, no dropout; "
                f"Adam, batch {r['batch_size']} × {city_lab.SEQ_LEN}, {r['steps']} steps, lr constant after the "
                f"warmup; seed {r['seed']}")
    common.note(f"test cross-entropy minus the exact bound ({city_lab.lower_bound():.4f} nats/token), in mnat/token; "
                f"for scale: unigram model {r['baselines']['unigram']:+.0f}, bigram model {r['baselines']['bigram']:+.0f}")
    steps = [step for step, _, _ in r["runs"][0]["result"].curve[1:]]
    rows = [[run["placement"], run["lr"], run["warmup"], *[c[2] for c in run["result"].curve[1:]],
             run["result"].best_excess, rises(run["result"])] for run in r["runs"]]
    common.table(rows, ["", "lr", "warmup", *[f"step {s}" for s in steps], "best", "rises"],
                 floatfmt=("", "g", "d") + (".0f",) * (len(steps) + 1) + ("d",))
    common.note("rises: how many times the test excess went up from one evaluation to the next")
    for line in stability_summary(r):
        common.note(line)
    common.timing(f"part 4: {len(r['runs'])} runs on 2 worker processes in {elapsed():.1f} s")
    draw_training_curves(r, args.figures)


def rises(result) -> int:
    """How many times the test excess went up between consecutive evaluations after training began."""
    test = [c[2] for c in result.curve[1:]]
    return sum(b > a for a, b in zip(test, test[1:]))


def stability_summary(r) -> list[str]:
    """The table's story in words, with the numbers of this run (only for the runs it holds)."""
    runs = {(run["placement"], run["lr"], run["warmup"]): run["result"] for run in r["runs"]}
    unigram, lines = r["baselines"]["unigram"], []
    small = [f"{p} {runs[p, SMALL_LR, 0].final_excess:.0f}" for p in ("Post-LN", "Pre-LN") if (p, SMALL_LR, 0) in runs]
    if small:
        lines.append(f"lr {SMALL_LR:g}: {', '.join(small)} mnat/token at the end.")
    failed, pre = runs.get(("Post-LN", LARGE_LR, 0)), runs.get(("Pre-LN", LARGE_LR, 0))
    if failed and pre:
        ratio = failed.final_excess / unigram
        lines.append(f"lr {LARGE_LR:g} without warmup: Post-LN ends at {failed.final_excess:.0f}, {ratio:.2f}× the "
                     f"unigram model's excess{' (no better than ignoring the context)' if ratio > 0.9 else ''}; "
                     f"Pre-LN at {pre.final_excess:.0f}.")
    for (placement, lr, warmup), res in runs.items():
        if lr == LARGE_LR and warmup and placement == "Post-LN":
            best_step = min(res.curve, key=lambda c: c[2])[0]
            lines.append(f"lr {lr:g} after {warmup} warmup steps: Post-LN's best is {res.best_excess:.0f} "
                         f"at step {best_step}, and it ends at {res.final_excess:.0f}.")
    return lines


def draw_training_curves(r, figures_dir):
    import matplotlib.pyplot as plt
    lrs = sorted({run["lr"] for run in r["runs"]})
    fig, axes = plt.subplots(1, len(lrs), figsize=(4.8 * len(lrs), 3.6), sharey=True, squeeze=False)
    for ax, lr in zip(axes[0], lrs):
        for run in (run for run in r["runs"] if run["lr"] == lr):
            res = run["result"]
            label = f"{run['placement']}, warmup {run['warmup']}" if run["warmup"] else f"{run['placement']}, no warmup"
            smooth = np.convolve(res.train_excess, np.ones(10) / 10, mode="valid")  # mean of 10 batches
            line, = ax.plot(np.arange(10, len(res.train_excess) + 1), smooth, lw=0.8, alpha=0.5)
            steps, _, test = zip(*res.curve)
            ax.plot(steps, test, "o-", color=line.get_color(), ms=3, label=label)
        for name, value in r["baselines"].items():
            ax.axhline(value, color="grey", lw=0.8, ls=":")
            ax.text(r["steps"], value, name, ha="right", va="bottom", fontsize=8, color="grey")
        ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(f"lr = {lr:g}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("excess over the bound, mnat/token")
    fig.suptitle(f"{r['n_layers']}-layer DecoderLM on the city language (seed {r['seed']}): test excess (dots) "
                 "and batch excess (thin, mean of 10 steps)")
    fig.tight_layout()
    common.save_figure(fig, "04_training_curves", figures_dir)


PARTS = {1: show_gradient_gain, 2: show_batch_companions, 3: show_layer_grad_norms, 4: show_training_stability}

if __name__ == "__main__":
    common.main(__doc__, PARTS)
