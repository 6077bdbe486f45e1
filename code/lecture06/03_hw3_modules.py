"""Script 03 · HW3's modules: stable loss, dropout, head shapes, parity, op counts, encoder-decoder.

Part 1 · §9.1 softmax_loss = logsumexp(z) − z_y, stable at any scale
Part 2 · §7.2 Dropout p = 0.1 on a vector of ones
Part 3 · §3.2 Shapes in multi-head attention, B = 2, S = 5, D = 12, h = 3 (Dh = 4)
Part 4 · §9.2 Parity with torch_ref.py (float64, train mode, dropout p = 0.1, same masks)
Part 5 · §8.4 Primitive operations per forward (tensor.py's counter; eval mode, so dropout adds
    none)
Part 6 · §3.3, §6.1-§6.2 The paper's encoder-decoder: parameters, shapes, parity with
    torch.nn.Transformer
Part 7 · §8.4 continued, beyond the notes: what fusion buys, in launches, bytes and memory (one
    Pre-LN layer, B = 1, forward + backward)

Serves the lecture-6 notes §9.1 (softmax_loss through logsumexp, part 1), §7.2 (dropout, part 2),
§3.2 (shapes and strides inside multi-head attention, part 3), §9.2 (parity with the PyTorch twin,
part 4), §8.4 (how many primitive operations each module's forward makes, part 5) and §3.3,
§6.1-§6.2 (the paper's encoder-decoder: parameters at the base size, shapes through its layers with
cross-attention, parity with torch.nn.Transformer, part 6). Beyond the notes, part 7 continues §8.4:
what fused primitives and a flash-attention core buy a Pre-LN layer in launches, bytes moved and
memory kept for backward (kernels.fused(), tensor.py's counters). Everything runs on
transformer.py, i.e. on lecture 5's tensor.py primitives only; torch appears as the reference in
parts 4 and 6.

    python code/lecture06/03_hw3_modules.py [--part N] [--seed S] [--quick] [--no-figures]
"""
from __future__ import annotations

import sys

try:   # first: one BLAS thread before numpy loads
    from lecture06 import common
except ModuleNotFoundError as missing:   # the course's package is not installed in this Python
    sys.exit(f"{missing} in {sys.executable}: run `make venv`, then .venv/bin/python {sys.argv[0]}")

import math
from collections import Counter


import numpy as np
import torch

from lecture06 import costs, encoder_decoder
from lecture05 import tensor
from lecture06 import torch_ref, transformer
from lecture05.tensor import Tensor

ROUNDING = 1e-15   # float64 rounding at the scale of these values (≈ 1): what "equal" means below
PARITY_BOUND = 1e-13   # rounding accumulated through a few layers' forward and backward


# ---- Part 1 · §9.1 softmax_loss = logsumexp(z) − z_y ---------------------------------------------
def stable_loss(logits=(1000.0, 999.0, 998.0), target: int = 0) -> dict:
    """Naive log Σ exp against transformer.logsumexp, and the autodiff gradient of softmax_loss."""
    z = np.asarray(logits, dtype=np.float64)
    with np.errstate(over="ignore"):  # exp(1000) overflows: that is the point
        naive = float(np.log(np.exp(z).sum()))
    x = Tensor(z[None, :], requires_grad=True)            # (1, C): one example
    lse = transformer.logsumexp(x).item()
    loss = transformer.softmax_loss(x, [target])
    loss.sum().backward()
    # the textbook gradient, from numpy alone: shifting by the max changes nothing and overflows
    # nothing
    softmax = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    onehot = np.eye(len(z))[target]
    return dict(logits=z, target=target, naive=naive, logsumexp=lse, loss=loss.item(),
                grad=x.grad[0], softmax=softmax, onehot=onehot,
                max_grad_diff=float(np.abs(x.grad[0] - (softmax - onehot)).max()))


def show_stable_loss(args):
    common.header(1, __doc__)
    r = stable_loss()
    common.table([["naive log Σ exp(z)  (numpy)", f"{r['naive']}"],
                  ["transformer.logsumexp(z)", f"{r['logsumexp']:.6f}"],
                  [f"softmax_loss(z, y={r['target']})", f"{r['loss']:.6f}"]],
                 headers=[f"z = {r['logits'].tolist()}", "value"], disable_numparse=True)
    print()
    common.table([[i, z, p, o, g] for i, (z, p, o, g) in
                  enumerate(zip(r["logits"], r["softmax"], r["onehot"], r["grad"]))],
                 headers=["class", "z", "softmax(z)", "onehot(y)", "∂loss/∂z (autodiff)"],
                 floatfmt=".6f")
    common.note("max |autodiff gradient − (softmax − onehot)| "
                f"{common.at_most(r['max_grad_diff'], ROUNDING)}")


# ---- Part 2 · §7.2 inverted dropout --------------------------------------------------------------
def dropout_demo(n: int = 100_000, p: float = 0.1) -> dict:
    """transformer.Dropout on a tensor of ones: kept fraction, mean, and eval mode."""
    layer = transformer.Dropout(p)
    x = Tensor(np.ones(n))
    y = layer(x).data
    kept = np.count_nonzero(y) / n
    layer.eval()
    y_eval = layer(x)
    return dict(n=n, p=p, kept=kept, mean=float(y.mean()), kept_over_keep_prob=kept / (1 - p),
                sigma=math.sqrt(p * (1 - p) / n), kept_values=np.unique(y[y != 0]),
                eval_is_identity=y_eval is x,
                eval_max_change=float(np.abs(y_eval.data - x.data).max()))


def show_dropout(args):
    n, p = (10_000 if args.quick else 100_000), 0.1   # the paper's rate (§7.2)
    common.header(2, __doc__, f"p = {p}")
    r = dropout_demo(n, p)
    common.table([["kept fraction", f"{r['kept']:.4f}",
                   f"1 − p = {1 - r['p']:.1f} ± {r['sigma']:.4f} (1σ)"],
                  ["value of a kept entry", f"{r['kept_values'][0]:.6f}",
                   "1/(1 − p), inverted dropout"],
                  ["mean of the output", f"{r['mean']:.4f}",
                   f"kept/(1 − p) = {r['kept_over_keep_prob']:.4f}"],
                  ["eval mode: max |output − input|", f"{r['eval_max_change']:.1f}",
                   "identity" + (" (returns its input)" if r["eval_is_identity"] else "")]],
                 headers=[f"train mode, {n:,} ones", "ours", "expected"],
                 disable_numparse=True)
    common.note("|mean − kept/(1 − p)| "
                f"{common.at_most(abs(r['mean'] - r['kept_over_keep_prob']), ROUNDING)}: "
                "the mean is the "
                "kept fraction rescaled, so E[output] = input")


