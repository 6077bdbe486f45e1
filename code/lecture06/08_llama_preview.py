"""Script 08 · §14's preview: from the notes' GPT to a LLaMA-style decoder, one change at a time.

Beyond the notes' seven scripts: §14 promises that lecture 7 turns the small GPT into LLaMA's
structure item by item (Pre-RMSNorm, SwiGLU, RoPE, GQA). Each part measures one change with
llama.py's modules (tensor.py primitives; llama_ref.py is the float64 torch twin):
part 1 RMSNorm's reductions against LayerNorm's, part 2 SwiGLU's hidden size at equal parameters,
part 3 RoPE (the score depends only on m − n; the table it does not need; length extrapolation),
part 4 GQA (the KV cache's bytes; a multi-head model converted by mean-pooling), part 5 the ladder
from GPT to LLaMA-style trained on the city language, each step's effect counted over seeds.

    python code/lecture06/08_llama_preview.py [--part N] [--seed S] [--quick] [--no-figures]
"""
from __future__ import annotations

import common  # first: one BLAS thread before numpy loads, and lecture 5's code importable

import numpy as np

import city_llama
import runner
from city_lab import N_TEST, SEQ_LEN


# ---- Part 1 · §14, RMSNorm ----------------------------------------------------------------------
def show_norm_reductions(args):
    common.header(1, "§14", "RMSNorm against LayerNorm: the reductions a row needs")
    common.note("(not built yet)")


# ---- Part 2 · §14, SwiGLU -----------------------------------------------------------------------
def show_swiglu_sizes(args):
    common.header(2, "§14", "SwiGLU against GELU at equal parameters")
    common.note("(not built yet)")


# ---- Part 3 · §14, RoPE -------------------------------------------------------------------------
def show_rope(args):
    common.header(3, "§14", "RoPE: relative by construction, no table, length extrapolation")
    show_rope_relative(args)
    show_extrapolation(args)


def show_rope_relative(args):
    common.note("(not built yet: the m − n property and the table RoPE does not need)")


# ---- Part 4 · §14, GQA --------------------------------------------------------------------------
def show_gqa(args):
    common.header(4, "§14", "Grouped-query attention: the KV cache, and converting a trained model")
    show_kv_cache(args)
    show_gqa_conversion(args)


def show_kv_cache(args):
    common.note("(not built yet: KV-cache bytes measured and by formula)")


# ---- Trained parts: part 3's extrapolation, part 4's conversion, part 5's ladder ----------------
# one layer, so that 30 runs fit the script's budget (DEVELOPING.md); --quick: a few steps of a toy
CITY_MODEL, QUICK_MODEL = dict(n_layers=1, n_embd=64, n_head=4), dict(n_layers=1, n_embd=16,
                                                                       n_head=4)
STEPS, QUICK_STEPS, LR, BATCH = 160, 8, 3e-3, 8
GQA_KV_HEADS, CONVERT_TO = 2, (4, 2, 1)   # the +GQA rung's; what the +RoPE rung is pooled to
UPTRAIN_FRACTION = 0.1   # of the base run's steps (Ainslie et al. uptrain 5%), at its peak lr
LONGER = (2, 4)                           # the lengths scored, in trained window lengths
# a seed's margin within this many mnat/token may fall the other way on other float kernels
LADDER_TIPPING = 10.0


def trained_runs(args) -> dict:
    """{name: [city_llama.run's arguments, one per seed]}: the ladder's rungs, and the +SwiGLU
    rung with sinusoidal positions (part 3's third row). Parts 3, 4 and 5 ask for the same runs:
    each trains once. A seed draws a run's initial weights and its batches."""
    size = QUICK_MODEL if args.quick else CITY_MODEL
    rungs = dict(city_llama.ladder(**size, n_kv_heads=GQA_KV_HEADS))
    rungs["sinusoidal"] = dict(rungs["+SwiGLU"], positions="sinusoidal", embedding_std=1.0)
    steps = QUICK_STEPS if args.quick else STEPS
    scored_longer = dict(long_lengths=[k * SEQ_LEN for k in LONGER],
                         long_count=16 if args.quick else N_TEST)
    extras = {"+SwiGLU": scored_longer, "sinusoidal": scored_longer,
              "+RoPE": dict(scored_longer, convert_to=list(CONVERT_TO), uptrain_lr=LR,
                            uptrain_steps=max(1, round(UPTRAIN_FRACTION * steps)))}
    return {name: [dict(model=dict(settings, seed=seed),
                        training=dict(steps=steps, lr=LR, schedule="linear", batch_size=BATCH,
                                      eval_every=None, seed=seed), **extras.get(name, {}))
                   for seed in common.seeds_of(args)]
            for name, settings in rungs.items()}


