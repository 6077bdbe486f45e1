"""The figures of script 05 (the training recipe, notes §7): label smoothing's exact price on the
city language (part 2), the paper's learning-rate schedule (part 3) and checkpoint averaging (part
5), each drawn from what its part computed and written as figures/05_<what>.png.
"""
from __future__ import annotations

import numpy as np

from lecture06 import common


@common.draws_figure
def draw_smoothing_cost(r, figures_dir):
    import matplotlib.pyplot as plt
    grid = r["grid"]
    fig, ax = plt.subplots(figsize=(6.2, 3.8))
    ax.plot(grid, -1000 * np.log(1 - grid), "k--", lw=1, label="ceiling −log(1−ε)")
    ax.plot(grid, -1000 * np.log(1 - grid + grid / r["V"]), ":", color="grey",
            label="if every token were certain")
    ax.plot(grid, r["curve"]["slides"], "-", color="tab:orange",
            label="slides' q* = (1−ε)p + ε(1−p)/(V−1)")
    ax.plot(grid, r["curve"]["torch"], "-", color="tab:blue", label="PyTorch's q* = (1−ε)p + ε/V")
    for row in r["rows"]:
        ax.plot(row["eps"], row["torch"]["cost"], "o", color="tab:blue")
        ax.annotate(f"{row['torch']['cost']:.0f}", (row["eps"], row["torch"]["cost"]),
                    textcoords="offset points", xytext=(6, -12), fontsize=8, color="tab:blue")
    ax.set_xlabel("ε")
    ax.set_ylabel("test cross-entropy − bound (mnat/token)")
    ax.set_title(f"The exact price of label smoothing on the city language (V = {r['V']})",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    common.save_figure(fig, "05_label_smoothing", figures_dir)


@common.draws_figure
def draw_lr_schedule(r, figures_dir):
    import matplotlib.pyplot as plt
    show = r["steps"] <= 100_000
    steps = r["steps"][show]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(steps, r["lr"][show], label=f"d = {r['d_model']}")
    ax.plot(steps, r["lr_1024"][show], label="d = 1024 (peak √2 lower)")
    ax.plot([r["argmax"]], [r["peak"]], "ko", ms=4)
    ax.annotate(f"peak {common.sci(r['peak'])} at step {r['argmax']:,}", (r["argmax"], r["peak"]),
                xytext=(12, -2), textcoords="offset points", fontsize=8)
    for s, lr in r["ex7"].items():
        ax.plot([s], [lr], "s", color="tab:green", ms=4)
    ax.annotate(f"steps 2,000 and 16,000: {common.sci(r['ex7'][2000])} (half the peak)",
                (16000, r["ex7"][16000]), xytext=(8, 6), textcoords="offset points", fontsize=8,
                color="tab:green")
    ax.plot([100_000], [r["at_100k"]], "ko", ms=3)
    ax.annotate(f"{common.sci(r['at_100k'])} at 100k", (100_000, r["at_100k"]), xytext=(-70, 10),
                textcoords="offset points", fontsize=8)
    ax.axvline(r["warmup"], color="grey", lw=0.8, ls=":")
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.set_title(f"d^−0.5 · min(step^−0.5, step · warmup^−1.5), warmup = {r['warmup']}",
                 fontsize=10)
    ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    common.save_figure(fig, "05_lr_schedule", figures_dir)


@common.draws_figure
def draw_checkpoint_averaging(r, figures_dir):
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter, ScalarFormatter
    fig, (ax, seeds_ax) = plt.subplots(1, 2, figsize=(10.4, 3.9),
                                       gridspec_kw=dict(width_ratios=(1.6, 1)))
    ax.plot(*zip(*r["checkpoints"]), "o-", ms=4, color="tab:blue",
            label=f"constant lr {r['lr']:g}: the checkpoints")
    if r["decayed_curve"] is not None:
        ax.plot(*zip(*r["decayed_curve"]), "s--", ms=3, color="tab:green",
                label="lr decaying linearly to 0")
    n, steps = len(r["checkpoints"]), [s for s, _ in r["checkpoints"]]
    colors = dict(zip(r["averaged"],
                      ("tab:orange", "tab:red", "tab:purple", "tab:pink", "tab:brown")))
    for k, excess in r["averaged"].items():
        label = f"average of all {k}" if k == n else f"average of the last {k}"
        ax.plot([steps[-k], steps[-1]], [excess, excess], "|-", color=colors[k], ms=8, lw=2,
                # shorter bars on top: they may share a height
                zorder=3 + n - k, label=f"{label}: {excess:.0f}")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_yticks([t for t in (25, 50, 100, 200, 400, 800)
                   if t < 1.2 * max(e for _, e in r["checkpoints"])])
    ax.set_xlabel("step")
    ax.set_ylabel("test excess over the bound (mnat/token)")
    ax.set_title(f"Averaging the last checkpoints of a constant-lr run, seed {r['seeds'][0]}\n"
                 "each bar spans the checkpoints it averages", fontsize=10)
    ax.grid(alpha=0.3, which="major")
    ax.legend(fontsize=8)

    # every seed: each model against the last checkpoint of its own run
    rows = [row for row in r["rows"] if row["name"] != "last"]
    for x, row in enumerate(rows):
        color = colors.get(row["k"], "tab:green") if row["name"] == "average" else "tab:green"
        seeds_ax.plot([x] * len(row["vs_last"]), row["vs_last"], "o", color=color, alpha=0.7, ms=5)
        seeds_ax.plot([x - 0.25, x + 0.25], [row["vs_last_spread"][0]] * 2, "-", color="black",
                      lw=1.5)
    seeds_ax.axhline(0, color="grey", lw=0.8)
    seeds_ax.set_xticks(range(len(rows)),
                        [f"all {row['k']}" if row["k"] == n else "decay" if row["name"] == "decayed"
                                           else f"last {row['k']}" for row in rows], fontsize=8)
    seeds_ax.set_ylabel("excess − last checkpoint's (mnat/token)")
    seeds_ax.set_title(f"{len(r['seeds'])} seed{'s' * (len(r['seeds']) > 1)} (one dot each; bar: "
                       "median)\nbelow 0: better than the last checkpoint", fontsize=10)
    seeds_ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    common.save_figure(fig, "05_checkpoint_averaging", figures_dir)