# ---- Part 3 · §3.2 shapes and strides in multi-head attention ------------------------------------
def _input_of(t: Tensor) -> Tensor:
    """tensor.py records each op's inputs, so a module's intermediate tensors can be read back from
    the graph instead of re-implementing the module here."""
    return t._parents[0]


def head_shapes(B: int = 2, S: int = 5, D: int = 12, h: int = 3, seed: int = 0) -> dict:
    """Every step of transformer.MultiHeadAttention's forward, with shapes and strides (in
    elements)."""
    transformer.set_seed(seed)  # the weights too, not only the inputs
    mha = transformer.MultiHeadAttention(D, h, causal=True, p_dropout=0.0)
    x = Tensor(np.random.default_rng(seed).standard_normal((B, S, D)))
    q, kT, v = mha.project_to_query_key_value(x)
    q_view = _input_of(q)                                # (B, S, h, Dh), before the permute
    merged = mha.self_attention(q, kT, v, mha.create_causal_mask(S))
    merged_copy = _input_of(merged)                      # contiguous() output, (B, S, h, Dh)
    merged_permuted = _input_of(merged_copy)             # (B, h, S, Dh) -> (B, S, h, Dh), no copy
    heads_out = _input_of(merged_permuted)               # softmax weights @ v, (B, h, S, Dh)
    y = mha.out_projection(merged)
    steps = [("x", "input", x, False),
             ("q_projection(x)", "Linear D → D", _input_of(q_view), False),
             (".view(B, S, h, Dh)", "split D into h heads", q_view, True),
             (".permute(0, 2, 1, 3) = q", "heads next to batch", q, True),
             ("kT", "k permuted (0, 1, 3, 2)", kT, True),
             ("q @ kT (scores)", "B·h matmuls at once", q @ kT, False),
             ("softmax(scores/√Dh + mask)", "attention weights", mha.last_attention, False),
             ("weights @ v", "each head's output", heads_out, False),
             (".permute(0, 2, 1, 3)", "heads back next to Dh", merged_permuted, True),
             (".contiguous()", "one real copy", merged_copy, True),
             (".view(B, S, D)", "concatenate the heads", merged, True),
             ("out_projection", "Linear D → D", y, False)]
    rows = []
    for code, what, t, layout in steps:
        storage = "new"
        if layout:  # view, permute, contiguous: does the result share memory with its input?
            shared = np.shares_memory(t.data, _input_of(t).data)
            storage = "shared (no copy)" if shared else "copied"
        rows.append(dict(code=code, what=what, shape=t.shape, strides=t.stride(),
                         contiguous=t.is_contiguous(), storage=storage))
    try:
        merged_permuted.view(B, S, D)
        view_error = None
    except RuntimeError as error:
        view_error = str(error)
    with tensor.count_ops() as counts:
        mha(x)
    layout_ops = {k: counts[k] for k in ("view", "permute", "contiguous")}
    return dict(rows=rows, view_error=view_error, layout_ops=layout_ops, B=B, S=S, D=D, h=h)


def matmul_flops(out: Tensor) -> int:
    """2·M·N·K (one multiply-add = 2 FLOPs) summed over every matmul in out's autodiff graph."""
    # output (..., M, N), left input (..., M, K)
    return sum(2 * t.data.size * t._parents[0].shape[-1] for t in tensor.graph(out)
               if t._op == "matmul")


def heads_cost(B: int = 2, S: int = 5, D: int = 12, heads=(1, 3, 4, 12),
               seed: int = 0) -> list[dict]:
    """Parameters and matmul FLOPs of one attention forward for several head counts."""
    transformer.set_seed(seed)  # the weights too, not only the inputs
    rows = []
    x = Tensor(np.random.default_rng(seed).standard_normal((B, S, D)))
    for h in heads:
        mha = transformer.MultiHeadAttention(D, h, p_dropout=0.0)
        with tensor.count_ops() as counts:
            out = mha(x)
        rows.append(dict(h=h, Dh=D // h, params=mha.num_parameters(),
                         params_formula=4 * D * D + 4 * D,
                         matmuls=counts["matmul"], flops=matmul_flops(out),
                         flops_formula=2 * B * S * (4 * D * D + 2 * S * D)))
    return rows


def show_head_shapes(args):
    B, S, D, h = 2, 5, 12, 3   # the notes' example (§3.2)
    common.header(3, __doc__, f"B = {B}, S = {S}, D = {D}, h = {h} (Dh = {D // h})")
    r = head_shapes(B, S, D, h, seed=args.seed)
    common.table([[s["code"], s["what"], s["shape"], s["strides"],
                   "yes" if s["contiguous"] else "NO", s["storage"]]
                  for s in r["rows"]],
                 headers=["step", "what", "shape", "strides (elements)", "contiguous", "storage"],
                 disable_numparse=True)
    common.note("\n(B, S, h, Dh).view(B, S, D) straight after the permute, as HW3 students first "
                f"write it:\n  RuntimeError: {r['view_error']}")
    ops = r["layout_ops"]
    common.note(f"one forward makes {ops['view']} views and {ops['permute']} permutes (no copies) "
                f"and {ops['contiguous']} contiguous() (the one copy)")
    ex = head_shapes(B=4, S=10, D=64, h=8, seed=args.seed)  # exercise 3 of the notes
    shapes = {s["code"]: s["shape"] for s in ex["rows"]}
    common.note("exercise 3 (B = 4, S = 10, D = 64, h = 8): q "
                f"{shapes['.permute(0, 2, 1, 3) = q']}, kT {shapes['kT']}, scores "
                f"{shapes['q @ kT (scores)']}, output {shapes['weights @ v']} → "
                f"{shapes['.view(B, S, D)']}")
    print()
    rows = heads_cost(B, S, D, seed=args.seed)
    common.table([[c["h"], c["Dh"], f"{c['params']:,}", f"{c['params_formula']:,}", c["matmuls"],
                   f"{c['flops']:,}", f"{c['flops_formula']:,}"] for c in rows],
                 headers=["h", "Dh", "parameters", "4D² + 4D", "matmul calls",
                          "matmul FLOPs (from the graph)", "2BS(4D² + 2SD)"], disable_numparse=True)
    same = {key: len({c[key] for c in rows}) == 1 for key in ("params", "flops", "matmuls")}
    counted = ", ".join(f"{'the same' if same[key] else 'NOT the same'} {what}"
                        for key, what in (("params", "parameters"), ("flops", "matmul FLOPs"),
                                          ("matmuls", "number of matmul calls")))
    common.note(f"h = {', '.join(str(c['h']) for c in rows)}: {counted}; more heads only cut each "
                "of the two attention matmuls\n(q @ kT, weights @ v) into B·h smaller ones of "
                "size S × Dh, batched in one call")