def trained(args, names) -> dict:
    """{name: [run results, one per seed]} for the named entries of trained_runs."""
    plan = trained_runs(args)
    runs = [run for name in names for run in plan[name]]
    results = iter(runner.map(city_llama.run, runs))
    return {name: [next(results) for _ in plan[name]] for name in names}


def ahead(*names):
    """common.main's train_ahead entry for a part that asks for these runs."""
    return lambda args: (city_llama.run, [run for name in names
                                          for run in trained_runs(args)[name]])


def setup_line(args) -> str:
    first = trained_runs(args)["GPT"][0]
    size, training = first["model"], first["training"]
    seeds = common.seeds_of(args)
    return (f"{size['n_layers']} layer, d = {size['n_embd']}, {size['n_head']} heads; Adam, "
            f"{training['steps']} steps of {training['batch_size']} windows × {SEQ_LEN}, lr "
            f"{training['lr']:g} decaying linearly to 0;\nseed{'s' * (len(seeds) > 1)} "
            f"{seeds[0]}{f'..{seeds[-1]}' if len(seeds) > 1 else ''} (a seed draws the weights "
            "and the batches)")


def spread(values) -> str:
    """The median of a row of seeds, and their range when there are several."""
    if len(values) == 1:
        return f"{values[0]:.0f}"
    return f"{np.median(values):.0f} ({min(values):.0f}–{max(values):.0f})"


def has_margin(k: int, n: int) -> bool:
    """Whether a count's verdict survives one seed fewer (seeds.md: a verdict word only with a
    margin; at 5 seeds only 5 of 5 has one)."""
    return common.verdict(k, n) == common.verdict(max(k - 1, 0), n) != "does not hold here"


def claim_line(text: str, margins, tipping: float):
    """common.count_line when the count has a margin; otherwise the count with no verdict word."""
    k, n = common.holds(margins), len(margins)
    if has_margin(k, n):
        common.count_line(text, margins, tipping)
        return
    near = min(abs(m) for m in margins) <= tipping
    line = f"{text}: {common.seeds_text(k, n)} (no verdict: one seed fewer would change it)"
    (common.kernel_note if near else common.note)(line)


def effect_line(text: str, margins, tipping: float):
    """A change's effect counted both ways (margin > 0: it lowered the excess at that seed): the
    way that holds with a margin, else both counts."""
    k, n = common.holds(margins), len(margins)
    if has_margin(k, n) or has_margin(n - k, n):
        lowers = has_margin(k, n)
        claim_line(f"{text} {'lowers' if lowers else 'raises'} the excess",
                   margins if lowers else [-m for m in margins], tipping)
        return
    neither = common.verdict(k, n) == common.verdict(n - k, n) == "does not hold here"
    line = (f"{text}: lower at {common.seeds_text(k, n)}, higher at {n - k}: "
            + ("no difference we can count" if neither else "no verdict with a margin"))
    (common.kernel_note if min(abs(m) for m in margins) <= tipping else common.note)(line)


def show_extrapolation(args):
    runs = trained(args, ("+SwiGLU", "sinusoidal", "+RoPE"))
    lengths = [k * SEQ_LEN for k in LONGER]
    common.note(f"\nLength extrapolation: trained on windows of {SEQ_LEN} targets, scored on "
                f"fresh windows of {' and '.join(map(str, lengths))}\n(the bound is exact at any "
                "length). Part 5's +SwiGLU rung with three kinds of positions:\n"
                f"{setup_line(args)}.\nTest excess over the bound, mnat/token, median "
                "(range) over seeds:")
    names = {"+SwiGLU": "learned", "sinusoidal": "sinusoidal ×", "+RoPE": "RoPE"}
    rows = [[names[name]] + [spread([r["excess"] for r in results])]
            + [spread([r["long_excess"][n] for r in results]) if results[0]["long_excess"]
               else "refuses" for n in lengths] for name, results in runs.items()]
    common.table(rows, ["positions", f"at {SEQ_LEN} (trained)"] + [f"at {n}" for n in lengths],
                  disable_numparse=True, kernel_dependent=True)
    common.note(f"learned refuses: {runs['+SwiGLU'][0]['refusal']}\n"
                "× sinusoidal: embeddings drawn N(0, 1), not 0.02, or the ±1 table drowns the "
                "tokens")
    longest = lengths[-1]
    claim_line(f"at {longest}, RoPE's excess is below sinusoidal's",
                      [s["long_excess"][longest] - r["long_excess"][longest]
                       for s, r in zip(runs["sinusoidal"], runs["+RoPE"])], LADDER_TIPPING)
    claim_line(f"RoPE's excess at {longest} is above its excess at {SEQ_LEN}",
               [r["long_excess"][longest] - r["excess"] for r in runs["+RoPE"]], LADDER_TIPPING)


