"""Script 05 · The training recipe: teacher forcing, label smoothing, warmup, Adam, averaging.

Serves notes §7.1 (teacher forcing, part 1), §7.3 (label smoothing and its exact cost on the city
language, part 2), §7.5 (the learning-rate formula, part 3; Adam's first step, part 4) and §7.6
(checkpoint averaging on the city language, part 5), and exercises 7-9. Part 1 runs transformer.py
(lecture 5's tensor.py); parts 2 and 4 check PyTorch's conventions; part 5 trains PyTorch twins with
city_train.py's harness: --seeds seeds (default 2) × a constant and a decaying lr, 400 steps each.

Part 6 (§7.1's other half, exercise 11) counts the forward passes of training (one) and of
generation (one per token), the positions computed with and without transformer.py's KV cache (n
against n(n+1)/2), and scores what a city-language model writes, greedy and sampled, against the
language's exact distribution, over --seeds seeds. Its models are part 5's constant-lr runs
(`constant_lr_models`: the ones part 5 trained, or trained by part 6 when it runs alone).

    python code/lecture06/05_training_recipe.py [--part N] [--seed S] [--seeds N] [--quick]
"""
from __future__ import annotations

import common  # first: one BLAS thread before numpy loads, and lecture 5's code importable

import base64
import dataclasses
import math

import numpy as np
import torch
import torch.nn.functional as F

import city_lab
import city_train
import runner
import tensor
import transformer
from tensor import Tensor, no_grad


def sci(x: float, digits: int = 2) -> str:
    """6.98771e-04 -> '6.99e-4', the way the notes write numbers."""
    if x == 0:
        return "0"
    mantissa, exponent = f"{x:.{digits}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def _count_forwards(model: transformer.Module) -> list:
    """From now on, append to the returned list, at every forward pass of model, the number of
    positions it is given (the length of its input); `del model.forward` ends the counting."""
    calls, forward = [], model.forward

    def counted(idx, *args, **kwargs):
        calls.append(np.shape(idx)[1])
        return forward(idx, *args, **kwargs)
    model.forward = counted
    return calls


# ---- Part 1 · §7.1 teacher forcing ---------------------------------------------------------------
SENTENCE = "I like singing and dancing ."


def teacher_forcing(n_embd: int = 16, n_head: int = 2, n_layers: int = 2, seed: int = 0) -> dict:
    """A causal DecoderLM (eval mode) on <bos> + SENTENCE + <eos>: the log-probabilities of every
    next token from ONE forward pass over the whole shifted target, against one forward pass per
    prefix."""
    vocab = ["<bos>", "<eos>"] + SENTENCE.split()
    ids = [vocab.index(w) for w in ["<bos>"] + SENTENCE.split() + ["<eos>"]]
    inputs, targets = np.array([ids[:-1]]), np.array(ids[1:])      # (1, 7) shifted right, (7,)
    n_pred = len(targets)
    transformer.set_seed(seed)
    model = transformer.DecoderLM(len(vocab), n_embd, n_head, n_positions=n_pred,
                                  n_layers=n_layers).eval()

    def log_probs(x) -> np.ndarray:                                # (1, S) ids -> (S, V)
        logits = model(x)
        return (logits - transformer.logsumexp(logits)).data[0]

    forwards = _count_forwards(model)    # the positions of every forward pass, as it is called
    try:
        with no_grad():
            with tensor.count_ops() as ops_one:
                one_pass = log_probs(inputs)                        # every position at once: (7, V)
            teacher_forcing_calls = list(forwards)
            forwards.clear()
            with tensor.count_ops() as ops_each:
                # 7 × (V,)
                per_prefix = np.stack([log_probs(inputs[:, :t + 1])[-1] for t in range(n_pred)])
    finally:
        del model.forward                   # the class's forward again
    picked = one_pass[np.arange(n_pred), targets]
    return dict(vocab=vocab, inputs=[vocab[i] for i in inputs[0]],
                targets=[vocab[i] for i in targets], one_pass=one_pass, per_prefix=per_prefix,
                max_diff=float(np.abs(one_pass - per_prefix).max()), target_log_probs=picked,
                loss=float(-picked.mean()), forwards=(len(teacher_forcing_calls), len(forwards)),
                positions=(sum(teacher_forcing_calls), sum(forwards)),
                ops=(sum(ops_one.values()), sum(ops_each.values())),
                matmuls=(ops_one["matmul"], ops_each["matmul"]))


def show_teacher_forcing(args):
    r = teacher_forcing(seed=args.seed)
    common.header(1, "§7.1", "Teacher forcing: every position's loss from one forward pass")
    common.note("A causal 2-layer DecoderLM (d = 16, random init, eval mode), vocabulary "
                f"{r['vocab']}.\n"
                f"Input (the target shifted right): {' '.join(r['inputs'])}\n"
                f"Targets ({len(r['targets'])} predictions):       {' '.join(r['targets'])}")
    common.table([[t, inp, tgt, r["one_pass"][t, r["vocab"].index(tgt)],
                   r["per_prefix"][t, r["vocab"].index(tgt)]]
                  for t, (inp, tgt) in enumerate(zip(r["inputs"], r["targets"]))],
                 ["t", "input", "target", "log p (one pass)", "log p (prefix alone)"],
                 floatfmt=".12f")
    common.table([["forward passes", *r["forwards"]],
                  ["positions computed", *r["positions"]],
                  ["primitive ops (tensor.py)", *r["ops"]],
                  ["matmuls among them", *r["matmuls"]]],
                 ["", "teacher forcing", "one pass per prefix"])
    # the difference's digits depend on the CPU's float kernels; the bound does not
    bound = ("≤ 1e-15 (float64 rounding; notes: 1.8e-15)" if r["max_diff"] <= 1e-15
             else f"{r['max_diff']:.1e}: MORE than float64 rounding")
    common.note(f"max |difference| over all {r['one_pass'].size} log-probabilities {bound}; "
                f"sentence loss {r['loss']:.4f} nats/token either way.\nThe causal mask makes "
                "position t blind to tokens after t, so one pass computes what "
                f"{r['forwards'][1]} do.")


# ---- Part 2 · §7.3 label smoothing ---------------------------------------------------------------
# float64 rounding at the scale of parts 2 and 4's values (≤ 1): a few units of 2.2e-16 on any CPU
ROUNDING = 1e-15


def smoothed_targets(V: int, eps: float, correct: int, convention: str) -> np.ndarray:
    """The smoothed one-hot target. 'torch': ε spread over all V classes (F.cross_entropy's
    label_smoothing); 'slides': ε spread over the other V − 1 classes (slides p. 21)."""
    if convention == "torch":
        p = np.full(V, eps / V)
        p[correct] += 1 - eps
    elif convention == "slides":
        p = np.full(V, eps / (V - 1))
        p[correct] = 1 - eps
    else:
        raise ValueError(f"convention must be 'torch' or 'slides', got {convention!r}")
    return p


def smoothed_optimum(p: np.ndarray, eps: float, convention: str,
                     V: int | None = None) -> np.ndarray:
    """q* minimising the expected smoothed cross-entropy when the true next-token distribution is p
    (..., V): the expected target, (1−ε)p + ε/V (torch) or (1−ε)p + ε(1−p)/(V−1) (slides).
    Elementwise: p may also hold single probabilities, with V given."""
    V = p.shape[-1] if V is None else V
    if convention == "torch":
        return (1 - eps) * p + eps / V
    if convention == "slides":
        return (1 - eps) * p + eps * (1 - p) / (V - 1)
    raise ValueError(f"convention must be 'torch' or 'slides', got {convention!r}")


def optimal_gap(V: int = 37000, eps: float = 0.1, correct: int = 3) -> dict:
    """The logit gap at the optimum of the smoothed loss: the formula, and LBFGS on all V logits."""
    rows = []
    for convention in ("slides", "torch"):
        p = smoothed_targets(V, eps, correct, convention)
        # softmax(z) = p  <=>  z_i − z_j = log(p_i/p_j)
        formula = math.log(p[correct] / p[(correct + 1) % V])
        z = torch.zeros(1, V, dtype=torch.float64, requires_grad=True)
        target = torch.from_numpy(p)[None]
        optimizer = torch.optim.LBFGS([z], max_iter=100, tolerance_grad=1e-13,
                                      tolerance_change=1e-15, line_search_fn="strong_wolfe")

        def closure():
            optimizer.zero_grad()
            if convention == "torch":   # torch's own label smoothing, from the class index
                loss = F.cross_entropy(z, torch.tensor([correct]), label_smoothing=eps)
            else:                       # the slides' target, given as probabilities
                loss = F.cross_entropy(z, target)
            loss.backward()
            return loss

        optimizer.step(closure)
        z_opt = z.detach().numpy()[0]
        others = np.delete(z_opt, correct)
        gap_at = np.zeros(V)
        gap_at[correct] = formula
        rows.append(dict(convention=convention, p_correct=p[correct], p_other=p[(correct + 1) % V],
                         gap_formula=formula, gap_lbfgs=float(z_opt[correct] - others.mean()),
                         others_spread=float(others.max() - others.min()),
                         softmax_at_gap=float(np.exp(formula - np.logaddexp.reduce(gap_at)))))
    return dict(V=V, eps=eps, rows=rows)