# ---- Part 4 · §9.2 parity with the PyTorch twin --------------------------------------------------
def parity(B: int = 2, S: int = 6, D: int = 16, h: int = 4, n_vocab: int = 23, n_layers: int = 2,
           p_dropout: float = 0.1, seed: int = 0) -> list[dict]:
    """Ours and torch_ref's twin, same parameters and dropout masks, train mode: max |difference| of
    the output, of the input's gradient and of every parameter's gradient."""
    transformer.set_seed(seed)  # the weights too, not only the inputs
    rng = np.random.default_rng(seed)
    modules = [("attention", "MultiHeadAttention", dict(n_embd=D, n_head=h)),
               ("FFN", "FeedForward", dict(n_embd=D)),
               ("Pre-LN layer", "TransformerLayer", dict(n_embd=D, n_head=h, pre_ln=True)),
               ("Post-LN layer", "TransformerLayer", dict(n_embd=D, n_head=h, pre_ln=False)),
               ("DecoderLM", "DecoderLM", dict(n_vocab=n_vocab, n_embd=D, n_head=h, n_positions=S,
                                               n_layers=n_layers))]
    results = []
    for name, cls, kwargs in modules:
        ours = getattr(transformer, cls)(p_dropout=p_dropout, **kwargs).train()
        if cls == "DecoderLM":
            x_np = rng.integers(0, n_vocab, (B, S))
            x, x_t = x_np, torch.from_numpy(x_np)
        else:
            x_np = rng.standard_normal((B, S, D))
            x, x_t = Tensor(x_np, requires_grad=True), torch.tensor(x_np, requires_grad=True)
        out = ours(x)
        # loss = Σ out · weights: every output entry matters
        weights = rng.standard_normal(out.shape)
        (out * weights).sum().backward()           # ours first: it draws the dropout masks
        twin = torch_ref.copy_from(getattr(torch_ref, cls)(p_dropout=p_dropout, **kwargs), ours)
        out_t = twin(x_t)
        (out_t * torch.from_numpy(weights)).sum().backward()
        ours_grads = {n: p.grad for n, p in ours.named_parameters()}
        grad_diffs = {n: float(np.abs(g - ours_grads[n]).max()) for n, g
                      in torch_ref.gradients(twin).items()}
        if isinstance(x, Tensor):
            grad_diffs["(input)"] = float(np.abs(x.grad - x_t.grad.numpy()).max())
        worst = max(grad_diffs, key=grad_diffs.get)
        dropouts = sum(type(m).__name__ == "Dropout" for _, m in ours.named_modules())
        results.append(dict(module=name, n_params=ours.num_parameters(), n_tensors=len(ours_grads),
                            dropouts=dropouts,
                            output_diff=float(np.abs(out.data - out_t.detach().numpy()).max()),
                            grad_diffs=grad_diffs, max_grad_diff=grad_diffs[worst], worst=worst))
    return results


def show_parity(args):
    common.header(4, __doc__)
    results = parity(seed=args.seed)
    common.table([[r["module"], f"{r['n_params']:,}", r["n_tensors"], r["dropouts"],
                   common.at_most(max(r["output_diff"], r["max_grad_diff"]), PARITY_BOUND)]
                  for r in results],
                 headers=["module", "parameters", "parameter tensors", "dropout modules",
                          "max |Δ| of output and every gradient"], disable_numparse=True)
    overall = max(max(r["output_diff"], r["max_grad_diff"]) for r in results)
    common.note(f"largest difference anywhere {common.at_most(overall, PARITY_BOUND)} "
                "(float64 rounding; "
                "notes: 3.6e-15); not a line of backward written by hand")
    # the digits of rounding-level differences, and which of many tensors holds the largest, depend
    # on the CPU's kernels: marked, on rows of their own so that the counts above stay checked
    common.table([[r["module"], f"{r['output_diff']:.1e}", f"{r['max_grad_diff']:.1e}", r["worst"]]
                  for r in results],
                 headers=["module", "max |Δ output|", "max |Δ gradient| (all parameters + input)",
                          "largest gradient difference in"],
                 disable_numparse=True, kernel_dependent=True)


# ---- Part 5 · §8.4 how many primitive operations a forward makes ---------------------------------
KINDS = ["matmul", "add", "sub", "mul", "neg", "exp", "log", "sigmoid", "relu", "sum", "max",
         "embedding",
         "view", "permute", "contiguous"]
LAYOUT_ONLY = ("view", "permute")  # change strides only: no kernel, no memory traffic
LAYOUT = LAYOUT_ONLY + ("contiguous",)   # rearrange the layout; contiguous() copies


def op_counts(B: int = 2, S: int = 5, D: int = 12, h: int = 3, n_vocab: int = 20, n_layers: int = 2,
              seed: int = 0) -> dict:
    """Counter of tensor.py primitives per module forward (eval mode: dropout adds nothing) and per
    composite function; plus the Pre-LN layer in train mode (one mul per dropout)."""
    transformer.set_seed(seed)  # the weights too, not only the inputs
    x = Tensor(np.random.default_rng(seed).standard_normal((B, S, D)))
    ids = np.zeros((B, S), dtype=np.int64)
    modules = [("Linear", transformer.Linear(D, D), x),
               ("LayerNorm", transformer.LayerNorm(D), x),
               ("attention", transformer.MultiHeadAttention(D, h), x),
               ("FFN", transformer.FeedForward(D), x),
               ("Pre-LN layer", transformer.TransformerLayer(D, h), x),
               (f"DecoderLM ({n_layers} layers)",
                transformer.DecoderLM(n_vocab, D, h, n_positions=S, n_layers=n_layers), ids)]
    counts = {}
    for name, module, inputs in modules:
        module.eval()
        with tensor.count_ops() as c:
            module(inputs)
        counts[name] = Counter(c)
    functions = {}
    for name, f in [("softmax", transformer.softmax), ("gelu", transformer.gelu)]:
        with tensor.count_ops() as c:
            f(x)
        functions[name] = Counter(c)
    layer = modules[4][1].train()
    with tensor.count_ops() as c:
        layer(x)
    return dict(modules=counts, functions=functions, pre_ln_train=Counter(c))


def _kinds_used(counters) -> list[str]:
    return [k for k in KINDS if any(c[k] for c in counters)]


