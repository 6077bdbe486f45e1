"""Script 05 · The training recipe: teacher forcing, label smoothing, warmup, Adam, averaging.

Part 1 · §7.1 Teacher forcing: every position's loss from one forward pass
Part 2 · §7.3 Label smoothing: a finite optimum, two conventions, an exact price
Part 3 · §7.5 The paper's learning rate: d^−0.5 · min(step^−0.5, step · warmup^−1.5), d = 512,
    warmup = 4000
Part 4 · §7.5 Adam's first step: update ≈ lr · sign(g), lr = 1e-3, β = (0.9, 0.98)
Part 5 · §7.6 Checkpoint averaging at a constant lr of 0.003
Part 6 · §7.1, exercise 11 Training is parallel, generation is serial

Also exercises 7-9 and 11. Part 1 runs transformer.py (lecture 5's tensor.py); parts 2 and 4 check
PyTorch's conventions; part 5 trains PyTorch twins with city_train.py's harness: --seeds seeds
(default 5) × a constant and a decaying lr, 400 steps each, each run scoring its checkpoints and
their averages as it trains. Part 6 counts the forward passes of training (one) and of generation
(one per token), the positions computed with and without the KV cache (n against n(n+1)/2), and
scores what a city-language model writes, greedy, by beam search and sampled, against the language's
exact distribution, over part 5's seeds, with part 5's constant-lr runs (constant_lr_models).

    python code/lecture06/05_training_recipe.py [--part N] [--seed S] [--seeds N] [--quick]
"""
from __future__ import annotations

import sys

try:   # first: one BLAS thread before numpy loads
    from lecture06 import common
except ModuleNotFoundError as missing:   # the course's package is not installed in this Python
    sys.exit(f"{missing} in {sys.executable}: run `make venv`, then .venv/bin/python {sys.argv[0]}")

import math

import numpy as np
import torch
import torch.nn.functional as F

from lecture06 import city_generation, city_lab, city_train, optim, recipe_figures, torch_ref
from lecture06 import transformer
from lecture06.common import sci
from lecture05.tensor import Tensor, count_ops, no_grad


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
            with count_ops() as ops_one:
                one_pass = log_probs(inputs)                        # every position at once: (7, V)
            teacher_forcing_calls = list(forwards)
            forwards.clear()
            with count_ops() as ops_each:
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
    common.header(1, __doc__)
    r = teacher_forcing(seed=args.seed)
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
    """Exercise 8: both targets at V = 10, and both gradients: PyTorch's target read back from its
    gradient (p = softmax(z) − ∂loss/∂z); the slides' loss −Σ p log softmax(z) = logsumexp(z) − p·z
    from transformer.py's primitives, differentiated by tensor.py's autodiff."""
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
    common.header(2, __doc__)
    g = optimal_gap()
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
    recipe_figures.draw_smoothing_cost(r, args.figures)


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


# ---- Part 3 · §7.5 the learning-rate formula -----------------------------------------------------
# the paper's base model and its warmup
D_MODEL, WARMUP = 512, 4000


def lr_schedule(d_model: int = D_MODEL, warmup: int = WARMUP, last: int = 200_000) -> dict:
    """optim.noam_lr: peak, value at 100k, the d = 1024 ratio, the argmax over steps, exercise
    7, step 0."""
    steps = np.arange(1, last + 1)
    lr = optim.noam_lr(steps, d_model, warmup)
    peak = optim.noam_lr(warmup, d_model, warmup)
    step_zero = {}
    try:
        d_model ** -0.5 * min(0 ** -0.5, 0 * warmup ** -1.5)    # the formula typed as Python floats
    except ZeroDivisionError as error:
        step_zero["python"] = f"ZeroDivisionError: {error}"
    with np.errstate(divide="ignore"):
        step_zero["numpy"] = float(d_model ** -0.5 * np.minimum(np.float64(0) ** -0.5,
                                                                0 * warmup ** -1.5))
    try:
        optim.noam_lr(0, d_model, warmup)
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
        opt, lambda s: optim.noam_lr(s + 1, d_model, warmup))
    first_lrs = []
    for _ in range(3):
        first_lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        schedule.step()
    return dict(d_model=d_model, warmup=warmup, steps=steps, lr=lr, peak=peak,
                argmax=int(steps[np.argmax(lr)]),
                at_100k=optim.noam_lr(100_000, d_model, warmup),
                peak_1024=optim.noam_lr(warmup, 1024, warmup),
                ratio_1024=peak / optim.noam_lr(warmup, 1024, warmup),
                lr_1024=optim.noam_lr(steps, 1024, warmup),
                ex7={s: optim.noam_lr(s, d_model, warmup) for s in (2000, 16000)},
                ex7_parts=dict(d_factor=d_model ** -0.5, warmup_factor=warmup ** 1.5,
                               rsqrt_16000=16000 ** -0.5),
                step_one=optim.noam_lr(1, d_model, warmup), step_zero=step_zero,
                first_lrs=first_lrs)