def conventions(V: int = 10, eps: float = 0.1, correct: int = 3, seed: int = 0) -> dict:
    """Exercise 8: both targets at V = 10, and both gradients. PyTorch's target is read back from
    its own gradient (p = softmax(z) − ∂loss/∂z); the slides' loss −Σ p log softmax(z) =
    logsumexp(z) − p·z is built from transformer.py's primitives and differentiated by tensor.py's
    autodiff."""
    z_np = np.random.default_rng(seed).standard_normal(V)
    softmax = np.exp(z_np - np.logaddexp.reduce(z_np))
    z = torch.tensor(z_np[None], requires_grad=True)
    F.cross_entropy(z, torch.tensor([correct]), label_smoothing=eps).backward()
    p_torch_measured = softmax - z.grad.numpy()[0]
    p_slides = smoothed_targets(V, eps, correct, "slides")
    zt = Tensor(z_np[None], requires_grad=True)
    (transformer.logsumexp(zt) - (zt * p_slides[None]).sum(axis=1, keepdims=True)).sum().backward()
    p_torch = smoothed_targets(V, eps, correct, "torch")
    return dict(V=V, eps=eps, correct=correct, p_torch=p_torch, p_slides=p_slides,
                p_torch_measured=p_torch_measured,
                torch_grad_error=float(np.abs(z.grad.numpy()[0] - (softmax - p_torch)).max()),
                slides_grad_error=float(np.abs(zt.grad[0] - (softmax - p_slides)).max()),
                diff_correct=float(p_torch[correct] - p_slides[correct]),
                diff_other=float(p_slides[(correct + 1) % V] - p_torch[(correct + 1) % V]))


def smoothing_cost(epsilons=(0.01, 0.05, 0.1, 0.2)) -> dict:
    """The exact price of label smoothing on the city language's test set. A model trained to the
    smoothed optimum predicts q* instead of the true p; its test cross-entropy minus the bound is
    the cost. Argmax: the set of most likely tokens at each test position, for q* and for p."""
    test = city_lab.test_set()
    p, V = test.p_true, city_lab.V                                    # (N, S, V)
    bound = city_lab.lower_bound()
    top_p = p == p.max(axis=-1, keepdims=True)                        # (N, S, V) the argmax set
    rows = []
    for eps in epsilons:
        row = dict(eps=eps, ceiling=-1000 * math.log(1 - eps),
                   deterministic=-1000 * math.log(1 - eps + eps / V))
        for convention in ("torch", "slides"):
            q = smoothed_optimum(p, eps, convention)
            cost = city_lab.test_excess_mnats(np.log(q))          # mean −log q*(y) − mean −log p(y)
            kl = 1000 * float((p * (np.log(np.where(p > 0, p, 1.0)) -
                                    np.log(q))).sum(axis=-1).mean())
            same_argmax = (q == q.max(axis=-1, keepdims=True)) == top_p
            row[convention] = dict(cost=cost, cross_entropy=bound + cost / 1000,
                                   perplexity=math.exp(bound + cost / 1000), kl=kl,
                                   argmax_unchanged=int(same_argmax.all(axis=-1).sum()))
        rows.append(row)
    grid = np.linspace(0.0, 0.3, 61)
    curve = {c: np.array([-1000 * float(np.log(smoothed_optimum(test.p_y, e, c, V) /
                                               test.p_y).mean())
                          # only q*(y) is needed: cheap
                          for e in grid]) for c in ("torch", "slides")}
    return dict(V=V, bound=bound, perplexity=math.exp(bound), positions=int(np.prod(p.shape[:2])),
                deterministic_fraction=city_lab.deterministic_fraction(test), rows=rows, grid=grid,
                curve=curve)


def show_label_smoothing(args):
    g = optimal_gap()
    common.header(2, "§7.3", "Label smoothing: a finite optimum, two conventions, an exact price")
    common.note(f"V = {g['V']:,}, ε = {g['eps']}: the smoothed loss is minimised where softmax(z) "
                "= p, so the correct logit beats the others by log(p_correct/p_other):")
    common.table([[row["convention"], f"{row['p_correct']:.7f}", sci(row["p_other"], 4),
                   f"{row['gap_formula']:.6f}", f"{row['gap_lbfgs']:.6f}",
                   common.at_most(row["others_spread"], ROUNDING), f"{row['softmax_at_gap']:.7f}"]
                  for row in g["rows"]],
                 ["convention", "p correct", "p other", "gap: formula",
                  "gap: LBFGS on all V logits", "spread of others", "softmax at the gap"],
                 disable_numparse=True)
    gaps = " and ".join(f"{row['gap_formula']:.2f}" for row in g["rows"])
    common.note(f"slides: log((1−ε)(V−1)/ε); PyTorch: log(1 + (1−ε)V/ε); to two decimals {gaps}. "
                "Without smoothing the gap must go to ∞.")

    print()
    print_conventions(conventions())

    r = smoothing_cost()
    print()
    common.note(f"The exact cost on the city language (a vocabulary of {r['V']}): q* = (1−ε)p + "
                f"ε/V from the true p at each of the {r['positions']:,} test positions,\nthen the "
                f"test cross-entropy (bound {r['bound']:.4f} nats/token, perplexity "
                f"{r['perplexity']:.4f}). Cost = cross-entropy − bound, in mnat/token:")
    common.table([[row["eps"], f"{row['torch']['cross_entropy']:.4f}",
                   f"{row['torch']['perplexity']:.4f}", f"{row['torch']['cost']:.1f}",
                   f"{row['torch']['kl']:.1f}", f"{row['slides']['cost']:.1f}",
                   f"{row['deterministic']:.1f}", f"{row['ceiling']:.2f}",
                   f"{row['torch']['argmax_unchanged']:,} / {r['positions']:,}"]
                  for row in r["rows"]],
                 ["ε", "cross-entropy", "perplexity", "cost (PyTorch q*)", "E KL(p‖q*)",
                  "cost (slides q*)", "if p were one-hot", "ceiling −log(1−ε)", "argmax unchanged"],
                 disable_numparse=True)
    common.note(f"{r['deterministic_fraction']:.1%} of the test targets are certain (p = 1): they "
                "pay almost −log(1−ε) each, the random ones less.\nPerplexity gets worse, but at "
                "every position the most likely tokens stay the most likely (also the slides' q*: "
                f"{r['rows'][-1]['slides']['argmax_unchanged']:,} / {r['positions']:,} at ε = "
                f"{r['rows'][-1]['eps']}).")
    draw_smoothing_cost(r, args.figures)


def print_conventions(c: dict):
    """Exercise 8: the two conventions' targets, class by class, and PyTorch's read back from its
    gradient."""
    k = c["correct"]
    common.note(f"Exercise 8: V = {c['V']}, ε = {c['eps']}, correct class {k}. PyTorch's target "
                "read back from its gradient, p = softmax(z) − ∂loss/∂z:")
    common.table([[i, c["p_slides"][i], c["p_torch"][i], c["p_torch_measured"][i],
                   c["p_torch"][i] - c["p_slides"][i]]
                  for i in range(c["V"])],
                 ["class", "slides: 1−ε / ε/(V−1)", "PyTorch: 1−ε+ε/V / ε/V", "PyTorch, measured",
                  "difference"], floatfmt=".4f")
    common.note(f"correct class: {c['p_torch'][k]:.2f} (PyTorch) vs {c['p_slides'][k]:.2f} "
                f"(slides), differ by {c['diff_correct']:.3f} (= ε/V); each other class by "
                f"{c['diff_other']:.4f}.\nBoth gradients are softmax(z) − p: max error "
                f"{common.at_most(c['torch_grad_error'], ROUNDING)} (F.cross_entropy, "
                f"label_smoothing={c['eps']}), {common.at_most(c['slides_grad_error'], ROUNDING)} "
                "(slides' target, tensor.py autodiff).")


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