def show_op_counts(args):
    common.header(5, __doc__)
    r = op_counts(seed=args.seed)
    rows = dict(r["modules"], **{f"{k}()": v for k, v in r["functions"].items()})
    kinds = _kinds_used(rows.values())
    common.table([[name] + [c[k] or "" for k in kinds] + [sum(c.values()),
                                                          sum(c.values()) - c["matmul"]]
                  for name, c in rows.items()],
                 headers=["module (calls)"] + kinds + ["total", "all but matmul"],
                 disable_numparse=True)
    layer, train = r["modules"]["Pre-LN layer"], r["pre_ln_train"]
    total, matmuls = sum(layer.values()), layer["matmul"]
    layout = {kind: layer[kind] for kind in LAYOUT}
    strides_only = sum(layer[kind] for kind in LAYOUT_ONLY)
    elementwise = total - matmuls - sum(layout.values())
    common.note(f"\nPre-LN layer: {total} primitive calls = {matmuls} matmuls + {total - matmuls} "
                "others (notes: 68 = 8 matmuls + 60 elementwise ops and reductions);\nof our "
                f"{total - matmuls} others, {elementwise} are elementwise ops and reductions and "
                f"{sum(layout.values())} rearrange the layout ("
                + ", ".join(f"{n} {kind}" for kind, n in layout.items())
                + f"). In train mode {sum(train.values())} "
                f"calls (+{train['mul'] - layer['mul']} dropout multiplies).")
    softmax_calls = sum(r["functions"]["softmax"].values())
    common.note(f"The {strides_only} view/permute calls only change strides (no kernel on a GPU): "
                f"{total - strides_only} of the {total} calls touch memory\n({matmuls} matmuls, "
                f"{elementwise} elementwise ops and reductions, {layout['contiguous']} contiguous "
                "copy). tensor.py has no rsqrt, so 1/√v is log, mul, exp; softmax alone is "
                f"{softmax_calls} calls.")
    draw_op_counts(r["modules"], args.figures)