def show_lr_schedule(args):
    d, w = D_MODEL, WARMUP
    common.header(3, __doc__, f"d = {d}, warmup = {w}")
    r = lr_schedule(d, w)
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
                f"  optim.noam_lr(0)  {z['noam_lr']}\n"
                f"Counting updates from 1, the first lr is peak/{w} = {sci(r['step_one'], 3)}, "
                f"not 0; LambdaLR(lambda s: noam_lr(s + 1)) gives "
                f"{', '.join(sci(x, 3) for x in r['first_lrs'])} for the first three updates.")
    recipe_figures.draw_lr_schedule(r, args.figures)


# ---- Part 4 · §7.5 Adam's first step -------------------------------------------------------------
ADAM_LR, ADAM_BETAS = 1e-3, (0.9, 0.98)   # the paper's betas


def adam_first_step(gradients=tuple((-1) ** i * 10.0 ** e for i, e in enumerate(range(-6, 4))),
                    lr: float = ADAM_LR, betas=ADAM_BETAS, epsilons=(1e-9, 1e-8)) -> dict:
    """One Adam step from θ = 0 on one parameter per gradient value, with torch.optim.Adam and with
    optim.Adam: update/lr against |g|/(|g| + ε), and SGD's update/lr = g for contrast."""
    g = np.array(gradients, dtype=np.float64)
    rows = {"gradient": g, "sgd": g.copy()}
    for eps in epsilons:
        theta = torch.zeros(len(g), dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.Adam([theta], lr=lr, betas=betas, eps=eps)
        theta.grad = torch.from_numpy(g.copy())
        optimizer.step()
        ours = transformer.Parameter(np.zeros(len(g)))
        ours.grad = g.copy()
        optim.Adam([ours], lr=lr, betas=betas, eps=eps).step()
        rows[eps] = dict(torch=-theta.detach().numpy() / lr, ours=-ours.data / lr,
                         formula=g / (np.abs(g) + eps))
    return dict(lr=lr, betas=betas, epsilons=epsilons, rows=rows)


def show_adam_first_step(args):
    common.header(4, __doc__, f"lr = {sci(ADAM_LR, 0)}, β = {ADAM_BETAS}")
    r = adam_first_step(lr=ADAM_LR, betas=ADAM_BETAS)
    rows, (e1, e2) = r["rows"], r["epsilons"]
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
# the model of parts 5 and 6 (city_train.build_model's sizes): 1 layer, so its runs fit the budget
CITY_MODEL = dict(n_layers=1, n_embd=64, n_head=4)
LR, STEPS, CHECKPOINT_EVERY = 3e-3, 400, 50   # the constant lr, and the decaying lr's peak
KS = (2, 3, 4, 5, None)   # averages of the last k checkpoints (None: all of them)
# the jitter of a constant-lr run: its last JITTER_LAST checkpoints, JITTER_EVERY steps apart
JITTER_EVERY, JITTER_LAST = 10, 10


def checkpoint_steps(steps: int, every: int) -> list[int]:
    return list(range(every, steps + 1, every))


def jitter_steps(steps: int, jitter_every: int) -> list[int]:
    return checkpoint_steps(steps, jitter_every)[-JITTER_LAST:]   # fewer in a short run


def last_k(checkpoints: list, k: int | None) -> list:
    return checkpoints[-(k or len(checkpoints)):]


def averaging_run(seed: int, schedule: str = "constant", model_size: dict = CITY_MODEL,
                  steps: int = STEPS, lr: float = LR, checkpoint_every: int = CHECKPOINT_EVERY,
                  ks=KS, jitter_every: int = JITTER_EVERY, every_checkpoint: bool = True) -> dict:
    """A city_train.run (the seed draws weights and batches), its lr constant or decaying linearly
    to 0, that scores as it trains each checkpoint (every_checkpoint: also the jitter's); at a
    constant lr also the averages of the last k, and it keeps its final weights for part 6."""
    checkpoints = checkpoint_steps(steps, checkpoint_every)
    alone, averaged, final_weights = checkpoints[:-1] if every_checkpoint else [], [], {}
    if schedule == "constant":
        if every_checkpoint:
            alone = sorted(set(alone + jitter_steps(steps, jitter_every)) - {steps})
        # one checkpoint, after the last step
        averaged, final_weights = [last_k(checkpoints, k) for k in ks], dict(checkpoint_every=steps)
    return dict(model=dict(model_size, seed=seed),
                training=dict(steps=steps, lr=lr, seed=seed, eval_every=None, schedule=schedule,
                              averages=[[step] for step in alone] + averaged, **final_weights))


def averaging_runs(seeds, model_size: dict = CITY_MODEL, steps: int = STEPS, lr: float = LR,
                   checkpoint_every: int = CHECKPOINT_EVERY, ks=KS, decayed: bool = True,
                   jitter_every: int = JITTER_EVERY, every_checkpoint_seeds: int = 1) -> list[dict]:
    """averaging_run at every seed, constant and (decayed) decaying lr. A score costs ~10 training
    steps: only the first every_checkpoint_seeds seeds score every checkpoint (table, jitter,
    figure). Runs scored alike train in one stack; the larger first, so two workers end together."""
    if steps % checkpoint_every or steps % jitter_every:
        raise ValueError(f"averaging_runs: checkpoint_every ({checkpoint_every}) and jitter_every "
                         f"({jitter_every}) must divide steps ({steps}), so that the last "
                         "checkpoint is the trained model")
    return [averaging_run(seed, schedule, model_size, steps, lr, checkpoint_every, ks,
                          jitter_every, every_checkpoint=scored)
            for group, scored in ((seeds[every_checkpoint_seeds:], False),
                                  (seeds[:every_checkpoint_seeds], True))
            for schedule in ("constant", "linear")[:1 + decayed] for seed in group]


def jitter(excess: dict, steps: int, jitter_every: int, averaged: float) -> dict | None:
    """The jitter that averaging cancels, from a constant-lr run's excesses ({(step,): excess}; None
    if it did not score them): its last checkpoints jitter_every steps apart, their mean |change|
    against their mean change (the trend), how often they rise, and the `averaged` model's lead."""
    at = jitter_steps(steps, jitter_every)
    if any((step,) not in excess for step in at):
        return None
    values = [excess[(step,)] for step in at]
    changes = np.diff(values)
    return dict(steps=at, excess=values, mean_change=float(np.abs(changes).mean()),
                trend=float(changes.mean()), rises=int((changes > 0).sum()), averaged=averaged,
                below_lowest=min(values) - averaged)


def seed_result(seed: int, constant: dict, decayed: dict | None, steps: int,
                checkpoint_every: int, ks, jitter_every: int) -> dict:
    """One seed's numbers from its runs' scores ({steps: excess}): the constant-lr run at every
    checkpoint (None: not scored), its averages and jitter; the decaying-lr run's curve and end."""
    checkpoints = checkpoint_steps(steps, checkpoint_every)
    averaged = {len(last_k(checkpoints, k)): constant[tuple(last_k(checkpoints, k))] for k in ks}
    return dict(seed=seed, checkpoints=[(step, constant.get((step,))) for step in checkpoints],
                last=constant[(steps,)], averaged=averaged,
                jitter=jitter(constant, steps, jitter_every, averaged[min(5, len(checkpoints))]),
                decayed=decayed[(steps,)] if decayed else None,
                decayed_curve=([(step, decayed.get((step,))) for step in checkpoints] if decayed
                               else None))


def against_the_last(per_seed: list, decayed: bool) -> list[dict]:
    """A row per model (last checkpoint, each average, the decayed lr): its excess at each seed and
    its difference from the same seed's last checkpoint (seeds differ more than methods do)."""
    rows = [dict(name="last", k=None, excess=[r["last"] for r in per_seed])]
    rows += [dict(name="average", k=k, excess=[r["averaged"][k] for r in per_seed])
             for k in per_seed[0]["averaged"]]
    if decayed:
        rows.append(dict(name="decayed", k=None, excess=[r["decayed"] for r in per_seed]))
    for row in rows:
        row["vs_last"] = [e - r["last"] for e, r in zip(row["excess"], per_seed)]
        row["beats_last"] = sum(d < 0 for d in row["vs_last"])
        row["spread"], row["vs_last_spread"] = spread(row["excess"]), spread(row["vs_last"])
    return rows


def checkpoint_averaging(seeds=(0, 1, 2), model_size: dict = CITY_MODEL, steps: int = STEPS,
                         lr: float = LR, checkpoint_every: int = CHECKPOINT_EVERY, ks=KS,
                         decayed: bool = True, jitter_every: int = JITTER_EVERY,
                         every_checkpoint_seeds: int = 1) -> dict:
    """Train averaging_runs (a Pre-LN DecoderLM on the city language per seed and lr schedule): the
    test excess of the checkpoints, of the average of the last k (None: all) and of the decayed
    run; each one's difference from its own seed's last checkpoint, and their spread over seeds."""
    seeds = list(seeds)
    runs = averaging_runs(seeds, model_size, steps, lr, checkpoint_every, ks, decayed,
                          jitter_every, every_checkpoint_seeds)
    # (schedule, seed) -> {steps averaged (a tuple): test excess}, the last step scored by training
    excess = {(run["training"]["schedule"], run["model"]["seed"]):
              {(steps,): trained.final_excess, **trained.averaged_excess}
              for run, trained in zip(runs, city_train.train_many(runs))}
    per_seed = [seed_result(seed, excess["constant", seed], excess.get(("linear", seed)), steps,
                            checkpoint_every, ks, jitter_every) for seed in seeds]
    first = per_seed[0]
    return dict(seeds=seeds, **model_size, steps=steps, lr=lr,
                checkpoint_every=checkpoint_every, n_checkpoints=len(first["checkpoints"]),
                runs=per_seed, rows=against_the_last(per_seed, decayed),
                # seeds[0]'s run, under the names the table and the figure use
                checkpoints=first["checkpoints"], last=first["last"], averaged=first["averaged"],
                decayed=first["decayed"], decayed_curve=first["decayed_curve"],
                jitter=first["jitter"])


def averaging_and_decay_gains(r: dict, k: int = 5) -> list[tuple[float, float]]:
    """Per seed: what averaging the last k checkpoints and what decaying the lr gain over the last
    checkpoint, in mnat/token (their ratio 1: the same; the notes: "about as much")."""
    rows = {row["k"] or row["name"]: row for row in r["rows"]}
    return [(-a, -d) for a, d in zip(rows[k]["vs_last"], rows["decayed"]["vs_last"])]


def spread(values) -> tuple[float, float, float]:
    """(median, min, max)."""
    return float(np.median(values)), float(min(values)), float(max(values))


def part5_seeds(args) -> list[int]:
    # --quick: one seed. Shorter runs would not do: the last 5 checkpoints of a 200-step run span a
    # part of the curve that still falls steeply, and their average loses to the last checkpoint
    return common.seeds_of(args)[:1] if args.quick else common.seeds_of(args)


def part5_runs(args) -> tuple:
    """The runs show_checkpoint_averaging will ask for: common.main starts them before part 1. Every
    seed scores every checkpoint: the jitter is a claim over the seeds."""
    seeds = part5_seeds(args)
    return city_train.planned(averaging_runs(seeds, every_checkpoint_seeds=len(seeds)))


def show_checkpoint_averaging(args):
    common.header(5, __doc__, f"lr of {LR:g}")
    seeds = part5_seeds(args)
    r = checkpoint_averaging(seeds=seeds, every_checkpoint_seeds=len(seeds))
    print_checkpoints(r)
    print_against_the_last(r)
    print_averaging_counts(r)
    print_jitter(r)
    recipe_figures.draw_checkpoint_averaging(r, args.figures)


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


def averaging_claims(r: dict) -> dict:
    """Part 5's claims as margins at every seed (> 0 where it holds), in mnat/token: a model beats
    the last checkpoint by (last − its excess); averaging the last 5 gains more than decaying the lr
    by (averaging's gain − decaying's) over the last checkpoint."""
    rows = {row["k"] or row["name"]: row for row in r["rows"]}
    claims = {key: [-d for d in rows[key]["vs_last"]] for key in (5, "decayed", r["n_checkpoints"])}
    claims["averaging gains more"] = [a - d for a, d in averaging_and_decay_gains(r)]
    return claims


def print_averaging_counts(r: dict):
    """Each model against the last checkpoint over the seeds, and averaging's gain against
    decaying's: counted, decided and sized by common.count_line."""
    n, claims = r["n_checkpoints"], averaging_claims(r)
    better = "mnat/token below the last checkpoint"
    common.count_line("averaging the last 5 checkpoints beats the last checkpoint", claims[5],
                      better)
    common.count_line("decaying the lr beats the last checkpoint", claims["decayed"], better)
    common.count_line(f"averaging all {n} checkpoints beats the last checkpoint", claims[n], better)
    common.count_line("averaging the last 5 gains more than decaying the lr",
                      claims["averaging gains more"],
                      "mnat/token (averaging's gain − decaying's)", notes="about as much")
    decision = common.decide(claims["averaging gains more"]) if len(r["seeds"]) > 1 else None
    if decision and decision.outcome not in (common.HOLDS, common.OPPOSITE):
        common.kernel_note("So averaging gains about as much as decaying the lr, as the notes say, "
                           f"as far as {decision.n} seeds tell: no difference shows, and the "
                           "bounds say how large one could be.")


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
    # the seeds that scored their checkpoints `apart` steps apart (every seed, in the script). Where
    # the checkpoints never rise, their mean |change| is |trend|: the first term is negative
    scored = [(run["seed"], run["jitter"]) for run in r["runs"] if run["jitter"] is not None]
    margins = [min(j["mean_change"] - 2 * abs(j["trend"]), j["below_lowest"]) for _, j in scored]
    common.count_line(f"the last {len(j['steps'])} checkpoints, {apart} steps apart, move by more "
                      f"than twice their trend, and the average of the last {k} scores\nbelow "
                      "every one of them", margins,
                      "mnat/token (the less of: mean move − 2 × |trend|, lowest − average)")
    if len(margins) > 1:
        cancels = common.decide(margins).outcome == common.HOLDS
    else:
        cancels = margins[0] > 0
    where = f"at seed {scored[0][0]}" if len(scored) == 1 else f"over {len(scored)} seeds"
    common.kernel_note(
        f"At a constant lr ({where}) the weights keep being pulled around by the latest batches "
        "(the excess jumps more than it trends);\naveraging the last few checkpoints cancels that "
        "jitter, at no training cost." if cancels else
        f"The checkpoints do not clearly jump more than they trend, or their average does not "
        f"clearly score below them ({where}): no jitter is shown cancelled.")
    common.note("Averaging from early in training drags in weights that were still poor.")


# ---- Part 6 · §7.1, exercise 11 training is parallel, generation is serial -----------------------
def constant_lr_models(seeds, every_checkpoint_seeds: int = 1) -> dict[int, city_train.TrainResult]:
    """Part 5's constant-lr runs at every seed -> {seed: its TrainResult}, whose one checkpoint
    holds the final weights: part 5's if it ran (city_train keeps them), else trained now."""
    runs = averaging_runs(seeds, decayed=False, every_checkpoint_seeds=every_checkpoint_seeds)
    by_seed = {run["model"]["seed"]: trained for run, trained in zip(runs,
                                                                      city_train.train_many(runs))}
    return {seed: by_seed[seed] for seed in seeds}


def float64_model(trained: city_train.TrainResult) -> transformer.DecoderLM:
    """A constant_lr_models run's final weights in transformer.DecoderLM (float64, tensor.py)."""
    [(_, weights)] = trained.checkpoints
    return torch_ref.float64_copy(weights, n_head=CITY_MODEL["n_head"])


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


# the rules generation_claims compares (the table shows the others at the first seed only)
CLAIMS_RULES = ["greedy", *city_generation.BEAMS, "sampled", "top-p 0.9"]


def generation_quality(trained: city_train.TrainResult, seed: int, n_windows: int = 64,
                       rules: list | None = None) -> dict:
    """city_generation.scored_decodings of the float64 copy of a constant_lr_models run's final
    weights (trained at `seed`), with its texts, the run's steps and test excess, and how far the
    copy's log-probabilities are from the float32 original's."""
    ours = float64_model(trained)
    texts, scores = city_generation.scored_decodings(ours, seed, n_windows, rules=rules)
    [(steps, weights)] = trained.checkpoints
    original = city_train.build_model(**CITY_MODEL, seed=seed)
    original.load_state_dict(weights)
    windows = city_generation.windows_of_the_test_set(n_windows)
    with torch.no_grad():
        theirs = torch.log_softmax(original(torch.from_numpy(windows[:8])).double(), dim=-1).numpy()
    with no_grad():
        logits = ours(windows[:8])
        mine = (logits - transformer.logsumexp(logits)).data
    prompt_len = city_generation.PROMPT_LEN
    return dict(seed=seed, steps=steps, excess=trained.final_excess, n_windows=n_windows,
                prompt_len=prompt_len, n_new=city_lab.SEQ_LEN - prompt_len,
                float32_vs_float64=float(np.abs(theirs - mine).max()), **scores, texts=texts,
                prompts_distinct=len({tuple(row) for row in windows[:, :prompt_len]}))



def generation_over_seeds(models: dict, n_windows: int = 64) -> dict:
    """generation_claims of generation_quality of every model of constant_lr_models ({seed:
    TrainResult}): the first by every rule (its table), the others by CLAIMS_RULES."""
    return generation_claims([generation_quality(trained, seed, n_windows,
                                                 rules=None if i == 0 else CLAIMS_RULES)
                              for i, (seed, trained) in enumerate(models.items())])


def forbidden_share(scores: dict) -> float:
    return scores["forbidden"] / scores["scored"]


# Part 6's claims: {key: (what its line says, its margin at a seed, > 0 where it holds, from that
# seed's generation_quality, in the unit that follows)}
POINTS = "points of"   # percentage points
GENERATION_CLAIMS = {
    "fewer_forbidden": ("greedy text has a smaller share of forbidden tokens than sampled text",
                        lambda q: 100 * (forbidden_share(q["sampled"])
                                         - forbidden_share(q["greedy"])),
                        f"{POINTS} forbidden tokens (sampled's % − greedy's)"),
    "likelier": ("greedy text has a higher true log-probability per allowed token than sampled "
                 "text",
                 lambda q: q["greedy"]["log_p_per_token"] - q["sampled"]["log_p_per_token"],
                 "nats/token (greedy's − sampled's)"),
    "repeats": ("greedy text repeats its sentences more often than the language's text and "
                "sampled text", lambda q: 100 * (q["greedy"]["repeated"] - max(
                    q["language"]["repeated"], q["sampled"]["repeated"])),
                f"{POINTS} sentences repeated (greedy's % − the more of the other two)"),
    "greedy_derails": ("greedy text still holds forbidden tokens (some of its windows derail)",
                       lambda q: 100 * forbidden_share(q["greedy"]),
                       "% of greedy's tokens forbidden"),
    "beam_likelier": (f"beam search ({', '.join(city_generation.BEAMS)}) writes text the model "
                      "finds likelier per token than greedy text",
                      lambda q: min(q[beam]["model_log_p_per_token"]
                                    for beam in city_generation.BEAMS)
                      - q["greedy"]["model_log_p_per_token"],
                      "nats/token of the model's (the least likely beam's − greedy's)"),
    "beam_repeats": ("beam 4 (the paper's) repeats its sentences more often than greedy text",
                     lambda q: 100 * (q["beam 4, α = 0.6"]["repeated"] - q["greedy"]["repeated"]),
                     f"{POINTS} sentences repeated (beam 4's % − greedy's)"),
    "nucleus_derails_less": ("top-p 0.9 text has a smaller share of forbidden tokens than sampled "
                             "text (T = 1)", lambda q: 100 * (forbidden_share(q["sampled"])
                                                              - forbidden_share(q["top-p 0.9"])),
                             f"{POINTS} forbidden tokens (sampled's % − top-p's)")}
# how many digits each claim's margin prints with
GENERATION_DIGITS = {"likelier": 3, "beam_likelier": 3}


def generation_claims(per_seed: list) -> dict:
    """Each of GENERATION_CLAIMS over generation_quality's results as its margin at each seed."""
    return {"seeds": [q["seed"] for q in per_seed], "per_seed": per_seed,
            "claims": {key: [margin(q) for q in per_seed]
                       for key, (_, margin, _) in GENERATION_CLAIMS.items()}}


def show_generation(args):
    common.header(6, __doc__)
    seeds = part5_seeds(args)
    models = constant_lr_models(seeds, every_checkpoint_seeds=len(seeds))
    # the model of --seed, quick or not: part 5's 400-step constant-lr run
    serial = serial_generation(float64_model(models[args.seed]),
                               lengths=(8, 31) if args.quick else (8, 16, 31), batch=16,
                               seed=args.seed)
    over_seeds = generation_over_seeds(models, n_windows=32 if args.quick else 64)
    print_forward_passes(serial, steps=over_seeds["per_seed"][0]["steps"])
    print()
    print_kv_cache_savings(serial)
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
    for key in ("language", *city_generation.DECODINGS):
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
                    if (city_lab.first_forbidden(text, q["prompt_len"]) or 0)
                    >= q["prompt_len"] + 8), 0)
    common.kernel_note(f"window {example}, prompt:  "
                       f"{city_lab.decode(q['texts']['greedy'][example, 1:q['prompt_len']])}")
    for key in ("greedy", "beam 4, α = 0.6", "sampled", "top-p 0.9"):
        continuation = city_lab.marked_continuation(q["texts"][key][example], q["prompt_len"])
        common.kernel_note(f"{key + ':':<16} {continuation}")