# ---- Part 3 · §7.5 the learning-rate formula -----------------------------------------------------
def lr_schedule(d_model: int = 512, warmup: int = 4000, last: int = 200_000) -> dict:
    """transformer.noam_lr: peak, value at 100k, the d = 1024 ratio, the argmax over steps, exercise
    7, step 0."""
    steps = np.arange(1, last + 1)
    lr = transformer.noam_lr(steps, d_model, warmup)
    peak = transformer.noam_lr(warmup, d_model, warmup)
    step_zero = {}
    try:
        d_model ** -0.5 * min(0 ** -0.5, 0 * warmup ** -1.5)    # the formula typed as Python floats
    except ZeroDivisionError as error:
        step_zero["python"] = f"ZeroDivisionError: {error}"
    with np.errstate(divide="ignore"):
        step_zero["numpy"] = float(d_model ** -0.5 * np.minimum(np.float64(0) ** -0.5,
                                                                0 * warmup ** -1.5))
    try:
        transformer.noam_lr(0, d_model, warmup)
    except ValueError as error:
        step_zero["noam_lr"] = f"ValueError: {str(error).split(';')[0]}"
    # torch's LambdaLR evaluates the factor at step 0 when it is built, before the first update
    opt = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=1.0)
    try:
        torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: d_model ** -0.5 * min(s ** -0.5, s * warmup ** -1.5))
    except ZeroDivisionError as error:
        step_zero["lambda_lr"] = f"ZeroDivisionError: {error}"
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: transformer.noam_lr(s + 1, d_model, warmup))
    first_lrs = []
    for _ in range(3):
        first_lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        schedule.step()
    return dict(d_model=d_model, warmup=warmup, steps=steps, lr=lr, peak=peak,
                argmax=int(steps[np.argmax(lr)]),
                at_100k=transformer.noam_lr(100_000, d_model, warmup),
                peak_1024=transformer.noam_lr(warmup, 1024, warmup),
                ratio_1024=peak / transformer.noam_lr(warmup, 1024, warmup),
                lr_1024=transformer.noam_lr(steps, 1024, warmup),
                ex7={s: transformer.noam_lr(s, d_model, warmup) for s in (2000, 16000)},
                ex7_parts=dict(d_factor=d_model ** -0.5, warmup_factor=warmup ** 1.5,
                               rsqrt_16000=16000 ** -0.5),
                step_one=transformer.noam_lr(1, d_model, warmup), step_zero=step_zero,
                first_lrs=first_lrs)


def show_lr_schedule(args):
    r = lr_schedule()
    d, w = r["d_model"], r["warmup"]
    common.header(3, "§7.5", "The paper's learning rate: d^−0.5 · min(step^−0.5, step · "
                             f"warmup^−1.5), d = {d}, warmup = {w}")
    ex7, parts = r["ex7"], r["ex7_parts"]
    common.table([["peak, at step warmup", f"{d}^−0.5 · {w}^−0.5", sci(r["peak"])],
                  [f"argmax over steps 1..{len(r['steps']):,}", "", f"{r['argmax']:,}"],
                  ["step 100k", f"{d}^−0.5 · 100000^−0.5", sci(r["at_100k"])],
                  ["peak at d = 1024", "1024^−0.5 · 4000^−0.5", sci(r["peak_1024"])],
                  ["peak d = 512 / peak d = 1024", "√(1024/512)", f"{r['ratio_1024']:.6f}"],
                  ["exercise 7: step 2000 (rising)",
                   f"{parts['d_factor']:.4f} × 2000 / {parts['warmup_factor']:,.0f}",
                   sci(ex7[2000])],
                  ["exercise 7: step 16000 (falling)",
                   f"{parts['d_factor']:.4f} × {parts['rsqrt_16000']:.5f}", sci(ex7[16000])],
                  ["both / peak", "2000/4000 = √(4000/16000)", f"{ex7[2000] / r['peak']:.4f}, "
                                                                f"{ex7[16000] / r['peak']:.4f}"]],
                 ["", "formula", "lr"], disable_numparse=True)
    z = r["step_zero"]
    common.note("\nStep 0 is not in the formula's domain (step^−0.5 = 1/√0):\n"
                f"  Python floats:          {z['python']}\n"
                f"  numpy:                  min(inf, 0) = {z['numpy']}: a wasted first update "
                "(and a RuntimeWarning)\n"
                f"  torch LambdaLR(formula) {z['lambda_lr']} (it evaluates step 0 when built)\n"
                f"  transformer.noam_lr(0)  {z['noam_lr']}\n"
                f"Counting updates from 1, the first lr is peak/{w} = {sci(r['step_one'], 3)}, "
                f"not 0; LambdaLR(lambda s: noam_lr(s + 1)) gives "
                f"{', '.join(sci(x, 3) for x in r['first_lrs'])} for the first three updates.")
    draw_lr_schedule(r, args.figures)