@common.draws_figure
def draw_op_counts(counts: dict, figures_dir):
    import matplotlib.pyplot as plt
    names = list(counts)
    kinds = _kinds_used(counts.values())
    fig, ax = plt.subplots(figsize=(8, 3.8))
    left = np.zeros(len(names))
    colours = dict(matmul="#1f3b73", add="#f4a261", sub="#e9c46a", mul="#e76f51", neg="#f6bd60",
                   exp="#d62828", log="#9d0208",
                   sigmoid="#ffb4a2", relu="#ffcdb2", sum="#2a9d8f", max="#8ac926",
                   embedding="#7b2cbf",
                   view="#e0e0e0", permute="#c8c8c8", contiguous="#6c757d")
    for kind in kinds:
        widths = np.array([counts[n][kind] for n in names], dtype=float)
        ax.barh(names, widths, left=left, color=colours[kind], edgecolor="white", linewidth=0.5,
                hatch="//" if kind in LAYOUT_ONLY else None,
                label=kind + (" (no copy)" if kind in LAYOUT_ONLY else ""))
        left += widths
    for i, total in enumerate(left):
        ax.text(total + 1, i, f"{int(total)}", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("primitive calls in one forward (eval mode)")
    ax.set_title("tensor.py primitives per module: matmuls are few, small ops are many",
                 fontsize=10)
    ax.legend(ncol=1, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    ax.set_xlim(0, left.max() * 1.1)
    common.save_figure(fig, "03_op_counts", figures_dir)


# ---- Part 6 · §3.3, §6.1-§6.2 the paper's encoder-decoder ----------------------------------------
def _script(name: str):
    """Another numbered script as a module (its name starts with a digit, so no plain import); its
    parts only run under __main__, so importing it computes nothing."""
    import importlib.util
    import os
    import sys
    if name not in sys.modules:
        path = os.path.join(os.path.dirname(__file__), f"{name}.py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def encoder_decoder_parameters(d: int = 512, d_ff: int = 2048, n_head: int = 8, n_layers: int = 6,
                               n_vocab: int = 37000) -> dict:
    """Build encoder_decoder.EncoderDecoder at this size (Post-LN, the paper's; the default is the
    paper's base model on the 37K shared vocabulary) and count each module's parameters, against the
    formula term by term and against 02 part 5's total for the same configuration."""
    model = encoder_decoder.EncoderDecoder(n_vocab, d, n_head, n_layers=n_layers, middle_dim=d_ff,
                                           # positions are sinusoidal: no parameters
                                           n_positions=1, p_dropout=0.0)
    attention, ffn, layer_norm = 4 * (d * d + d), 2 * d * d_ff + d_ff + d, 2 * d
    enc, dec = model.encoder_layers[0], model.decoder_layers[0]
    rows = [("token_embeddings (source, target and output)", "V·d", n_vocab * d,
             model.token_embeddings),
            ("encoder layer: attention", "4(d² + d)", attention, enc.attention),
            ("encoder layer: ff", "2·d·d_ff + d_ff + d", ffn, enc.ff),
            ("encoder layer: ln_1, ln_2", "2 · 2d", 2 * layer_norm, [enc.ln_1, enc.ln_2]),
            ("decoder layer: attention (causal)", "4(d² + d)", attention, dec.attention),
            ("decoder layer: cross_attention", "4(d² + d)", attention, dec.cross_attention),
            ("decoder layer: ff", "2·d·d_ff + d_ff + d", ffn, dec.ff),
            ("decoder layer: ln_1, ln_2, ln_3", "3 · 2d", 3 * layer_norm,
             [dec.ln_1, dec.ln_2, dec.ln_3]),
            (f"{n_layers} encoder layers", f"{n_layers} × (4d² + 2·d·d_ff + 9d + d_ff)",
             n_layers * (attention + ffn + 2 * layer_norm), model.encoder_layers),
            (f"{n_layers} decoder layers", f"{n_layers} × (8d² + 2·d·d_ff + 15d + d_ff)",
             n_layers * (2 * attention + ffn + 3 * layer_norm), model.decoder_layers),
            ("the whole model", "V·d + both stacks", None, model)]

    def counted(modules) -> int:
        modules = modules if isinstance(modules, list) else [modules]
        return sum(m.num_parameters() for m in modules)

    table = [dict(module=name, formula=text, by_formula=value, counted=counted(modules))
             for name, text, value, modules in rows]
    table[-1]["by_formula"] = n_vocab * d + table[-3]["by_formula"] + table[-2]["by_formula"]
    from_02 = _script("02_positions").parameters_by_formula(d=d, d_ff=d_ff, n_layers=n_layers,
                                                            n_vocab=n_vocab,
                                                             tables=1)
    shared_once = sum(p.data.shape == (n_vocab, d) for p in model.parameters())
    return dict(d=d, d_ff=d_ff, n_head=n_head, n_layers=n_layers, n_vocab=n_vocab, rows=table,
                total=model.num_parameters(), from_02=from_02["total"], tables=shared_once)


def _recorded(method, log: dict, label: str):
    """Wrap a bound method so that each call appends its result to log[label]: the shapes come from
    the real forward's own calls, not from a re-implementation of it."""
    def wrapper(*args, **kwargs):
        result = method(*args, **kwargs)
        log.setdefault(label, []).append(result)
        return result
    return wrapper


def encoder_decoder_shapes(B: int = 2, S_src: int = 5, S_tgt: int = 6, D: int = 12, h: int = 3,
                           n_vocab: int = 11, seed: int = 0) -> dict:
    """One encoder layer and one decoder layer (Post-LN, eval mode), source row 1 padded at its last
    two positions: the shape of every tensor the forward makes, recorded from the calls
    themselves."""
    transformer.set_seed(seed)  # the weights too, not only the inputs
    model = encoder_decoder.EncoderDecoder(n_vocab, D, h, n_layers=1,
                                           n_positions=max(S_src, S_tgt), p_dropout=0.0)
    enc, dec = model.encoder_layers[0], model.decoder_layers[0]
    log = {}
    for label, module in (("encoder attention", enc.attention),
                          ("decoder attention", dec.attention),
                          ("cross-attention", dec.cross_attention)):
        module.project_to_query_key_value = _recorded(module.project_to_query_key_value, log, label)
    for label, module in (("encoder ff", enc.ff.linear_in), ("decoder ff", dec.ff.linear_in)):
        module.forward = _recorded(module.forward, log, label)
    for name in ("encode", "embed", "shift_right"):
        setattr(model, name, _recorded(getattr(model, name), log, name))
    rng = np.random.default_rng(seed)
    src, tgt = rng.integers(0, n_vocab, (B, S_src)), rng.integers(0, n_vocab, (B, S_tgt))
    src_pad = np.zeros((B, S_src), dtype=bool)
    src_pad[1, -2:] = True
    logits = model.eval()(src, tgt, src_pad)
    steps = _shape_steps(log, enc, dec, src, logits)
    self_w, cross_w = dec.attention.last_attention.data, dec.cross_attention.last_attention.data
    future = np.triu(np.ones((S_tgt, S_tgt), dtype=bool), k=1)
    padded = np.broadcast_to(src_pad[:, None, None, :], cross_w.shape)
    return dict(B=B, S_src=S_src, S_tgt=S_tgt, D=D, h=h, d_ff=4 * D, n_vocab=n_vocab, steps=steps,
                calls={label: len(results) for label, results in log.items()},
                self_future_max=float(self_w[..., future].max()),
                self_past_min=float(self_w[..., ~future].min()),
                cross_padded_max=float(cross_w[padded].max()),
                cross_visible_min=float(cross_w[~padded].min()),
                n_padded=int(src_pad.sum()))


def _shape_steps(log: dict, enc, dec, src: np.ndarray, logits: Tensor) -> list[tuple]:
    """(tensor, what it is, its shape) for each step of the forward, in order, the shapes as the
    forward's own calls made them (log: encoder_decoder_shapes's record)."""
    qkv = lambda label: ", ".join(str(t.shape) for t in log[label][0])
    # embed runs on the source first, then the target
    source_embedded, target_embedded = log["embed"]
    return [("source ids", "(B, S_src)", src.shape),
            ("token_embeddings · √d + PE", "source", source_embedded.shape),
            ("q, kT, v", "encoder self-attention", qkv("encoder attention")),
            ("weights", "(B, h, S_src, S_src), not causal", enc.attention.last_attention.shape),
            ("ff hidden", "(B, S_src, d_ff)", log["encoder ff"][0].shape),
            ("memory", "encoder output", log["encode"][0].shape),
            ("target shifted right", "[bos, y_0 … y_T−2]", log["shift_right"][0][0].shape),
            ("token_embeddings · √d + PE", "target", target_embedded.shape),
            ("q, kT, v", "decoder self-attention", qkv("decoder attention")),
            ("weights", "(B, h, S_tgt, S_tgt), causal", dec.attention.last_attention.shape),
            ("q", "cross: from the decoder", log["cross-attention"][0][0].shape),
            ("kT, v", "cross: from the memory",
             ", ".join(str(t.shape) for t in log["cross-attention"][0][1:])),
            ("weights", "(B, h, S_tgt, S_src)", dec.cross_attention.last_attention.shape),
            ("ff hidden", "(B, S_tgt, d_ff)", log["decoder ff"][0].shape),
            ("logits = y · token_embeddingsᵀ", "(B, S_tgt, V)", logits.shape)]


def torch_nn_parity(B: int = 3, S_src: int = 5, S_tgt: int = 7, D: int = 16, h: int = 4,
                    n_layers: int = 2,
                    n_vocab: int = 11, seed: int = 0) -> list[dict]:
    """Our EncoderDecoder against PyTorch's own torch.nn.Transformer (in
    torch_ref.TorchNNEncoderDecoder, the same weights copied in), float64, no dropout, padded source
    and target: max |difference| of the logits and of every parameter's gradient, Post-LN (the
    paper) and Pre-LN."""
    transformer.set_seed(seed)  # the weights too, not only the inputs
    rng = np.random.default_rng(seed)
    src, tgt = rng.integers(0, n_vocab, (B, S_src)), rng.integers(0, n_vocab, (B, S_tgt))
    src_pad, tgt_pad = np.zeros((B, S_src), dtype=bool), np.zeros((B, S_tgt), dtype=bool)
    # every row keeps a real token (torch.nn gives nan for a row with none; ours stays finite)
    src_pad[1, -2:], tgt_pad[1, -3:] = True, True
    out_grad = rng.standard_normal((B, S_tgt, n_vocab))
    results = []
    for pre_ln in (False, True):
        kwargs = dict(n_vocab=n_vocab, n_embd=D, n_head=h, n_layers=n_layers,
                      n_positions=max(S_src, S_tgt),
                      pre_ln=pre_ln)
        ours = encoder_decoder.EncoderDecoder(**kwargs, p_dropout=0.0)
        # LayerNorms start at 1 and 0; other values make their gradients a test
        for _, m in ours.named_modules():
            if isinstance(m, transformer.LayerNorm):
                m.weights.data[...] = rng.uniform(0.5, 1.5, m.weights.shape)
                m.bias.data[...] = rng.normal(0.0, 0.3, m.bias.shape)
        reference = torch_ref.copy_to_torch_nn(torch_ref.TorchNNEncoderDecoder(**kwargs), ours)
        out = ours(src, tgt, src_pad, tgt_pad)
        out.backward(out_grad)
        out_t = reference(src, tgt, src_pad, tgt_pad)
        out_t.backward(torch.from_numpy(out_grad))
        theirs = torch_ref.torch_nn_gradients(reference, ours)
        grad_diffs = {n: float(np.abs(p.grad - theirs[n]).max()) for n, p
                      in ours.named_parameters()}
        worst = max(grad_diffs, key=grad_diffs.get)
        results.append(dict(placement="Pre-LN" if pre_ln else "Post-LN (the paper)",
                            n_params=ours.num_parameters(),
                            n_tensors=len(grad_diffs),
                            output_diff=float(np.abs(out.data - out_t.detach().numpy()).max()),
                            grad_diffs=grad_diffs, max_grad_diff=grad_diffs[worst], worst=worst,
                            final_norms=reference.transformer.encoder.norm is not None))
    return results


# small: the claim is about counts, not quality
GENERATION_SIZE = dict(D=16, h=4, n_layers=2, n_vocab=11)


def encoder_decoder_generation(source_lengths=(5, 3), D: int = 16, h: int = 4, n_layers: int = 2,
                               n_vocab: int = 11, seed: int = 0, num_beams: int = 4,
                               length_penalty: float = 0.6) -> dict:
    """Greedy generation (notes §1.1, §7.6) from a random-init EncoderDecoder, with the KV cache and
    without it: encoder calls (counted by wrapping model.encode), decoder passes
    (Generation.n_forward), positions run through the decoder per row
    (Generation.positions_computed), tokens per row against generate()'s default limit of source
    length + 50, and the largest logit difference between the two. The sources are one batch, padded
    to the longest: each row's limit follows its own length. Then the same for the paper's beam
    search (num_beams hypotheses per row, length_penalty α; `beam`), and the largest difference of
    its scores with and without the cache."""
    transformer.set_seed(seed)  # the weights too, not only the inputs
    longest = max(source_lengths)
    model = encoder_decoder.EncoderDecoder(n_vocab, D, h, n_layers=n_layers,
                                           n_positions=longest + 50 + 1,
                                           # generate() must switch dropout off itself
                                           p_dropout=0.1)
    rng = np.random.default_rng(seed)
    src = rng.integers(2, n_vocab, (len(source_lengths), longest))   # ids 0, 1 are pad and bos
    src_pad = np.arange(longest)[None, :] >= np.array(source_lengths)[:, None]   # (B, S_src)
    encoder_calls, encode = [], model.encode

    def counted_encode(*args, **kwargs):
        encoder_calls.append(1)
        return encode(*args, **kwargs)
    # the instance's attribute shadows the method for this model only
    model.encode = counted_encode
    def both_ways(**decoding) -> dict:
        runs = {}
        for use_cache in (True, False):
            encoder_calls.clear()
            # the default limit
            generation = model.generate(src, src_pad, use_cache=use_cache, **decoding)
            runs[use_cache] = dict(generation=generation, encoder_calls=len(encoder_calls))
        return runs
    runs = both_ways()                                                   # greedy
    beam = both_ways(num_beams=num_beams, length_penalty=length_penalty)
    cached, recomputed = runs[True]["generation"], runs[False]["generation"]
    beam_cached, beam_recomputed = beam[True]["generation"], beam[False]["generation"]
    return dict(source_lengths=list(source_lengths), D=D, h=h, n_layers=n_layers, n_vocab=n_vocab,
                limits=[n + 50 for n in source_lengths], runs=runs, training=model.training,
                same_tokens=bool(np.array_equal(cached.tokens, recomputed.tokens)),
                max_logit_diff=float(np.abs(cached.logits - recomputed.logits).max()),
                num_beams=num_beams, length_penalty=length_penalty, beam=beam,
                beam_same_tokens=bool(np.array_equal(beam_cached.tokens, beam_recomputed.tokens)),
                beam_score_diff=float(np.abs(beam_cached.scores - beam_recomputed.scores).max()))


def show_generation(g: dict):
    lengths, limits = g["source_lengths"], g["limits"]
    common.note(f"Greedy generation and the paper's beam search with generate()'s default limit, "
                f"source length + 50: a "
                f"random-init model (d = {g['D']}, h = {g['h']}, {g['n_layers']} + {g['n_layers']} "
                f"layers, V = {g['n_vocab']}),\n{len(lengths)} sources of "
                f"{' and '.join(map(str, lengths))} tokens in one padded batch:")
    rows = []
    beams = f"beam search, {g['num_beams']} beams, α = {g['length_penalty']:g}"
    for runs, decoding in ((g["runs"], "greedy"), (g["beam"], beams)):
        for use_cache, label in ((True, "with the KV cache"),
                                 (False, "without (the whole prefix each pass)")):
            run = runs[use_cache]
            generation = run["generation"]
            rows.append([f"{decoding}, {label}", run["encoder_calls"], generation.n_forward,
                         generation.positions_computed,
                         " and ".join(map(str, generation.lengths.tolist()))])
    common.table(rows, headers=["generation", "encoder calls", "decoder passes",
                                "positions per row (summed over passes, all beams)",
                                "tokens generated per row"], disable_numparse=True)
    cached = g["runs"][True]["generation"]
    passes = cached.n_forward
    stops = all(n == limit for n, limit in zip(cached.lengths.tolist(), limits))
    recomputed = g["runs"][False]["generation"].positions_computed
    once = all(run["encoder_calls"] == 1 for run in g["runs"].values())
    per_token = "one pass" if passes == max(cached.lengths) else "NOT one pass"
    limits_text = ", ".join(f"{n} + 50 = {limit}" for n, limit in zip(lengths, limits))
    triangle = "equal" if recomputed == passes * (passes + 1) // 2 else "NOT equal"
    same = "the same" if g["same_tokens"] else "NOT the same"
    common.note(
        f"The encoder runs {'once' if once else 'MORE than once'}; the decoder makes {per_token} "
        f"per generated token ({passes} passes for the longest row's {max(cached.lengths)} "
        f"tokens), and each\nrow {'stops' if stops else 'does NOT stop'} at its source length + 50 "
        f"({limits_text}). Without the cache pass t recomputes t positions: {recomputed} = "
        f"{passes}·{passes + 1}/2 ({triangle}).\nThe cache's logits equal the recompute's: "
        f"max |Δ logits| {common.at_most(g['max_logit_diff'], 1e-12)}, {same} tokens.")
    show_beam_counts(g)


def show_beam_counts(g: dict):
    """The beam-search rows of show_generation's table, counted as its greedy rows are."""
    k, limits = g["num_beams"], g["limits"]
    cached, recomputed = (g["beam"][use_cache]["generation"] for use_cache in (True, False))
    passes = cached.n_forward
    once = all(run["encoder_calls"] == 1 for run in g["beam"].values())
    by_limit = all(n <= limit for n, limit in zip(cached.lengths.tolist(), limits))
    beams_times_steps = "equal" if cached.positions_computed == k * passes else "NOT equal"
    triangle = ("equal" if recomputed.positions_computed == k * passes * (passes + 1) // 2
                else "NOT equal")
    same = "the same" if g["beam_same_tokens"] else "NOT the same"
    common.note(
        f"The paper's beam search ({k} hypotheses per row, length penalty α = "
        f"{g['length_penalty']:g}): the encoder runs {'once' if once else 'MORE than once'} per "
        f"source (each beam reads a copy of its memory);\nwith the cache a pass computes one "
        f"position per beam: {cached.positions_computed} = {k} beams × {passes} passes "
        f"({beams_times_steps}), without it {recomputed.positions_computed} = "
        f"{k}·{passes}·{passes + 1}/2 ({triangle}); every row\n"
        f"{'stops' if by_limit else 'does NOT stop'} by its source length + 50. The cache's "
        f"search equals the recompute's: {same} tokens, scores (sums of log p) differ by "
        f"{common.at_most(g['beam_score_diff'], 1e-12)}.")


def show_encoder_decoder(args):
    common.header(6, __doc__)
    print_encoder_decoder_parameters(encoder_decoder_parameters())
    print()
    print_encoder_decoder_shapes(encoder_decoder_shapes(seed=args.seed))
    parity_size = dict(B=3, S_src=5, S_tgt=7, D=16, h=4, n_layers=2, n_vocab=11)
    results = torch_nn_parity(**parity_size, seed=args.seed)
    print()
    print_torch_nn_parity(results, parity_size)
    print()
    show_generation(encoder_decoder_generation(**GENERATION_SIZE, seed=args.seed))


def print_encoder_decoder_parameters(r: dict):
    """The base model's parameters by module, by formula and counted, and against 02 part 5's."""
    common.note(f"encoder_decoder.EncoderDecoder built at the paper's base size (d = {r['d']}, "
                f"d_ff = {r['d_ff']}, h = {r['n_head']}, {r['n_layers']} + {r['n_layers']} layers, "
                f"Post-LN, V = {r['n_vocab']:,}); parameters counted from its modules:")
    common.table([[row["module"], row["formula"], f"{row['by_formula']:,}", f"{row['counted']:,}",
                   "yes" if row["by_formula"] == row["counted"] else "NO"] for row in r["rows"]],
                 headers=["module", "formula", "by formula (parameters)", "counted (parameters)",
                          "equal"],
                 disable_numparse=True)
    common.note(f"02 part 5's formula for the base model with one shared table: {r['from_02']:,} "
                f"({'equal' if r['from_02'] == r['total'] else 'NOT equal'}); the model holds "
                f"{r['tables']} V × d table, used as source embedding, target embedding and output "
                f"layer.")


def print_encoder_decoder_shapes(s: dict):
    """Every step's shape through one encoder and one decoder layer, and where the two attentions
    may look."""
    common.note(f"One encoder layer and one decoder layer, B = {s['B']}, S_src = {s['S_src']}, "
                f"S_tgt = {s['S_tgt']}, D = {s['D']}, h = {s['h']} (Dh = {s['D'] // s['h']}), d_ff "
                f"= {s['d_ff']}, V = {s['n_vocab']}; source row 1 padded at its last "
                f"{s['n_padded']} positions:")
    common.table([[code, what, str(shape)] for code, what, shape in s["steps"]],
                 headers=["step", "what", "shape"], disable_numparse=True)
    common.note(f"Decoder self-attention: weight on a future position at most "
                f"{s['self_future_max']:.1f} (causal). Cross-attention: on a padded source "
                f"position at most {s['cross_padded_max']:.1f}; every other entry > 0 (smallest "
                f"{s['cross_visible_min']:.2g}): no causal mask, the whole source is visible.")


def print_torch_nn_parity(results: list, size: dict):
    """torch_nn_parity's Post-LN and Pre-LN rows: logits and gradients against torch.nn.Transformer,
    and the final norms torch adds."""
    common.note(f"Against PyTorch's own torch.nn.Transformer at a small size, d = {size['D']}, h = "
                f"{size['h']}, {size['n_layers']} + {size['n_layers']} layers, V = "
                f"{size['n_vocab']}, B = {size['B']}, S_src = {size['S_src']}, S_tgt = "
                f"{size['S_tgt']}\n(the same weights copied in; float64, no dropout, padded source "
                f"and target):")
    common.table([[p["placement"], "yes" if p["final_norms"] else "no", f"{p['n_params']:,}",
                   p["n_tensors"]] for p in results],
                 headers=["LayerNorm", "final norms", "parameters", "parameter tensors"],
                 disable_numparse=True)
    # the digits of rounding-level differences, and which parameter holds the largest, depend on
    # the CPU's kernels (torch.nn's fused paths round differently from its generic ones): marked,
    # on rows of their own; the bound below is not
    common.table([[p["placement"], f"{p['output_diff']:.1e}", f"{p['max_grad_diff']:.1e}",
                   p["worst"]] for p in results],
                 headers=["LayerNorm", "max |Δ logits|", "max |Δ gradient| (every parameter)",
                          "largest gradient difference in"],
                 disable_numparse=True, kernel_dependent=True)
    overall = max(max(p["output_diff"], p["max_grad_diff"]) for p in results)
    common.note(f"Post-LN and Pre-LN: the logits and the gradients of all "
                f"{' and '.join(str(p['n_tensors']) for p in results)} parameter tensors differ by "
                f"{common.at_most(overall, PARITY_BOUND)}"
                + (": float64 rounding." if overall <= PARITY_BOUND else ": NOT rounding, a bug."))
    post, pre = results
    extra = pre["n_params"] - post["n_params"]
    common.note(f"Pre-LN's final encoder_ln and decoder_ln add {extra} parameters "
                f"({'=' if extra == 4 * size['D'] else '≠'} 4d = {4 * size['D']}). "
                f"torch.nn.Transformer builds those two final norms\neven for Post-LN, where the "
                f"paper has none; the reference passes its own encoder and decoder without them "
                f"(torch_ref.TorchNNEncoderDecoder).")


# ---- Part 7 · §8.4 continued, beyond the notes: what fusion buys ---------------------------
def fusion_times(d: int, h: int, S: int, repeats: int = 5, seed: int = 0) -> dict:
    """⏱ median wall-clock seconds of one forward + backward of the layer per path."""
    transformer.set_seed(seed)
    layer = transformer.TransformerLayer(d, h, p_dropout=0.0)
    x = np.random.default_rng(seed).standard_normal((1, S, d))

    def step(path):
        with costs.fusion_switch(path):
            layer(Tensor(x, requires_grad=True)).sum().backward()
        layer.zero_grad()
    return {path: common.median_time(lambda: step(path), repeats, warmup=1)[0]
            for path in costs.FUSION_PATHS}


def show_fusion(args):
    big = costs.GPT2_LAYER
    small = dict(d=128, h=4, S=128) if args.quick else dict(d=256, h=4, S=256)
    common.header(7, __doc__)
    rows = costs.fusion_counts_from_shapes(big["d"], big["h"], big["S"], seed=args.seed)
    print_fusion_counts(rows, big)
    print_fusion_times(fusion_times(small["d"], small["h"], small["S"], seed=args.seed), small)
    draw_fusion(rows, big, args.figures)


def print_fusion_counts(rows: list[dict], big: dict):
    """The counts of each path at GPT-2 small's layer, and what fusing and flash change."""
    by_path = {r["path"]: r for r in rows}
    common.note(f"At the notes' shapes, GPT-2 small's layer (d = {big['d']}, h = {big['h']}, "
                f"S = {big['S']}), counted from runs at S = 2, 4, 6 (every count\nis quadratic "
                f"in S; checked at S = 8); bytes at float64, tensor.py's dtype (÷ 2 for float32, "
                f"÷ 4 for fp16).\nCalls: all; launches: the calls that move memory (not view, "
                f"permute, nor the backward of contiguous; nor a contiguous() that finds its "
                f"input\ncontiguous already, as the flash core's output is: it writes the heads "
                f"merged).")
    mib = 2 ** 20
    common.table([[r["path"], r["forward_calls"], r["forward_moving"], r["backward_calls"],
                   r["backward_moving"], f"{r['forward_bytes'] / mib:,.0f}",
                   f"{r['backward_bytes'] / mib:,.0f}",
                   f"{(r['forward_bytes'] + r['backward_bytes']) / mib:,.0f}",
                   f"{r['forward_flops'] / 1e9:.2f}", f"{r['backward_flops'] / 1e9:.2f}",
                   f"{r['saved'] / mib:,.0f}"] for r in rows],
                 headers=["path", "fwd calls", "launches", "bwd calls", "launches",
                          "fwd MiB moved", "bwd MiB moved", "total MiB", "fwd GFLOP",
                          "bwd GFLOP", "MiB saved for bwd"],
                 disable_numparse=True)
    composed, fused_row, flash = (by_path[p] for p in costs.FUSION_PATHS)
    moved = {p: r["forward_bytes"] + r["backward_bytes"] for p, r in by_path.items()}
    launches = {p: r["forward_moving"] + r["backward_moving"] for p, r in by_path.items()}
    flops = {p: r["forward_flops"] + r["backward_flops"] for p, r in by_path.items()}
    recompute = 2 * big["S"] ** 2 * big["d"]  # q kᵀ again: 2·S·S·Dh per head, h heads
    extra = flash["backward_flops"] - composed["backward_flops"]
    common.note(f"Fusing LayerNorm, GELU and scale + mask + softmax: launches "
                f"{launches['composed']} -> {launches['fused']}, bytes moved ÷ "
                f"{moved['composed'] / moved['fused']:.2f}; with the flash core: launches "
                f"{launches['fused + flash']}, bytes ÷ "
                f"{moved['composed'] / moved['fused + flash']:.2f}.")
    common.note(f"FLOPs: fused {'=' if flops['fused'] == flops['composed'] else '≠ (a BUG)'} "
                f"composed; the flash backward makes {extra / 1e9:.2f} GFLOP more, "
                f"2·S²·d = {recompute / 1e9:.2f}: it recomputes q kᵀ instead of keeping\nthe "
                f"weights. Saved for backward: {composed['saved'] / mib:,.0f} MiB composed, "
                f"{fused_row['saved'] / mib:,.0f} fused (no intermediates of softmax and GELU),\n"
                f"{flash['saved'] / mib:,.0f} with the flash core (no h × S × S).")


def print_fusion_times(times: dict, small: dict):
    """⏱ each path's time at the small layer, and why a CPU shows less than the counts."""
    for path in costs.FUSION_PATHS:
        common.timing(f"d = {small['d']}, h = {small['h']}, S = {small['S']}, forward + backward "
                      f"on this CPU, {path:13}: {1e3 * times[path]:6.1f} ms "
                      f"({times['composed'] / times[path]:.2f}× the composed speed)")
    common.note("(the ⏱ lines, printed when you run it, time the three paths on your CPU. There "
                "numpy runs each fused primitive\nas a few whole-array passes of its own, so a "
                "fused path saves Python calls rather than memory traffic; on a GPU each\nlaunch "
                "costs microseconds and each pass a round trip through global memory, which the "
                "counts above measure)")


@common.draws_figure
def draw_fusion(rows: list[dict], shape: dict, figures_dir):
    import matplotlib.pyplot as plt
    names = [r["path"] for r in rows]
    panels = [("launches (calls that move memory)",
               [(r["forward_moving"], r["backward_moving"]) for r in rows], 1),
              ("GiB moved (float64)",
               [(r["forward_bytes"], r["backward_bytes"]) for r in rows], 2 ** 30),
              ("MiB saved for backward (float64)", [(r["saved"], 0) for r in rows], 2 ** 20)]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    for ax, (title, values, unit) in zip(axes, panels):
        forward = np.array([f for f, _ in values]) / unit
        backward = np.array([b for _, b in values]) / unit
        ax.bar(names, forward, color="#4c72b0", label="forward")
        ax.bar(names, backward, bottom=forward, color="#dd8452", label="backward")
        for i, top in enumerate(forward + backward):
            ax.text(i, top, f"{top:.3g}", ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, (forward + backward).max() * 1.15)
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"One Pre-LN layer, d = {shape['d']}, h = {shape['h']}, S = {shape['S']}: "
                 f"composed vs fused vs flash (tensor.py's counters)", fontsize=10, y=1.02)
    common.save_figure(fig, "03_fusion", figures_dir)


PARTS = {1: show_stable_loss, 2: show_dropout, 3: show_head_shapes, 4: show_parity,
         5: show_op_counts, 6: show_encoder_decoder, 7: show_fusion}

if __name__ == "__main__":
    common.main(__doc__, PARTS)