# Part 6's conclusion, each piece worded by its claim's outcome: (if it holds, if the opposite
# holds, if neither is clear)
CONCLUSIONS = {
    "fewer_forbidden": (
        "greedy decoding draws fewer of the impossible tokens than sampling at T = 1",
        "greedy decoding draws more impossible tokens than sampling at T = 1",
        "greedy decoding draws no clearly fewer impossible tokens than sampling at T = 1"),
    "repeats": ("pays in repetition", "repeats itself less", "with no clear cost in repetition"),
    "beam_likelier": ("beam search finds text the model finds likelier than greedy's",
                      "beam search finds text the model finds less likely than greedy's",
                      "beam search finds text no clearly likelier than greedy's"),
    "beam_repeats": ("and repeats itself more (the degeneration Holtzman et al. describe)",
                     "yet repeats itself less than greedy here",
                     "and repeats itself no clearly more or less than greedy here"),
    "nucleus_derails_less": (
        "nucleus sampling derails less than sampling at T = 1, cutting the tail of small "
        "probabilities", "nucleus sampling derails more than sampling at T = 1",
        "nucleus sampling derails no clearly less than sampling at T = 1")}


def worded(margins, words: tuple) -> str:
    """One of a conclusion's three phrasings (CONCLUSIONS), by common.decide's outcome; at one seed,
    what that seed shows (the holding phrase, or the unclear one)."""
    if len(margins) == 1:
        return words[0] if margins[0] > 0 else words[2]
    outcome = common.decide(margins).outcome
    return {common.HOLDS: words[0], common.OPPOSITE: words[1]}.get(outcome, words[2])