def show_gqa_conversion(args):
    runs = trained(args, ("+RoPE",))["+RoPE"]
    first = trained_runs(args)["+RoPE"][0]
    n_head, steps = first["model"]["n_head"], first["uptrain_steps"]
    common.note(f"\nA trained multi-head model (part 5's +RoPE rung, {n_head} KV heads) converted "
                "by mean-pooling\neach group's K, V heads, then uptrained "
                f"{steps} step{'s' * (steps > 1)} at lr {first['uptrain_lr']:g} decaying to 0 on "
                f"fresh batches\n({n_head} KV heads: uptrained alike, the control). Test excess, "
                "mnat/token, median (range) over seeds:")
    rows = [[n_kv, spread([r["excess"] for r in runs]),
             spread([r["converted"][n_kv][0] for r in runs]),
             spread([r["converted"][n_kv][1] for r in runs])] for n_kv in CONVERT_TO]
    common.table(rows, ["KV heads", "trained", "right after pooling", "after uptraining"],
                 disable_numparse=True, kernel_dependent=True)
    full = CONVERT_TO[0]
    for n_kv in CONVERT_TO[1:]:
        claim_line(f"{n_kv} KV head{'s' * (n_kv > 1)}, uptrained, stay above {full} "
                   "uptrained alike",
                   [r["converted"][n_kv][1] - r["converted"][full][1] for r in runs],
                   LADDER_TIPPING)


def show_ladder(args):
    common.header(5, "§14", "The ladder: GPT -> +RMSNorm -> +SwiGLU -> +RoPE -> +GQA")
    plan = trained_runs(args)
    runs = trained(args, city_llama.RUNGS)
    common.note(f"Each rung adds one change to the one above it.\n{setup_line(args)}.\n"
                "Parameters matched: SwiGLU's hidden m = 8d/3 rounded holds GELU's 8d², and "
                "+GQA's m\ngrows by what its smaller K, V save (RMSNorm and RoPE drop their few "
                "own).")
    rows = [[name, plan[name][0]["model"].get("middle_dim", 4 * plan[name][0]["model"]["n_embd"]),
             city_llama.parameter_count(plan[name][0]["model"])] for name in runs]
    common.table(rows, ["rung", "FFN hidden", "parameters"])
    common.note("Test excess over the exact bound, mnat/token, per seed:")
    common.table([[name, spread([r["excess"] for r in results])]
                  + [f"{r['excess']:.0f}" for r in results] for name, results in runs.items()],
                 ["rung", "median (range)"] + [f"seed {s}" for s in common.seeds_of(args)],
                 disable_numparse=True, kernel_dependent=True)
    names = list(runs)
    for previous, name in zip(names, names[1:]):
        effect_line(f"{name} (over {previous})", [p["excess"] - r["excess"] for p, r in
                                                 zip(runs[previous], runs[name])], LADDER_TIPPING)
    draw_ladder({name: [r["excess"] for r in results] for name, results in runs.items()},
                common.seeds_of(args), args.figures)


@common.draws_figure
def draw_ladder(excess: dict, seeds: list, figures_dir):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 3.6))
    rungs = list(excess)
    for i, seed in enumerate(seeds):   # one seed's runs joined: each step is paired by seed
        ax.plot(range(len(rungs)), [excess[name][i] for name in rungs], "o-", ms=4, lw=0.8,
                alpha=0.7, label=f"seed {seed}")
    ax.plot(range(len(rungs)), [np.median(excess[name]) for name in rungs], "k_", ms=24, mew=2,
            label="median")
    ax.set_xticks(range(len(rungs)), rungs)
    ax.set_ylabel("test excess over the bound (mnat/token)")
    ax.set_title("From the notes' GPT to a LLaMA-style decoder, one change per rung")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    common.save_figure(fig, "08_ladder", figures_dir)


PARTS = {1: show_norm_reductions, 2: show_swiglu_sizes, 3: show_rope, 4: show_gqa, 5: show_ladder}

if __name__ == "__main__":
    common.main(__doc__, PARTS, seeds=5, train_ahead={3: ahead("+SwiGLU", "sinusoidal", "+RoPE"),
                                                      5: ahead(*city_llama.RUNGS)})