@common.draws_figure
def draw_lr_schedule(r, figures_dir):
    import matplotlib.pyplot as plt
    show = r["steps"] <= 100_000
    steps = r["steps"][show]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(steps, r["lr"][show], label=f"d = {r['d_model']}")
    ax.plot(steps, r["lr_1024"][show], label="d = 1024 (peak √2 lower)")
    ax.plot([r["argmax"]], [r["peak"]], "ko", ms=4)
    ax.annotate(f"peak {sci(r['peak'])} at step {r['argmax']:,}", (r["argmax"], r["peak"]),
                xytext=(12, -2), textcoords="offset points", fontsize=8)
    for s, lr in r["ex7"].items():
        ax.plot([s], [lr], "s", color="tab:green", ms=4)
    ax.annotate(f"steps 2,000 and 16,000: {sci(r['ex7'][2000])} (half the peak)",
                (16000, r["ex7"][16000]), xytext=(8, 6), textcoords="offset points", fontsize=8,
                color="tab:green")
    ax.plot([100_000], [r["at_100k"]], "ko", ms=3)
    ax.annotate(f"{sci(r['at_100k'])} at 100k", (100_000, r["at_100k"]), xytext=(-70, 10),
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


# ---- Part 4 · §7.5 Adam's first step -------------------------------------------------------------
def adam_first_step(gradients=tuple((-1) ** i * 10.0 ** e for i, e in enumerate(range(-6, 4))),
                    lr: float = 1e-3, betas=(0.9, 0.98), epsilons=(1e-9, 1e-8)) -> dict:
    """One Adam step from θ = 0 on one parameter per gradient value, with torch.optim.Adam and with
    transformer.Adam: update/lr against |g|/(|g| + ε), and SGD's update/lr = g for contrast."""
    g = np.array(gradients, dtype=np.float64)
    rows = {"gradient": g, "sgd": g.copy()}
    for eps in epsilons:
        theta = torch.zeros(len(g), dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.Adam([theta], lr=lr, betas=betas, eps=eps)
        theta.grad = torch.from_numpy(g.copy())
        optimizer.step()
        ours = transformer.Parameter(np.zeros(len(g)))
        ours.grad = g.copy()
        transformer.Adam([ours], lr=lr, betas=betas, eps=eps).step()
        rows[eps] = dict(torch=-theta.detach().numpy() / lr, ours=-ours.data / lr,
                         formula=g / (np.abs(g) + eps))
    return dict(lr=lr, betas=betas, epsilons=epsilons, rows=rows)


def show_adam_first_step(args):
    r = adam_first_step()
    rows, (e1, e2) = r["rows"], r["epsilons"]
    common.header(4, "§7.5", f"Adam's first step: update ≈ lr · sign(g), lr = {sci(r['lr'], 0)}, "
                             f"β = {r['betas']}")
    common.note("Bias correction makes m̂ = g and v̂ = g² after one step, so the update is lr · "
                "g/(|g| + ε):")
    common.table([[sci(g, 0), sci(g, 0),
                   *(f"{rows[e][k][i]:+.6f}" for e in (e1, e2) for k in ("torch", "ours")),
                   f"{rows[e1]['formula'][i]:+.6f}", f"{rows[e2]['formula'][i]:+.6f}"]
                  for i, g in enumerate(rows["gradient"])],
                 ["gradient g", "SGD update/lr", f"Adam ε={sci(e1, 0)}: torch", "ours",
                  f"ε={sci(e2, 0)} (torch default): torch", "ours", f"g/(|g|+{sci(e1, 0)})",
                  f"g/(|g|+{sci(e2, 0)})"],
                 disable_numparse=True)
    worst = max(float(np.abs(rows[e][k] - rows[e]["formula"]).max()) for e in (e1, e2)
                for k in ("torch", "ours"))
    common.note(f"max |measured − formula| {common.at_most(worst, ROUNDING)}. "
                "Nine orders of magnitude of gradient, one "
                "step size: every parameter moves by about lr at once,\nwhatever its gradient. "
                "Only when |g| nears ε does the step shrink. Warmup keeps these first full-size "
                "steps small.")


# ---- Part 5 · §7.6 checkpoint averaging ----------------------------------------------------------
# the model of parts 5 and 6 (city_train.build_model's sizes): 1 layer, so that its runs fit the
# budget
CITY_MODEL = dict(n_layers=1, n_embd=64, n_head=4)


# part 5 measures the jitter of a constant-lr run between checkpoints this many steps apart
JITTER_EVERY = 10


def constant_lr_run(seed: int, model_size: dict = CITY_MODEL, steps: int = 400, lr: float = 3e-3,
                    jitter_every: int = JITTER_EVERY) -> dict:
    """A city_train.run at a CONSTANT lr with a checkpoint every `jitter_every` steps, the test set
    scored after the last step: part 5 averages some of its checkpoints and measures the jitter
    between the last ones, part 6 writes with its last one. The seed draws both the initial
    weights and the batches."""
    return dict(model=dict(model_size, seed=seed),
                training=dict(steps=steps, lr=lr, seed=seed, eval_every=steps,
                              checkpoint_every=jitter_every))


def decaying_lr_run(seed: int, model_size: dict = CITY_MODEL, steps: int = 400, lr: float = 3e-3,
                    checkpoint_every: int = 50) -> dict:
    """The same run with the lr decaying linearly to 0, checkpointed alike: the first seed's
    checkpoints are scored afterwards (its curve is drawn), so that every seed's run has the same
    settings and all of them train in one stack."""
    return dict(model=dict(model_size, seed=seed),
                training=dict(steps=steps, lr=lr, seed=seed, eval_every=steps,
                              schedule="linear", checkpoint_every=checkpoint_every))


def test_excess_of(state_dicts: list, model: dict) -> float:
    """Test excess (mnat/token) of the element-wise average of some checkpoints of a model built as
    `model`."""
    net = city_train.build_model(**model)
    net.load_state_dict(city_train.average_state_dicts(state_dicts))
    return city_train.evaluate(net)


def averaging_runs(seeds, model_size: dict = CITY_MODEL, steps: int = 400, lr: float = 3e-3,
                   checkpoint_every: int = 50, decayed: bool = True,
                   jitter_every: int = JITTER_EVERY) -> list[dict]:
    """Part 5's runs: constant_lr_run at every seed, then (decayed=True) decaying_lr_run at every
    seed."""
    if checkpoint_every % jitter_every or steps % checkpoint_every:
        raise ValueError(f"averaging_runs: checkpoint_every ({checkpoint_every}) must be a "
                         f"multiple of jitter_every ({jitter_every}) and divide steps ({steps}), "
                         "so that the checkpoints averaged are among those the constant-lr run "
                         "keeps")
    sizes = dict(model_size=model_size, steps=steps, lr=lr)
    runs = [constant_lr_run(seed, **sizes, jitter_every=jitter_every) for seed in seeds]
    if decayed:
        runs += [decaying_lr_run(seed, **sizes, checkpoint_every=checkpoint_every)
                 for seed in seeds]
    return runs


def every(trained: city_train.TrainResult, checkpoint_every: int) -> city_train.TrainResult:
    """The run with only its checkpoints at multiples of checkpoint_every."""
    return dataclasses.replace(trained, checkpoints=[(step, state_dict)
                                                     for step, state_dict in trained.checkpoints
                                                     if step % checkpoint_every == 0])


def jitter(constant: city_train.TrainResult, model: dict, averaged: float, last: int = 10) -> dict:
    """The jitter that averaging cancels, on a constant-lr run checkpointed every few steps: the
    test excess of its last `last` checkpoints, their mean |change| from one to the next against
    their mean change over all of them (the trend), how often they rise, and by how much the
    `averaged` model's excess stays below the lowest of them."""
    steps = [step for step, _ in constant.checkpoints[-last:]]
    excess = [test_excess_of([state_dict], model)
              for _, state_dict in constant.checkpoints[-last:-1]]
    excess.append(constant.final_excess)
    changes = np.diff(excess)
    return dict(steps=steps, excess=excess, mean_change=float(np.abs(changes).mean()),
                trend=float(changes.mean()), rises=int((changes > 0).sum()), averaged=averaged,
                below_lowest=min(excess) - averaged)


def scored_checkpoints(trained: city_train.TrainResult, model: dict) -> list:
    """[(step, test excess)] at every checkpoint of a run, the last one scored by training."""
    scored = [(step, test_excess_of([state_dict], model))
              for step, state_dict in trained.checkpoints[:-1]]
    return scored + [(trained.checkpoints[-1][0], trained.final_excess)]


def checkpoint_averaging(seeds=(0, 1, 2), model_size: dict = CITY_MODEL, steps: int = 400,
                         lr: float = 3e-3, checkpoint_every: int = 50, ks=(2, 3, 4, 5, None),
                         decayed: bool = True, jitter_every: int = JITTER_EVERY) -> dict:
    """Train averaging_runs: for each seed a Pre-LN DecoderLM on the city language at a constant lr
    and (decayed=True) with the lr decaying. Test excess of the last checkpoint, of the average of
    the last k checkpoints (k None: all of them) and of the decayed run; each one's difference from
    the last checkpoint of its own seed, and the median, range and sign count of those differences
    over the seeds.

    Only seeds[0]'s runs are scored at every checkpoint (its table and figure); the others only at
    the end, which is all the summary needs (an evaluation costs as much as 6-8 training steps).
    Training scores only the last step, so that every seed's runs share their settings and train in
    one stack; seeds[0]'s checkpoints are scored here, and its jitter (the constant-lr run keeps a
    checkpoint every jitter_every steps).
    """
    seeds = list(seeds)
    runs = averaging_runs(seeds, model_size, steps, lr, checkpoint_every, decayed, jitter_every)
    results = city_train.train_many(runs)
    per_seed = []
    for i, seed in enumerate(seeds):
        constant, model = every(results[i], checkpoint_every), runs[i]["model"]
        state_dicts = [state_dict for _, state_dict in constant.checkpoints]
        checkpoints = (scored_checkpoints(constant, model) if i == 0 else
                       [(step, None) for step, _ in constant.checkpoints[:-1]]
                       + [(constant.checkpoints[-1][0], constant.final_excess)])
        averaged = {k or len(state_dicts): test_excess_of(state_dicts[-(k or len(state_dicts)):],
                                                          model)
                    for k in ks}
        decayed_run = results[len(seeds) + i] if decayed else None
        per_seed.append(dict(seed=seed, checkpoints=checkpoints, last=constant.final_excess,
                             averaged=averaged,
                             decayed=decayed_run.final_excess if decayed else None,
                             decayed_curve=(scored_checkpoints(decayed_run, model)
                                       if decayed and i == 0 else None)))
    n = len(per_seed[0]["checkpoints"])
    rows = [dict(name="last", k=None, excess=[r["last"] for r in per_seed])]
    rows += [dict(name="average", k=k, excess=[r["averaged"][k] for r in per_seed])
             for k in per_seed[0]["averaged"]]
    if decayed:
        rows.append(dict(name="decayed", k=None, excess=[r["decayed"] for r in per_seed]))
    # paired with its own seed's last checkpoint: the seeds differ more than the methods do
    for row in rows:
        row["vs_last"] = [e - r["last"] for e, r in zip(row["excess"], per_seed)]
        row["beats_last"] = sum(d < 0 for d in row["vs_last"])
        row["spread"], row["vs_last_spread"] = spread(row["excess"]), spread(row["vs_last"])
    first = per_seed[0]
    return dict(seeds=seeds, **model_size, steps=steps, lr=lr,
                checkpoint_every=checkpoint_every, n_checkpoints=n, runs=per_seed, rows=rows,
                # seeds[0]'s run, under the names the table and the figure use
                checkpoints=first["checkpoints"], last=first["last"], averaged=first["averaged"],
                decayed=first["decayed"], decayed_curve=first["decayed_curve"],
                jitter=jitter(results[0], runs[0]["model"], first["averaged"][min(5, n)],
                              last=min(10, len(results[0].checkpoints))))


def averaging_vs_decay(r: dict, k: int = 5) -> list[float]:
    """Per seed: what averaging the last k checkpoints gains over the last checkpoint, divided by
    what decaying the lr gains (1: the same; the notes say averaging does about as much as decaying
    the lr)."""
    rows = {row["k"] or row["name"]: row for row in r["rows"]}
    return [a / d for a, d in zip(rows[k]["vs_last"], rows["decayed"]["vs_last"])]


def spread(values) -> tuple[float, float, float]:
    """(median, min, max)."""
    return float(np.median(values)), float(min(values)), float(max(values))


def part5_seeds(args) -> list[int]:
    # --quick: one seed. Shorter runs would not do: the last 5 checkpoints of a 200-step run span a
    # part of the curve that still falls steeply, and their average loses to the last checkpoint
    return common.seeds_of(args)[:1] if args.quick else common.seeds_of(args)


def part5_runs(args) -> tuple:
    """The runs show_checkpoint_averaging will ask for, so that common.main can start them before
    part 1."""
    return city_train.planned(averaging_runs(part5_seeds(args)))


def show_checkpoint_averaging(args):
    r = checkpoint_averaging(seeds=part5_seeds(args))
    common.header(5, "§7.6", f"Checkpoint averaging at a constant lr of {r['lr']:g}")
    print_checkpoints(r)
    print_against_the_last(r)
    print_averaging_counts(r)
    print_jitter(r)
    draw_checkpoint_averaging(r, args.figures)


def print_checkpoints(r: dict):
    """The setup, then the first seed's test excess at every checkpoint."""
    seeds, first, many = r["seeds"], r["seeds"][0], len(r["seeds"]) > 1
    common.note(f"A {r['n_layers']}-layer Pre-LN DecoderLM (d = {r['n_embd']}, h = {r['n_head']}, "
                f"Adam, batch 8 × 32, fresh data every step) on the city language,\n{r['steps']} "
                f"steps, a checkpoint every {r['checkpoint_every']} steps; seed{'s' * many} "
                f"{', '.join(map(str, seeds))} (a seed draws the initial weights and the batches)."
                f"\nTest excess over the exact bound in mnat/token, seed {first}:")
    common.table([[step, f"{excess:.0f}"] for step, excess in r["checkpoints"]],
                 ["checkpoint (step)", f"test excess, seed {first}"], disable_numparse=True,
                 kernel_dependent=True)


def print_against_the_last(r: dict):
    """Every model (last checkpoint, averages, decayed lr) against the last checkpoint of its own
    seed: at the first seed, and (several seeds) the median and range over them."""
    seeds, steps, every, n = r["seeds"], r["steps"], r["checkpoint_every"], r["n_checkpoints"]
    first, many = seeds[0], len(seeds) > 1

    def label(row) -> str:
        if row["name"] == "last":
            return f"last checkpoint (step {steps})"
        if row["name"] == "decayed":
            return f"lr decaying linearly to 0, step {steps}"
        k = row["k"]
        return (f"all {k} checkpoints" if k == n else f"average of the last {k}") + \
            f" (steps {steps - (k - 1) * every}-{steps})"

    table = []
    for row in r["rows"]:
        (median, lo, hi), (d_median, d_lo, d_hi) = row["spread"], row["vs_last_spread"]
        paired = row["name"] != "last"
        line = [label(row), f"{row['excess'][0]:.0f}",
                f"{row['vs_last'][0]:+.0f}" if paired else ""]
        if many:
            line += [f"{median:.0f}", f"{lo:.0f} to {hi:.0f}", f"{d_median:+.0f}" if paired else "",
                     f"{d_lo:+.0f} to {d_hi:+.0f}" if paired else ""]
        table.append(line)
    headers = ["model", f"seed {first}", "vs last"]
    if many:
        headers += [f"median of {len(seeds)} seeds", "range over seeds", "vs last: median",
                    "vs last: range"]
    common.note("\nEach model against the last checkpoint of its own seed (vs last = its excess − "
                "the last one's):")
    common.table(table, headers, disable_numparse=True, kernel_dependent=True)


# "about as much": within this factor. Over seeds 0-9 the ratio of the two gains was 0.7-1.5 at 8
# seeds (median 1.07); the other two had a gain of either near 0.
ABOUT_AS_MUCH = 1.5


def averaging_claims(r: dict) -> dict:
    """Part 5's claims, each as its margin at every seed (> 0 where it holds): a model beats the
    last checkpoint by (last − its excess) mnat/token; averaging the last 5 gains "about as much"
    as decaying the lr where the ratio of the two gains is within a factor of ABOUT_AS_MUCH (margin
    log ABOUT_AS_MUCH − |log ratio|)."""
    rows = {row["k"] or row["name"]: row for row in r["rows"]}
    claims = {key: [-d for d in rows[key]["vs_last"]] for key in (5, "decayed", r["n_checkpoints"])}
    claims["about as much"] = [math.log(ABOUT_AS_MUCH) - abs(math.log(ratio)) if ratio > 0
                               else -math.inf for ratio in averaging_vs_decay(r)]
    return claims


# Other float kernels (ATEN_CPU_CAPABILITY=default, MKL_CBWR=COMPATIBLE) move these excesses by a
# few mnat/token: a seed decided by less than this may count the other way on another CPU.
AVERAGING_TIPPING = 5.0


def print_averaging_counts(r: dict):
    """At how many seeds each model beats the last checkpoint, by how much, and averaging's gain
    against decaying's."""
    n, many = r["n_checkpoints"], len(r["seeds"]) > 1
    claims = averaging_claims(r)
    rows = {row["k"] or row["name"]: row for row in r["rows"]}
    by = lambda key: ("{1:+.0f} to {2:+.0f} (median {0:+.0f})" if many else "{0:+.0f}").format(
        *rows[key]["vs_last_spread"])
    common.count_line("averaging the last 5 checkpoints beats the last checkpoint", claims[5],
                      AVERAGING_TIPPING)
    common.count_line("decaying the lr beats the last checkpoint", claims["decayed"],
                      AVERAGING_TIPPING)
    common.count_line(f"averaging all {n} checkpoints beats the last checkpoint", claims[n],
                      AVERAGING_TIPPING)
    common.kernel_note(f"Against the last checkpoint, in mnat/token: the last 5 {by(5)}; the "
                       f"decaying lr {by('decayed')}.")
    gain_ratio = averaging_vs_decay(r)
    common.kernel_note(f"Averaging the last 5 gains {min(gain_ratio):.1f}× to "
                       f"{max(gain_ratio):.1f}× "
                       "what decaying the lr gains over the last checkpoint (per seed).")
    # a ratio moves with both gains: always ⚙
    common.count_line("averaging the last 5 gains about as much as decaying the lr (within a "
                      f"factor of {ABOUT_AS_MUCH:g})", claims["about as much"], math.inf,
                      notes="about as much")


def print_jitter(r: dict):
    """The first seed's jitter: its last checkpoints jitter_every steps apart, against the average
    of the last 5 checkpoints, then the sentence they word."""
    j, first = r["jitter"], r["seeds"][0]
    apart, k = j["steps"][1] - j["steps"][0], min(5, r["n_checkpoints"])
    common.note(f"\nThe jitter, seed {first}: the test excess of its last {len(j['steps'])} "
                f"checkpoints, {apart} steps apart:")
    common.table([["test excess", *(f"{e:.0f}" for e in j["excess"])]],
                 ["step", *j["steps"]], disable_numparse=True, kernel_dependent=True)
    common.kernel_note(f"From one to the next it moves by {j['mean_change']:.1f} on average (up at "
                       f"{j['rises']} of {len(j['steps']) - 1}), while its trend is "
                       f"{j['trend']:+.1f} per {apart} steps; the average of the last {k} "
                       f"checkpoints scores {j['averaged']:.0f}, {j['below_lowest']:.0f} below the "
                       "lowest of them.")
    cancels = (j["rises"] > 0 and j["mean_change"] > 2 * abs(j["trend"])
               and j["below_lowest"] > 0)
    # worded by the ⚙ numbers above
    common.kernel_note(
        "At a constant lr the weights keep being pulled around by the latest batches (the excess "
        "jumps more than it trends);\naveraging the last few checkpoints cancels that jitter (it "
        "scores below every one of them), at no training cost." if cancels else
        "Here the checkpoints do not jump more than they trend, or their average does not score "
        "below them: no jitter is shown cancelled.")
    common.note("Averaging from early in training drags in weights that were still poor.")


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


# ---- Part 6 · §7.1, exercise 11 training is parallel, generation is serial -----------------------
def constant_lr_models(seeds) -> dict[int, city_train.TrainResult]:
    """Part 5's constant-lr runs (CITY_MODEL, Pre-LN, lr 3e-3, 400 steps, float32 torch_ref) at
    every seed -> {seed: its TrainResult}, whose last checkpoint holds the final weights: the runs
    part 5 trained if it ran (runner.py keeps them), else trained now, side by side."""
    seeds = list(seeds)
    return dict(zip(seeds, city_train.train_many([constant_lr_run(seed) for seed in seeds])))


def float64_copy(state_dict: dict, n_head: int = CITY_MODEL["n_head"]) -> transformer.DecoderLM:
    """transformer.DecoderLM (float64, tensor.py) holding the weights of a city_train model
    (float32, torch_ref): both name their parameters alike, so each tensor is copied by name, its
    shape checked."""
    n_embd = state_dict["token_embeddings.weights"].shape[1]
    n_layers = len({k.split(".")[1] for k in state_dict if k.startswith("layers.")})
    ours = transformer.DecoderLM(city_lab.V, n_embd, n_head, n_positions=city_lab.SEQ_LEN,
                                 n_layers=n_layers, p_dropout=0.0)
    names = [n for n, _ in ours.named_parameters()]
    if sorted(names) != sorted(state_dict):
        raise ValueError(f"float64_copy: parameter names differ:\n ours:  {names}\n torch: "
                         f"{list(state_dict)}")
    for name, p in ours.named_parameters():
        value = state_dict[name].detach().double().numpy()
        if value.shape != p.data.shape:
            raise ValueError(f"float64_copy: {name} is {value.shape} in torch, {p.data.shape} here")
        p.data[...] = value
    return ours.eval()


def serial_generation(model: transformer.DecoderLM, lengths=(8, 16, 31), batch: int = 16,
                      seed: int = 0) -> dict:
    """Generate n tokens after <bos> for each n in lengths (batch rows, sampled at T = 1, seeded),
    with and without the KV cache: forward passes (counted, and Generation.n_forward), positions run
    through the model (Generation.positions_computed) and time, one run each. Then teacher forcing:
    one forward over the finished windows, which must give every step's logits again."""
    prompt = np.full((batch, 1), city_lab.BOS)
    forwards = _count_forwards(model)
    rows = []
    try:
        for n in lengths:
            runs = {}
            for use_cache in (True, False):
                forwards.clear()
                with common.stopwatch() as elapsed:
                    result = model.generate(prompt, n, sample=True, rng=np.random.default_rng(seed),
                                            use_cache=use_cache)
                runs[use_cache] = (result, len(forwards), elapsed(), elapsed.cpu())
            (cached, calls_cached, wall_cached, cpu_cached) = runs[True]
            (full, calls_full, wall_full, cpu_full) = runs[False]
            forwards.clear()
            with no_grad():
                # (B, n, V)
                one_pass = model(np.concatenate([prompt, cached.tokens[:, :-1]], axis=1)).data
            rows.append(dict(n=n, forwards_cached=cached.n_forward, forwards_full=full.n_forward,
                             calls_cached=calls_cached, calls_full=calls_full,
                             calls_teacher=len(forwards),
                             positions_cached=cached.positions_computed,
                             positions_full=full.positions_computed,
                             same_tokens=bool((cached.tokens == full.tokens).all()),
                             cache_logits_diff=float(np.abs(cached.logits - full.logits).max()),
                             teacher_logits_diff=float(np.abs(cached.logits - one_pass).max()),
                             wall_cached=wall_cached, wall_full=wall_full, cpu_cached=cpu_cached,
                             cpu_full=cpu_full))
    finally:
        del model.forward                   # the class's forward again
    return dict(batch=batch, rows=rows)


def _sentences(words: list) -> list:
    """Split at "." (and <bos>, which ends a story): the complete sentences, each a tuple of
    words."""
    sentences, current = [], []
    for w in words:
        current.append(w)
        if w in (".", "<bos>"):
            sentences.append(tuple(current))
            current = []
    return sentences


def score_against_the_language(windows: np.ndarray, prompt_len: int) -> dict:
    """Replay each window (token ids from <bos>) through the city language's grammar
    (city_lab.stories) and score the tokens after the prompt by their true probability p(token |
    every token before it). A token with p = 0 is one the language forbids; after it the story's
    state is undefined, so scoring stops there (at most one per window). Also: the continuation's
    complete sentences that repeat an earlier sentence of the same window."""
    scored = forbidden = clean = repeated = sentences = 0
    log_p = 0.0
    for window in windows:
        words = [city_lab.VOCAB[i] for i in window]
        story = city_lab.stories()              # starts just after a <bos>
        distribution = next(story)
        for w in words[1:prompt_len]:
            distribution = story.send(w)
        end = len(words)
        for t in range(prompt_len, len(words)):
            p = distribution.get(words[t], 0.0)
            scored += 1
            if p == 0.0:
                forbidden += 1
                end = t
                break
            log_p += math.log(p)
            distribution = story.send(words[t])
        clean += end == len(words)
        seen = set(_sentences(words[1:prompt_len]))
        for sentence in _sentences(words[prompt_len:end]):
            sentences += 1
            repeated += sentence in seen
            seen.add(sentence)
    return dict(windows=len(windows), scored=scored, forbidden=forbidden,
                allowed=1 - forbidden / scored, clean=clean,
                log_p_per_token=log_p / (scored - forbidden), sentences=sentences,
                repeated=repeated / max(sentences, 1))


# the decoding rules part 6 scores: generate()'s arguments; the sampled ones seeded by the model's
# seed. Beam search's α only matters where hypotheses differ in length: here every one has n_new
# tokens (no end token), so beam 4 at the paper's α = 0.6 ranks as it would at α = 0.
DECODINGS = {"greedy": dict(),
             "beam 2": dict(num_beams=2),
             "beam 4, α = 0.6": dict(num_beams=4, length_penalty=0.6),
             "beam 8": dict(num_beams=8),
             "sampled": dict(sample=True, temperature=1.0),
             "T = 0.7": dict(sample=True, temperature=0.7),
             "top-k 10": dict(sample=True, top_k=10),
             "top-p 0.9": dict(sample=True, top_p=0.9)}
BEAMS = [name for name, rule in DECODINGS.items() if rule.get("num_beams", 1) > 1]
# the rules generation_claims compares (the table shows the others at the first seed only)
CLAIMS_RULES = ["greedy", *BEAMS, "sampled", "top-p 0.9"]


def model_log_p_per_token(model: transformer.DecoderLM, windows: np.ndarray,
                          prompt_len: int) -> float:
    """The model's own mean log p per token of the windows' tokens after the prompt, one
    teacher-forced pass (what beam search maximises, beside the language's true log p)."""
    with no_grad():
        logits = model(windows[:, :-1])
        log_p = (logits - transformer.logsumexp(logits)).data     # (N, S - 1, V)
    chosen = np.take_along_axis(log_p, windows[:, 1:, None], axis=-1)[..., 0]
    return float(chosen[:, prompt_len - 1:].mean())


def generation_quality(weights: dict, steps: int, excess: float, seed: int, n_windows: int = 64,
                       prompt_len: int = 6, rules: list | None = None) -> dict:
    """Continue the first sentence (<bos> NAME lives in CITY .) of n_windows test stories to SEQ_LEN
    tokens with the float64 copy of the final weights of a constant_lr_models result (trained at
    `seed` for `steps` steps to a test excess `excess`) by every rule of DECODINGS (sampling with
    an rng seeded by `seed`), and score each text against the language and by the model's own log p
    per token; the test windows' own continuations are the reference. rules: the names of DECODINGS
    to decode by (None: all)."""
    ours = float64_copy(weights)
    test = city_lab.test_set()
    # (N, 32) from <bos>
    windows = np.concatenate([test.x, test.y[:, -1:]], axis=1)[:n_windows, :city_lab.SEQ_LEN]
    prompts, n_new = windows[:, :prompt_len], city_lab.SEQ_LEN - prompt_len
    # greedy decoding and beam search give a prompt one answer, whatever the rest of the batch
    # (tests/test_beam_search.py): each distinct prompt is decoded once, then copied to its windows
    distinct, copies = np.unique(prompts, axis=0, return_inverse=True)
    texts, scores = {}, {}
    for name in DECODINGS if rules is None else rules:
        rule = DECODINGS[name]
        if rule.get("sample"):
            generation = ours.generate(prompts, n_new, rng=np.random.default_rng(seed), **rule)
            tokens, generated_log_p = generation.tokens, generation.scores
        else:
            generation = ours.generate(distinct, n_new, **rule)
            tokens, generated_log_p = (generation.tokens[copies.ravel()],
                                       generation.scores[copies.ravel()])
        texts[name] = np.concatenate([prompts, tokens], axis=1)
        scores[name] = dict(score_against_the_language(texts[name], prompt_len),
                            model_log_p_per_token=float(generated_log_p.mean() / n_new),
                            distinct=len({tuple(row) for row in tokens}))
    original = city_train.build_model(**CITY_MODEL, seed=seed)
    original.load_state_dict(weights)
    with torch.no_grad():
        theirs = torch.log_softmax(original(torch.from_numpy(windows[:8])).double(), dim=-1).numpy()
    with no_grad():
        logits = ours(windows[:8])
        mine = (logits - transformer.logsumexp(logits)).data
    return dict(seed=seed, steps=steps, excess=excess,
                n_windows=n_windows, prompt_len=prompt_len, n_new=n_new,
                float32_vs_float64=float(np.abs(theirs - mine).max()),
                language=dict(score_against_the_language(windows, prompt_len),
                              model_log_p_per_token=model_log_p_per_token(ours, windows,
                                                                          prompt_len),
                              distinct=len({tuple(row) for row in windows[:, prompt_len:]})),
                **scores, texts=texts, greedy_distinct=scores["greedy"]["distinct"],
                prompts_distinct=len({tuple(row) for row in prompts}))


# How far other float kernels move a claim's margin at a seed: one argmax that flips rewrites a
# greedy window's continuation. Measured at seeds 0-2 (AMD EPYC, AVX2) against torch's generic
# kernels, MKL's compatible path and numpy without AVX-512: beam 4's repeat share moved by up to
# 0.023, the log-probabilities by 0.007, greedy text's forbidden share from 0.0055 to 0 (seed 2)
GENERATION_TIPPING = 0.03


# ---- part 6's decoding as runs of runner.py: computed in its workers, beside part 5's scoring ----
def plain_weights(state_dict: dict) -> dict:
    """A float32 state dict as plain data, which runner.py keys a run by: each tensor's shape and
    its bytes in base64 (state_dict_of gives back the same bits)."""
    return {name: dict(shape=list(value.shape),
                       float32=base64.b64encode(value.detach().float().numpy().tobytes())
                       .decode("ascii"))
            for name, value in state_dict.items()}


def state_dict_of(weights: dict) -> dict:
    """plain_weights' inverse: {name: float32 tensor}."""
    return {name: torch.from_numpy(np.frombuffer(base64.b64decode(w["float32"]), dtype=np.float32)
                                   .reshape(w["shape"]).copy())
            for name, w in weights.items()}


def generation_quality_of(weights: dict, **settings) -> dict:
    """generation_quality of weights given as plain_weights: a run for runner.map."""
    return generation_quality(state_dict_of(weights), **settings)


def serial_generation_of(weights: dict, lengths: list, batch: int, seed: int) -> dict:
    """serial_generation of the float64 copy of weights given as plain_weights: a run for
    runner.map."""
    return serial_generation(float64_copy(state_dict_of(weights)), lengths=tuple(lengths),
                             batch=batch, seed=seed)


def generation_quality_runs(models: dict, n_windows: int) -> list[dict]:
    """generation_quality's arguments for every model of constant_lr_models ({seed:
    TrainResult}), as plain data: the first model by every rule (its table), the others by the
    rules generation_claims compares."""
    return [dict(weights=plain_weights(trained.checkpoints[-1][1]),
                 steps=trained.checkpoints[-1][0], excess=trained.final_excess, seed=seed,
                 n_windows=n_windows, rules=None if i == 0 else CLAIMS_RULES)
            for i, (seed, trained) in enumerate(models.items())]


def part6_runs(args) -> list[tuple]:
    """Part 6's decoding, [(function, [its runs])]: generation_quality of the first
    GENERATION_SEEDS of part 5's constant-lr models, then serial_generation of the model of --seed.
    The models come from constant_lr_models, which waits for them to be trained. common.main
    starts these runs alongside part 5, to decode while part 5 scores."""
    models = constant_lr_models(part5_seeds(args))
    serial = dict(weights=plain_weights(models[args.seed].checkpoints[-1][1]),
                  lengths=[8, 31] if args.quick else [8, 16, 31], batch=16, seed=args.seed)
    return [(generation_quality_of,
             generation_quality_runs(dict(list(models.items())[:GENERATION_SEEDS]),
                                     n_windows=32 if args.quick else 64)),
            (serial_generation_of, [serial])]


def generation_over_seeds(models: dict, n_windows: int = 64) -> dict:
    """generation_quality of every model of constant_lr_models ({seed: TrainResult}), in
    runner.py's workers, and generation_claims of them."""
    return generation_claims(runner.map(generation_quality_of,
                                        generation_quality_runs(models, n_windows)))


def generation_claims(per_seed: list) -> dict:
    """Each of part 6's claims over generation_quality's results as its margin at each seed (> 0
    where it holds): greedy text has a smaller share of forbidden tokens than sampled text, a higher
    true log p per allowed token, and repeats its sentences more often than both the language's own
    text and sampled text; greedy text still holds forbidden tokens (its share of them, > 0 where
    some window derails); beam search (every width) writes text the model finds likelier per token
    than greedy's; the paper's beam 4 repeats its sentences more often than greedy; nucleus sampling
    (p = 0.9) has a smaller share of forbidden tokens than sampling at T = 1."""

    def forbidden(r):
        return r["forbidden"] / r["scored"]
    return {"seeds": [q["seed"] for q in per_seed], "per_seed": per_seed,
            "claims": {"fewer_forbidden": [forbidden(q["sampled"]) - forbidden(q["greedy"])
                                           for q in per_seed],
                       "likelier": [q["greedy"]["log_p_per_token"] - q["sampled"]["log_p_per_token"]
                                    for q in per_seed],
                       "repeats": [q["greedy"]["repeated"] -
                                   max(q["language"]["repeated"], q["sampled"]["repeated"])
                                   for q in per_seed],
                       "greedy_derails": [forbidden(q["greedy"]) for q in per_seed],
                       "beam_likelier": [min(q[beam]["model_log_p_per_token"]
                                             for beam in BEAMS)
                                         - q["greedy"]["model_log_p_per_token"]
                                         for q in per_seed],
                       "beam_repeats": [q["beam 4, α = 0.6"]["repeated"] - q["greedy"]["repeated"]
                                        for q in per_seed],
                       "nucleus_derails_less": [forbidden(q["sampled"]) - forbidden(q["top-p 0.9"])
                                                for q in per_seed]}}


def _first_forbidden(window: np.ndarray, prompt_len: int) -> int | None:
    """The position of the first token after the prompt that the language forbids (None: there is
    none)."""
    story = city_lab.stories()
    distribution = next(story)
    for t, i in enumerate(window[1:], start=1):
        word = city_lab.VOCAB[i]
        if t >= prompt_len and distribution.get(word, 0.0) == 0.0:
            return t
        distribution = story.send(word)
    return None


def _marked(window: np.ndarray, prompt_len: int) -> str:
    """The continuation as text; the first token the language forbids shown as [word ✗], the rest
    cut."""
    stop = _first_forbidden(window, prompt_len)
    text = city_lab.decode(window[prompt_len:stop])
    return text if stop is None else f"{text} [{city_lab.VOCAB[window[stop]]} ✗] …".lstrip()


# Part 6's claims are settled (over seeds 0-9 each held at 10 of 10, or at 1 of 10: beam 4 repeating
# more): it counts them over the first GENERATION_SEEDS of part 5's models.
GENERATION_SEEDS = 3


def show_generation(args):
    (quality_of, quality_runs), (serial_of, serial_runs) = part6_runs(args)
    over_seeds = generation_claims(runner.map(quality_of, quality_runs))
    # the model of --seed, quick or not: part 5's 400-step constant-lr run
    [s] = runner.map(serial_of, serial_runs)
    common.header(6, "§7.1, exercise 11", "Training is parallel, generation is serial")
    print_forward_passes(s, steps=over_seeds["per_seed"][0]["steps"])
    print()
    print_kv_cache_savings(s)
    print()
    print_generated_text(over_seeds["per_seed"][0])
    print_generation_claims(over_seeds)


def print_forward_passes(s: dict, steps: int):
    """serial_generation's longest row: passes and positions of teacher forcing and of generation,
    with and without the cache."""
    B, longest = s["batch"], s["rows"][-1]
    common.note(f"Part 5's constant-lr model ({steps} steps, float32 torch_ref) copied into "
                f"transformer.DecoderLM (float64, tensor.py); {B} windows, each from "
                f"<bos>,\nsampled at T = 1. Forward passes to score, or to write, {longest['n']} "
                "tokens per window:")
    common.table([["training (teacher forcing): all inputs known", longest["calls_teacher"],
                   longest["n"], "yes" if longest["teacher_logits_diff"] <= 1e-12 else "NO"],
                  ["generation with the KV cache", longest["calls_cached"],
                   longest["positions_cached"], ""],
                  ["generation without (the whole prefix each pass)", longest["calls_full"],
                   longest["positions_full"],
                   "yes" if longest["cache_logits_diff"] <= 1e-12 else "NO"]],
                 headers=["", "forward passes", "positions computed per window",
                          "logits = the cached run's (≤ 1e-12)"], disable_numparse=True)
    common.note(f"Training scores all {longest['n']} positions in one pass: every input is known, "
                "and the causal mask keeps each position blind to the later ones.\nGeneration "
                "needs one pass per token, one after the other: the input of pass t + 1 is the "
                "token pass t chose (exercise 11).")


def print_kv_cache_savings(s: dict):
    """Every length of serial_generation: passes and positions with and without the cache, then
    the time each took (⏱)."""
    B, longest = s["batch"], s["rows"][-1]
    common.table([[r["n"], r["forwards_cached"], r["positions_cached"], r["forwards_full"],
                   r["positions_full"], r["n"] * (r["n"] + 1) // 2,
                   f"{r['positions_full'] / r['positions_cached']:.1f}",
                   "yes" if r["same_tokens"] else "NO"] for r in s["rows"]],
                 headers=["new tokens n", "passes, cache", "positions, cache", "passes, no cache",
                          "positions, no cache", "n(n+1)/2", "ratio", "same tokens"],
                 disable_numparse=True)
    common.note("With the cache each pass computes one new position and keeps its keys and values "
                "for the later ones; without it, pass t recomputes all t positions.")
    for r in s["rows"]:
        common.timing(f"n = {r['n']:>2}, {B} windows: with the cache {1000 * r['wall_cached']:.0f} "
                      f"ms, without {1000 * r['wall_full']:.0f} ms: "
                      f"{r['wall_full'] / r['wall_cached']:.1f}× (CPU time "
                      f"{r['cpu_full'] / r['cpu_cached']:.1f}×; one run each)")
    time_ratio = longest["wall_full"] / longest["wall_cached"]
    positions_ratio = longest["positions_full"] / longest["positions_cached"]
    why = ("a pass costs mostly tensor.py's fixed cost per\noperation, which the cache does not "
           "remove; the wider the model and the longer the prefix, the closer the time follows the "
           "positions" if time_ratio < positions_ratio
           else "the time follows the positions")
    common.timing(f"At n = {longest['n']} the cache saves {time_ratio:.1f}× the time and "
                  f"{positions_ratio:.1f}× the positions: at this size (d = "
                  f"{CITY_MODEL['n_embd']}, {B} windows) {why}.")


def print_generated_text(q: dict):
    """One seed's generation_quality: the language's text and every rule of DECODINGS scored, and
    one window's continuations."""
    common.note("What the model writes, scored against the city language's exact distribution: the "
                f"first sentence of {q['n_windows']} test stories\n(<bos> NAME lives in CITY .) "
                f"continued by {q['n_new']} tokens. A token is allowed if p_true > 0; a window is "
                "scored up to its first forbidden token\n(after it the story's state is "
                f"undefined). Decoded rows: the model of seed {q['seed']}; sampling at T = 1 "
                "unless the row says otherwise.")
    rows = []
    for key in ("language", *DECODINGS):
        r = q[key]
        label = "the language (test windows)" if key == "language" else f"{common.KERNELS} {key}"
        # the model's log p of the language's text: trained weights, so printed in a ⚙ line below
        model_log_p = "below" if key == "language" else f"{r['model_log_p_per_token']:.3f}"
        rows.append([label, f"{r['scored']:,}", r["forbidden"], f"{r['allowed']:.4f}",
                     f"{r['clean']} / {r['windows']}", f"{r['log_p_per_token']:.3f}",
                     f"{r['repeated']:.0%}", model_log_p, f"{r['distinct']} / {r['windows']}"])
    common.table(rows, headers=["text", "tokens scored", "forbidden", "fraction allowed",
                                "windows with none forbidden", "true log p per allowed token",
                                "sentences repeated", "model's log p per token",
                                "distinct continuations"], disable_numparse=True)
    common.note("Beam search's α = 0.6 ranks these texts as α = 0 would: with no end token every "
                f"hypothesis has {q['n_new']} tokens, and lp divides them all alike.")
    common.kernel_note(f"the model: test excess {q['excess']:.0f} mnat/token; float64 copy vs "
                       "float32 original: log-probabilities differ by at most "
                       f"{q['float32_vs_float64']:.0e}; {q['prompts_distinct']} distinct prompts; "
                       "the model's log p per token of the language's text "
                       f"{q['language']['model_log_p_per_token']:.3f}")
    # a derailment with some text before it
    example = next((b for b, text in enumerate(q["texts"]["sampled"])
                    if (_first_forbidden(text, q["prompt_len"]) or 0) >= q["prompt_len"] + 8), 0)
    common.kernel_note(f"window {example}, prompt:  "
                       f"{city_lab.decode(q['texts']['greedy'][example, 1:q['prompt_len']])}")
    for key in ("greedy", "beam 4, α = 0.6", "sampled", "top-p 0.9"):
        common.kernel_note(f"{key + ':':<16} {_marked(q['texts'][key][example], q['prompt_len'])}")


def _worded(margins, holds: str, fails: str) -> str:
    """A claim's conclusion as its count over the seeds words it: `holds` where common.verdict
    says "holds", "mostly " + holds where it says "mostly", `fails` otherwise."""
    verdict = common.verdict(common.holds(margins), len(margins))
    return {"holds": holds, "mostly": f"mostly {holds}"}.get(verdict, fails)


def print_generation_claims(over_seeds: dict):
    """generation_over_seeds' claims, each counted over the seeds, and a conclusion worded by the
    counts."""
    claims, seeds = over_seeds["claims"], over_seeds["seeds"]
    common.note(f"Over seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))} (each its own "
                "model, its own sampling):")
    common.count_line("greedy text has a smaller share of forbidden tokens than sampled text",
                      claims["fewer_forbidden"], GENERATION_TIPPING)
    common.count_line("greedy text has a higher true log-probability per allowed token than "
                      "sampled text",
                      claims["likelier"], GENERATION_TIPPING)
    common.count_line("greedy text repeats its sentences more often than the language's text and "
                      "sampled text",
                      claims["repeats"], GENERATION_TIPPING)
    common.count_line("greedy text still holds forbidden tokens (some of its windows derail)",
                      claims["greedy_derails"], GENERATION_TIPPING)
    common.count_line(f"beam search ({', '.join(BEAMS)}) writes text the model finds likelier "
                      "per token than greedy text",
                      claims["beam_likelier"], GENERATION_TIPPING)
    common.count_line("beam 4 (the paper's) repeats its sentences more often than greedy text",
                      claims["beam_repeats"], GENERATION_TIPPING)
    common.count_line("top-p 0.9 text has a smaller share of forbidden tokens than sampled text "
                      "(T = 1)",
                      claims["nucleus_derails_less"], GENERATION_TIPPING)
    greedy = _worded(claims["fewer_forbidden"],
                     "greedy decoding draws fewer of the impossible tokens than sampling at T = 1",
                     "greedy decoding does not draw fewer impossible tokens than sampling here")
    derailed, n = common.holds(claims["greedy_derails"]), len(seeds)
    derails = (f"its text still derails at {derailed} of {n} seed{'s' * (n > 1)}" if derailed
               else "its text never derails here")
    repeats = _worded(claims["repeats"], "pays in repetition",
                      "does not pay in more repetition here")
    beam = _worded(claims["beam_likelier"],
                   "beam search finds text the model finds likelier than greedy's",
                   "beam search does not find text the model finds likelier than greedy's here")
    beam_repeats = _worded(claims["beam_repeats"],
                           "and repeats itself more (the degeneration Holtzman et al. describe)",
                           "yet does not repeat itself more than greedy here")
    nucleus = _worded(claims["nucleus_derails_less"],
                      "nucleus sampling derails less than sampling at T = 1, cutting the tail of "
                      "small probabilities",
                      "nucleus sampling does not derail less than sampling at T = 1 here")
    conclusion = f"So: {greedy} ({derails}) and {repeats};\n{beam}, {beam_repeats};\n{nucleus}."
    # its wording reads the counts: as sure as the least sure of them
    if all(min(abs(x) for x in margins) > GENERATION_TIPPING for margins in claims.values()):
        common.note(conclusion)
    else:
        common.kernel_note(conclusion)



SEEDS = 5   # the default of --seeds: how many seeds a training claim is counted over
PARTS = {1: show_teacher_forcing, 2: show_label_smoothing, 3: show_lr_schedule,
         4: show_adam_first_step, 5: show_checkpoint_averaging, 6: show_generation}

if __name__ == "__main__":
    # part 5's runs may train while parts 1-4 compute
    common.main(__doc__, PARTS, seeds=SEEDS, train_ahead={5: part5_runs})