def print_generation_claims(over_seeds: dict):
    """generation_over_seeds' claims, each decided over the seeds, and the conclusion they word."""
    claims, seeds = over_seeds["claims"], over_seeds["seeds"]
    common.note(f"Over seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))} (each its own "
                "model, its own sampling):")
    for key, (text, _, unit) in GENERATION_CLAIMS.items():
        common.count_line(text, claims[key], unit, GENERATION_DIGITS.get(key, 1))
    said = {key: worded(claims[key], words) for key, words in CONCLUSIONS.items()}
    derails = worded(claims["greedy_derails"], ("its text still derails", "",
                                                "its text need not derail"))
    conclusion = (f"So: {said['fewer_forbidden']} ({derails}) and {said['repeats']};\n"
                  f"{said['beam_likelier']}, {said['beam_repeats']};\n"
                  f"{said['nucleus_derails_less']}.")
    common.kernel_note(conclusion)   # worded by outcomes, which other float kernels can tip


SEEDS = 5   # the default of --seeds: how many seeds a training claim is counted over
PARTS = {1: show_teacher_forcing, 2: show_label_smoothing, 3: show_lr_schedule,
         4: show_adam_first_step, 5: show_checkpoint_averaging, 6: show_generation}

if __name__ == "__main__":
    # part 5's runs may train while parts 1-4 compute
    common.main(__doc__, PARTS, seeds=SEEDS, train_ahead={5: part5_runs})
