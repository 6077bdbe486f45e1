"""Script 06 · Costs: parameters, FLOPs per token, where n² takes over, activation memory, time.

Part 1 · §8.1 Parameters: the formula against the modules' own count (torch_ref on meta)
Part 2 · §8.2 FLOPs per token, GPT-2 small at n = 1024: formula against FlopCounterMode
Part 3 · §8.3 Where n² takes over: attention 4·n·d against 24·d² per token per layer
Part 4 · §8.3 Activations one Pre-LN layer saves for backward (d = 64, h = 4, float32, no dropout;
    beside it, dropout 0.1)
Part 5 · §8.3 The attention core's share of one layer's time (d = 256, h = 4, float32, 1 thread,
    training mode, dropout 0.1)
Part 6 · §8.3 continued, beyond the notes: the flash core and the activations a layer saves (d = 64,
    h = 4, p_dropout 0)
Part 7 · §8.3, §13 Korthikanti et al. (2022): activation memory per layer, term by term, beside part
    4's measurement

Serves the lecture-6 notes §8.1 (where the parameters are, part 1), §8.2 (FLOPs per token against
PyTorch's FLOP counter, part 2), §8.3 (n = 6d, part 3; the activations a layer saves for backward,
without and with dropout, part 4; the attention core's share of a layer's time, part 5) and §5.1
(the FFN's 2/3), plus exercises 5, 6 and 10. Beyond the notes, part 6 continues §8.3: with a
flash-attention core (tensor.py's, and torch's scaled_dot_product_attention) the h × S × S
term leaves the activations saved for backward. Part 7 holds part 4's measurement against the
per-layer formula of Korthikanti et al. (2022), which §13 points to, term by term. Models are
torch_ref.py's modules: built on the meta device to count (shapes only, nothing allocated), cast
to float32 to measure.

    python code/lecture06/06_costs.py [--part N] [--seed S] [--quick] [--no-figures]
"""
from __future__ import annotations

import sys

try:   # first: one BLAS thread before numpy loads
    from lecture06 import common
except ModuleNotFoundError as missing:   # the course's package is not installed in this Python
    sys.exit(f"{missing} in {sys.executable}: run `make venv`, then .venv/bin/python {sys.argv[0]}")

import contextlib
import statistics
from collections import Counter


import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from lecture06 import costs, kernels
from lecture05 import tensor
from lecture06 import torch_ref, transformer
from lecture06.threads import torch_threads

GPT2_SMALL = dict(n_vocab=50257, n_embd=768, n_head=12, n_positions=1024, n_layers=12,
                  tie_weights=True)
SIZES = {"GPT-2 small": GPT2_SMALL,
         "GPT-2 medium": dict(GPT2_SMALL, n_embd=1024, n_head=16, n_layers=24),
         "GPT-2 large": dict(GPT2_SMALL, n_embd=1280, n_head=20, n_layers=36)}
LLAMA_7B = dict(n_embd=4096, n_head=32, middle_dim=11008)  # SwiGLU FFN: three d × 11008 matrices
GIB, MIB = 2 ** 30, 2 ** 20


def meta_model(n_vocab, n_embd, n_head, n_positions, n_layers, tie_weights=True, **kwargs):
    """torch_ref.DecoderLM with shapes only (meta device): instant at any size, nothing
    allocated."""
    with torch.device("meta"):
        return torch_ref.DecoderLM(n_vocab, n_embd, n_head, n_positions, n_layers,
                                   tie_weights=tie_weights,
                                   **kwargs)


# ---- Part 1 · §8.1 where the parameters are ------------------------------------------------------
PARAM_TERMS = {  # term -> its formula, as printed
    "token embeddings (wte)": "V·d",
    "position embeddings (wpe)": "n_ctx·d",
    "attention (all layers)": "L(4d² + 4d)",
    "FFN (all layers)": "L(2dm + m + d) = L(8d² + 5d)",
    "layer LayerNorms": "L·4d",
    "final LayerNorm": "2d",
    "output head": "0 if tied, else V·d",
}


def parameter_formula(n_vocab, n_embd, n_head, n_positions, n_layers=4, p_dropout=0.1, ln_eps=1e-5,
                      bias=True,
                      pre_ln=True, causal=True, tie_weights=False, positions="learned",
                      middle_dim=None) -> dict:
    """Parameters term by term, for exactly DecoderLM's arguments and defaults, so that a model and
    its formula cannot be built from different settings (n_head, p_dropout, ln_eps and causal change
    no count). m = FFN width, 4d by default; biases on every Linear if bias; a position table only
    for learned positions; the final LayerNorm only for Pre-LN (a Post-LN stack ends in one)."""
    d, m, b = n_embd, 4 * n_embd if middle_dim is None else middle_dim, int(bias)
    terms = [n_vocab * d, n_positions * d if positions == "learned" else 0,
             n_layers * (4 * d * d + 4 * d * b),
             n_layers * (2 * d * m + (m + d) * b), n_layers * 4 * d, 2 * d if pre_ln else 0,
             0 if tie_weights else n_vocab * d]
    return dict(zip(PARAM_TERMS, terms))


def _param_term(name: str) -> str:
    """torch_ref.DecoderLM parameter name -> the formula's term."""
    parts = name.split(".")
    if parts[0] == "layers":
        return {"attention": "attention (all layers)",
                "ff": "FFN (all layers)"}.get(parts[2], "layer LayerNorms")
    return {"token_embeddings": "token embeddings (wte)",
            "position_embeddings": "position embeddings (wpe)",
            "ln": "final LayerNorm", "lm_head": "output head"}[parts[0]]


def count_parameters(model) -> dict:
    """The module's own parameter count, grouped by the formula's terms (a tied matrix counts
    once)."""
    counts = Counter({term: 0 for term in PARAM_TERMS})
    for name, p in model.named_parameters():
        counts[_param_term(name)] += p.numel()
    return dict(counts)


def layer_parameters(n_embd: int, n_head: int, **_) -> dict:
    """One layer (with biases, FFN 4d) counted from torch_ref.TransformerLayer, next to 12d²; and
    the FFN's share of the matrices alone, counted from the same layer built without biases."""
    def counted(bias: bool) -> Counter:
        with torch.device("meta"):
            layer = torch_ref.TransformerLayer(n_embd, n_head, bias=bias)
        count = Counter()
        for name, p in layer.named_parameters():
            count[name.split(".")[0]] += p.numel()
        return count

    count, matrices = counted(bias=True), counted(bias=False)
    total = sum(count.values())
    return dict(d=n_embd, attention=count["attention"], ffn=count["ff"],
                ln=count["ln_1"] + count["ln_2"],
                total=total, twelve_d2=12 * n_embd ** 2, ffn_share=count["ff"] / total,
                ffn_share_no_bias=matrices["ff"] / (matrices["ff"] + matrices["attention"]))


def parameters(sizes=SIZES) -> dict:
    results = {}
    for name, cfg in sizes.items():
        formula, counted = parameter_formula(**cfg), count_parameters(meta_model(**cfg))
        results[name] = dict(cfg=cfg, formula=formula, counted=counted, total=sum(counted.values()),
                             formula_total=sum(formula.values()))
    layers = [layer_parameters(**SIZES["GPT-2 small"]), layer_parameters(n_embd=1024, n_head=16)]
    return dict(models=results, layers=layers)


def show_parameters(args):
    common.header(1, __doc__)
    r = parameters()
    small = r["models"]["GPT-2 small"]
    cfg = small["cfg"]
    common.note(f"GPT-2 small: d = {cfg['n_embd']}, L = {cfg['n_layers']}, V = {cfg['n_vocab']}, "
                f"n_ctx = {cfg['n_positions']}, m = 4d, biases, tied output head")
    common.table([[term, expr, f"{small['formula'][term]:,}", f"{small['counted'][term]:,}",
                   "yes" if small["formula"][term] == small["counted"][term] else "NO"]
                  for term, expr in PARAM_TERMS.items()]
                 + [["total", "", f"{small['formula_total']:,}", f"{small['total']:,}",
                     "yes" if small["formula_total"] == small["total"] else "NO"]],
                 headers=["term", "formula", "by formula (parameters)", "module count (parameters)",
                          "equal"],
                 disable_numparse=True)
    print()
    common.table([[name, m["cfg"]["n_embd"], m["cfg"]["n_layers"], f"{m['formula_total']:,}",
                   f"{m['total']:,}",
                   "yes" if m["formula"] == m["counted"] else "NO"] for name, m
                  in r["models"].items()],
                 headers=["model", "d", "layers L", "by formula (parameters)",
                          "module count (parameters)",
                          "every term equal"], disable_numparse=True)
    print()
    common.table([[lay["d"], f"{lay['attention']:,}", f"{lay['ffn']:,}", f"{lay['ln']:,}",
                   f"{lay['total']:,}",
                   f"{lay['twelve_d2']:,}", f"{100 * lay['ffn_share']:.2f}%",
                   f"{lay['ffn_share_no_bias']:.4f}"]
                  for lay in r["layers"]],
                 headers=["one layer, d", "attention 4d²+4d", "FFN 8d²+5d", "2 LayerNorms 4d",
                          "total (parameters)", "12d²", "FFN share (with biases)",
                          "FFN share of the matrices, 8d²/12d²"], disable_numparse=True)
    shares = [lay["ffn_share"] for lay in r["layers"]]
    common.note(f"the FFN holds {100 * min(shares):.2f}-{100 * max(shares):.2f}% of a layer's "
                f"parameters, {r['layers'][0]['ffn_share_no_bias']:.4f} of the matrices alone "
                "(notes: 2/3); d = 1024 is exercise 5")


# ---- Part 2 · §8.2 FLOPs per token ---------------------------------------------------------------
def count_flops(model, seq_len: int) -> dict:
    """torch.utils.flop_counter.FlopCounterMode over one forward on the meta device, attributed to
    the formula's terms through the module names the counter reports."""
    counter = FlopCounterMode(display=False)
    with torch.device("meta"), counter:
        if isinstance(model, torch_ref.DecoderLM):
            model(torch.zeros(1, seq_len, dtype=torch.long))
        else:
            model(torch.empty(1, seq_len, model.ln_1.weights.shape[0]))
    flops = {name: sum(per_op.values()) for name, per_op in counter.get_flop_counts().items()}
    terms = dict.fromkeys(costs.FLOP_TERMS, 0)
    for name, n in flops.items():
        last = name.split(".")[-1]
        if last in ("q_projection", "k_projection", "v_projection"):
            terms["QKV projections"] += n
        elif last == "out_projection":
            terms["W_O"] += n
        elif last == "ff":
            terms["FFN"] += n
        elif last == "attention":  # what the attention module does outside its four projections
            terms["attention (QKᵀ, AV)"] += n - sum(flops[f"{name}.{p}_projection"] for p
                                                    in ("q", "k", "v", "out"))
    root = type(model).__name__
    layers = sum(n for name, n in flops.items() if name.count(".") == 2
                 and name.startswith(f"{root}.layers."))
    terms["output layer"] = flops[root] - layers if isinstance(model, torch_ref.DecoderLM) else 0
    terms["total (counter)"] = counter.get_total_flops()
    return terms


def flops_per_token(cfg=GPT2_SMALL, seq_len: int = 1024) -> dict:
    formula = costs.flop_formula(seq_len=seq_len, **cfg)
    counted = count_flops(meta_model(**cfg), seq_len)
    total = sum(formula.values())
    n_params = sum(parameter_formula(**cfg).values())
    # the weights a matmul multiplies: no biases, LayerNorms or position table (added, not
    # multiplied)
    unbiased = parameter_formula(**dict(cfg, bias=False))
    matmul_weights = sum(unbiased[term] for term in ("token embeddings (wte)",
                                                     "attention (all layers)",
                                                     "FFN (all layers)", "output head"))
    attention_per_token = formula["attention (QKᵀ, AV)"] / seq_len
    return dict(seq_len=seq_len, formula=formula, counted=counted, total=total,
                counted_total=counted["total (counter)"], per_token=total / seq_len,
                shares={k: v / total for k, v in formula.items()}, n_params=n_params,
                two_n=2 * n_params,
                matmul_weights=matmul_weights, attention_per_token=attention_per_token)


def show_flops(args):
    n = GPT2_SMALL["n_positions"]   # its whole context
    common.header(2, __doc__, f"n = {n}")
    r = flops_per_token(GPT2_SMALL, seq_len=n)
    expressions = ["6·S·d²·L", "2·S·d²·L", "4·S²·d·L", "16·S·d²·L", "2·S·d·V"]
    common.table([[term, expr, f"{r['formula'][term]:,}", f"{r['counted'][term]:,}",
                   "yes" if r["formula"][term] == r["counted"][term] else "NO",
                   f"{r['formula'][term] / n / 1e6:.1f}", f"{100 * r['shares'][term]:.1f}%"]
                  for term, expr in zip(costs.FLOP_TERMS, expressions)]
                 + [["total", "", f"{r['total']:,}", f"{r['counted_total']:,}",
                     "yes" if r["total"] == r["counted_total"] else "NO",
                     f"{r['per_token'] / 1e6:.1f}", "100%"]],
                 headers=["term", "formula", "formula FLOPs", "counter FLOPs", "equal",
                          "MFLOPs/token", "share"],
                 disable_numparse=True)
    four = sum(r["shares"][term] for term in costs.FLOP_TERMS if term != "W_O")
    common.note("(the counter counts 2 FLOPs per multiply-add and matmuls only; the notes' four "
                f"shares, QKV, attention, FFN and output layer, add up to {100 * four:.1f}%: they "
                f"leave out W_O's {100 * r['shares']['W_O']:.1f}%)")
    rebuilt = 2 * r["matmul_weights"] + r["attention_per_token"]
    common.note(f"2N = 2 × {r['n_params']:,} = {r['two_n'] / 1e6:.1f} MFLOPs/token against "
                f"{r['per_token'] / 1e6:.1f}: one multiply-add per token for each of the "
                f"{r['matmul_weights']:,} weights\na matmul multiplies (N without the position "
                f"table, the biases and the LayerNorms: {2 * r['matmul_weights'] / 1e6:.1f}) plus "
                f"attention's QKᵀ and AV (4·S·d·L: {r['attention_per_token'] / 1e6:.1f}) = "
                f"{rebuilt / 1e6:.1f} ({'equal' if rebuilt == r['per_token'] else 'NOT equal'} to "
                "the total)")
    draw_flops_vs_n(args.figures)


@common.draws_figure
def draw_flops_vs_n(figures_dir, cfg=GPT2_SMALL):
    import matplotlib.pyplot as plt
    ns = 2 ** np.arange(6, 17)
    per_token = np.array([[v / n / 1e6 for v in costs.flop_formula(seq_len=int(n),
                                                             **cfg).values()] for n in ns])
    fig, (ax, ax_share) = plt.subplots(1, 2, figsize=(11, 4))
    colours = ["#4c72b0", "#8172b3", "#c44e52", "#55a868", "#ccb974"]
    ax.stackplot(ns, per_token.T, labels=costs.FLOP_TERMS, colors=colours, alpha=0.9)
    ax_share.stackplot(ns, 100 * (per_token / per_token.sum(1, keepdims=True)).T, colors=colours,
                       alpha=0.9)
    for a in (ax, ax_share):
        a.set_xscale("log", base=2)
        a.set_xlabel("sequence length n")
        a.axvline(6 * cfg["n_embd"], color="black", lw=1, ls="--")
        a.axvline(cfg["n_positions"], color="grey", lw=1, ls=":")
    ax.text(6 * cfg["n_embd"] * 1.1, per_token.sum(1).max() * 0.9, "n = 6d", fontsize=8)
    ax.text(cfg["n_positions"] * 1.1, per_token.sum(1).max() * 0.8, "GPT-2's context", fontsize=8,
            color="grey")
    ax.set_ylabel("MFLOPs per token")
    ax_share.set_ylabel("share of the forward's FLOPs (%)")
    ax_share.set_ylim(0, 100)
    ax.legend(loc="upper left", fontsize=8)
    fig.suptitle("GPT-2 small (d = 768, 12 layers): forward FLOPs per token by term "
                 "(the formula part 2 checks against FlopCounterMode)",
                 fontsize=10)
    common.save_figure(fig, "06_flops_vs_n", figures_dir)


# ---- Part 3 · §8.3 where n² takes over -----------------------------------------------------------
def crossover(models=(("GPT-2 small", 768, 12), ("LLaMA-7B", 4096, 32))) -> list[dict]:
    """n where a layer's attention matmuls (4·n·d per token) equal the rest (24·d² per token), from
    the formula; the counter checks it on one torch_ref layer (meta) at that n (exercise 6)."""
    rows = []
    for name, d, h in models:
        per_token = costs.flop_formula(n_embd=d, seq_len=1)
        # 24d² / 4d
        n_star = (per_token["QKV projections"] + per_token["W_O"] + per_token["FFN"]) // (4 * d)
        with torch.device("meta"):
            layer = torch_ref.TransformerLayer(d, h, bias=False)
        counted = count_flops(layer, n_star)
        rest = counted["QKV projections"] + counted["W_O"] + counted["FFN"]
        rows.append(dict(model=name, d=d, n_star=n_star,
                         attention_per_token=counted["attention (QKᵀ, AV)"] / n_star,
                         rest_per_token=rest / n_star))
    return rows


def llama_attention_share(seq_lens=(2048, 32768, 131072), cfg=LLAMA_7B) -> list[dict]:
    """Attention's share of a LLaMA-7B layer's FLOPs: the notes' 24d² model (FFN 4d, two matrices;
    the counter checks it on a torch_ref layer on meta) and the real SwiGLU FFN (three d × 11008
    matrices)."""
    with torch.device("meta"):
        layer = torch_ref.TransformerLayer(cfg["n_embd"], cfg["n_head"], bias=False)
    rows = []
    for n in seq_lens:
        share = costs.attention_share(costs.flop_formula(n_embd=cfg["n_embd"], seq_len=n))
        rows.append(dict(n=n, share=share,
                         share_counter=costs.attention_share(count_flops(layer, n)),
                         share_swiglu=costs.attention_share(costs.flop_formula(
                             n_embd=cfg["n_embd"], seq_len=n, middle_dim=cfg["middle_dim"],
                             ffn_matrices=3))))
    return rows


def show_crossover(args):
    common.header(3, __doc__)
    llama = llama_attention_share()
    common.table([[r["model"], r["d"], r["n_star"], f"{r['attention_per_token'] / 1e6:.1f}",
                   f"{r['rest_per_token'] / 1e6:.1f}"] for r in crossover()],
                 headers=["model", "d", "n = 6d (tokens)", "attention MFLOPs/token (counter)",
                          "projections + FFN MFLOPs/token (counter)"], disable_numparse=True)
    common.note("(one layer at n = 6d on the meta device; GPT-2 small's row is exercise 6)\n")
    common.table([[r["n"], f"{100 * r['share']:.1f}%", f"{100 * r['share_counter']:.1f}%",
                   f"{100 * r['share_swiglu']:.1f}%"] for r in llama],
                 headers=["LLaMA-7B, n (tokens)", "attention share, 24d² model (formula)",
                          "attention share, 24d² model (counter)",
                          "attention share with SwiGLU 11008 (3 matrices)"], disable_numparse=True)
    shortest = llama[0]
    common.note("(share of one layer's matmul FLOPs, output layer left out; at n = "
                f"{shortest['n']:,} the projections and the FFN still hold "
                f"{100 * (1 - shortest['share']):.1f}%)")


# ---- Part 4 · §8.3 activations saved for backward ------------------------------------------------
def saved_activations(seq_len: int, n_embd: int = 64, n_head: int = 4, p_dropout: float = 0.0,
                      sdpa: bool = False) -> list[torch.Tensor]:
    """The distinct storages one Pre-LN layer (torch_ref, float32, explicit softmax, additive mask,
    in training mode, dropout p_dropout on the attention weights, the attention output and the FFN
    output) saves for backward, found with saved_tensors_hooks; parameters left out. sdpa=True: the
    attention core is torch's scaled_dot_product_attention instead (part 6)."""
    layer = torch_ref.TransformerLayer(n_embd, n_head, p_dropout=p_dropout).float().train()
    if sdpa:
        layer.attention.self_attention = _sdpa_core  # the instance's attribute shadows the method
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        # views of one storage (q, kᵀ of one projection) count once
        if storage.data_ptr() not in params:
            # holding t keeps its storage alive, so no address is reused
            saved[storage.data_ptr()] = t
        return t

    x = torch.randn(1, seq_len, n_embd, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return list(saved.values())


def activation_memory(seq_lens=(16, 32, 64, 128, 256, 512), n_embd: int = 64, n_head: int = 4,
                      p_dropout: float = 0.0) -> dict:
    d, h = n_embd, n_head
    rows = []
    for S in seq_lens:
        saved = saved_activations(S, d, h, p_dropout)
        nbytes = sum(t.untyped_storage().nbytes() for t in saved)
        # floats -> how many
        sizes = Counter(t.untyped_storage().nbytes() // t.element_size() for t in saved)
        rows.append(dict(S=S, bytes=nbytes, floats=nbytes // 4,
                         exact=costs.exact_saved_floats(S, d, h, p_dropout),
                         storages=len(saved), sizes=dict(sizes)))
    A = np.array([[r["S"] * d, h * r["S"] ** 2] for r in rows], dtype=np.float64)
    (a, b), *_ = np.linalg.lstsq(A, np.array([r["floats"] for r in rows], dtype=np.float64),
                                 rcond=None)
    return dict(d=d, h=h, p_dropout=p_dropout, rows=rows, a=float(a), b=float(b),
                crossover=float(a * d / (b * h)))


def activation_examples(a: float = 16, b: float = 1) -> list[dict]:
    """a·S·d + b·h·S² in fp16 for LLaMA-7B's layer (d = 4096, h = 32) at S = 8192 and exercise 10 (S
    = 4096)."""
    d, h, fp16 = LLAMA_7B["n_embd"], LLAMA_7B["n_head"], 2
    return [dict(S=S, one_sd=S * d * fp16, one_hss=h * S * S * fp16, sd_part=a * S * d * fp16,
                 hss_part=b * h * S * S * fp16, crossover=a * d / (b * h)) for S in (8192, 4096)]


def show_activation_memory(args, p_dropout: float = 0.1):
    seq_lens = (16, 32, 64, 128, 256) if args.quick else (16, 32, 64, 128, 256, 512)
    d, h = 64, 4   # a layer small enough to measure in milliseconds
    common.header(4, __doc__, f"(d = {d}, h = {h},", f"dropout {p_dropout:g})")
    r, rd = activation_memory(seq_lens, d, h), activation_memory(seq_lens, d, h, p_dropout)
    common.table([[x["S"], f"{x['bytes']:,}", f"{x['floats']:,}", f"{x['exact']:,}",
                   "yes" if x["floats"] == x["exact"] else "NO", x["storages"], f"{y['floats']:,}",
                   f"{y['exact']:,}",
                   "yes" if y["floats"] == y["exact"] else "NO",
                   y["storages"]] for x, y in zip(r["rows"], rd["rows"])],
                 headers=["S (tokens)", "no dropout: bytes saved", "floats saved",
                          "16·S·d + h·S² + 4·S", "equal", "storages",
                          f"dropout {p_dropout:g}: floats saved", "18·S·d + 3·h·S² + 4·S",
                          "equal (dropout)", "storages (dropout)"],
                 disable_numparse=True)
    print_saved_storages(r, rd, p_dropout)
    print_llama_activations()
    draw_activation_memory(r, args.figures)


def print_saved_storages(r: dict, rd: dict, p_dropout: float):
    """What the storages are at S = 128, what dropout adds, and the fits of both."""
    d, h = r["d"], r["h"]
    x = next(x for x in r["rows"] if x["S"] == 128)  # S·d, 4·S·d, h·S² and S all differ here
    y = next(y for y in rd["rows"] if y["S"] == 128)
    S = x["S"]
    names = {S * d: "S·d", 4 * S * d: "4·S·d", h * S * S: "h·S²", S: "S"}
    common.note("(saved_tensors_hooks, storages deduplicated, parameters left out; training "
                f"mode.) Without dropout, at S = {S} the storages are "
                + ", ".join(f"{n} × {names.get(size, size)}" for size, n
                            in sorted(x["sizes"].items(), reverse=True))
                + ":\nS·d: LN inputs and outputs, q, k, v, the merged heads; 4·S·d: GELU's "
                "input and output; h·S²: the softmax output; S: the LayerNorms' mean and 1/σ")
    extra = Counter(y["sizes"]) - Counter(x["sizes"])
    common.note(f"Dropout {p_dropout:g} adds "
                + ", ".join(f"{n} × {names.get(size, size)}" for size, n
                            in sorted(extra.items(), reverse=True))
                + ": the attention weights' mask and the dropped weights (AV's backward needs "
                "them, softmax's\nbackward still needs its own output), and the masks of the "
                "attention output and of the FFN output (on CPU each mask is a\nfloat32 tensor "
                "that the multiply keeps)")
    for label, fit in (("no dropout", r), (f"dropout {p_dropout:g}", rd)):
        common.note(f"least-squares fit floats ≈ a·S·d + b·h·S², {label}: a = {fit['a']:.4f}, b = "
                    f"{fit['b']:.4f}; the two parts are equal at S = a·d/(b·h) = "
                    f"{fit['crossover']:.1f}")
    big = r["rows"][-1]["S"]
    common.note(f"With dropout the h·S² part is {rd['b'] / r['b']:.0f}× larger, and at S = {big} "
                f"the layer keeps {rd['rows'][-1]['floats'] / r['rows'][-1]['floats']:.2f}× the "
                "memory.\n")


def print_llama_activations():
    """activation_examples: one LLaMA-7B layer's S × d and h × S × S tensors at several S."""
    examples = activation_examples()
    common.table([[e["S"], f"{e['one_sd'] / MIB:.0f} MiB", f"{e['one_hss'] / GIB:.1f} GiB",
                   f"{e['sd_part'] / MIB:.0f} MiB", f"{e['hss_part'] / GIB:.1f} GiB",
                   f"{e['crossover']:.0f}"]
                  for e in examples],
                 headers=["LLaMA-7B layer, fp16, S", "one S × d", "one h × S × S", "16 × S × d",
                          "h × S × S",
                          "equal at S = 16d/h"], disable_numparse=True)
    common.note("(S = 4096 is exercise 10)")


@common.draws_figure
def draw_activation_memory(r: dict, figures_dir):
    import matplotlib.pyplot as plt
    d, h, a, b = r["d"], r["h"], r["a"], r["b"]
    S = np.array([x["S"] for x in r["rows"]])
    grid = np.geomspace(S.min(), S.max() * 1.1, 100)
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    ax.plot(S, [x["bytes"] / 1024 for x in r["rows"]], "o", color="black",
            label="measured (saved_tensors_hooks)")
    ax.plot(grid, 4 * (a * grid * d + b * h * grid ** 2) / 1024, color="#4c72b0",
            label=f"fit: ({a:.4f}·S·d + {b:.4f}·h·S²) floats × 4 B")
    ax.plot(grid, 4 * a * grid * d / 1024, ls="--", color="#55a868",
            label=f"S·d part: {a:.4f}·S·d floats × 4 B")
    ax.plot(grid, 4 * b * h * grid ** 2 / 1024, ls="--", color="#c44e52",
            label=f"h·S² part (softmax output): {b:.4f}·h·S² floats × 4 B")
    ax.axvline(r["crossover"], color="grey", ls=":", lw=1)
    ax.text(r["crossover"] * 1.05, 4 * a * r["crossover"] * d / 1024 * 0.3,
            f"S = {r['crossover']:.0f}", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length S")
    ax.set_ylabel("KiB saved for backward (1 KiB = 1024 B)")
    ax.set_title(f"One Pre-LN layer, d = {d}, h = {h}: activations saved for backward", fontsize=10)
    ax.legend(fontsize=8)
    common.save_figure(fig, "06_activation_memory", figures_dir)


# ---- Part 5 · §8.3 the attention core's share of a layer's time ⏱ --------------------------------
def attention_time_share(seq_lens=(128, 512, 2048), n_embd: int = 256, n_head: int = 4,
                         p_dropout: float = 0.1,
                         repeats: int = 5, budget: float = 0.5, threads: int = 1,
                         seed: int = 0) -> list[dict]:
    """Wall-clock share of the attention core (scores, scale, mask, softmax, dropout on the weights,
    AV and the merge of the heads: MultiHeadAttention.self_attention) in one Pre-LN layer's forward,
    torch float32, training mode (autograd on, dropout p_dropout), next to its FLOP share.

    The core is timed inside the layer's own forward: a wrapper around self_attention adds up the
    seconds spent in it, so the core sees the inputs, the caches and the dropout of a real forward.
    Per S: the median over up to `repeats` forwards (at least one, fewer once `budget` seconds are
    spent) of the layer's time, the core's time and their ratio. `seed` seeds the weights, the
    inputs and the dropout masks; each S draws its masks from its own seed, so how many forwards fit
    the budget changes no other S's draws.
    """
    rows = []
    with torch_threads(threads):
        torch.manual_seed(seed)   # the weights, the inputs, each S's mask seed
        layer = torch_ref.TransformerLayer(n_embd, n_head, p_dropout=p_dropout).float().train()
        inputs = [torch.randn(1, S, n_embd) for S in seq_lens]
        mask_seeds = torch.randint(2 ** 62, (len(seq_lens),)).tolist()
        mha = layer.attention
        core = mha.self_attention
        in_core = []

        def timed_core(*args, **kwargs):
            with common.stopwatch() as elapsed:
                out = core(*args, **kwargs)
            in_core.append(elapsed())
            return out

        # the instance's attribute shadows the method for this layer only
        mha.self_attention = timed_core
        layer(torch.randn(1, min(seq_lens), n_embd))  # warm-up
        for S, x, mask_seed in zip(seq_lens, inputs, mask_seeds):
            torch.manual_seed(mask_seed)
            t_layer, t_core, checksum = _timed_forwards(layer, x, in_core, repeats, budget)
            shares = [c / t for c, t in zip(t_core, t_layer)]
            flops = costs.flop_formula(n_embd=n_embd, seq_len=S)
            rows.append(dict(S=S, t_layer=statistics.median(t_layer),
                             t_core=statistics.median(t_core),
                             time_share=statistics.median(shares), runs=len(t_layer),
                             core_calls=len(in_core),
                             flop_share=costs.attention_share(flops),
                             training=layer.training, p_dropout=p_dropout, checksum=checksum))
    return rows


def _timed_forwards(layer, x: torch.Tensor, in_core: list, repeats: int, budget: float) -> tuple:
    """(the layer's seconds, the core's seconds) of each of up to `repeats` forwards of layer(x),
    at least one, fewer once `budget` seconds are spent, and the first output's sum (in_core: the
    seconds each call of the timed core adds during one forward)."""
    t_layer, t_core, checksum = [], [], None
    while len(t_layer) < repeats and (not t_layer or sum(t_layer) < budget):
        in_core.clear()
        with common.stopwatch() as elapsed:
            out = layer(x)
        t_layer.append(elapsed())
        t_core.append(sum(in_core))
        if checksum is None:
            checksum = float(out.detach().double().sum())
        del out  # frees the graph (and the activations it holds) before the next forward
    return t_layer, t_core, checksum


def show_attention_time(args):
    seq_lens = (128, 512) if args.quick else (128, 512, 2048)
    d, h, p = 256, 4, 0.1
    common.header(5, __doc__, f"(d = {d}, h = {h},", f"dropout {p:g})")
    rows = attention_time_share(seq_lens, n_embd=d, n_head=h, p_dropout=p, seed=args.seed)
    common.table([[r["S"], f"S/(6d + S) = {100 * r['flop_share']:.1f}%"] for r in rows],
                 headers=["S", "attention core's FLOP share"], disable_numparse=True)
    for r in rows:
        common.timing(f"S = {r['S']:>4}: layer forward {1e3 * r['t_layer']:7.1f} ms, core inside "
                      f"it {1e3 * r['t_core']:7.1f} ms: time share {100 * r['time_share']:4.1f}% "
                      f"(FLOP share {100 * r['flop_share']:.1f}%)")
    common.note("(the ⏱ lines, printed when you run it: the core timed inside each forward of "
                "the layer, the median of up to 5 forwards, beside\nits FLOP share. A FLOP share "
                "counts matmuls only: scale, mask, softmax and dropout make almost no FLOPs but "
                "read and\nwrite the h × S × S matrix several times, which a time share counts)")


# ---- Part 6 · §8.3 continued, beyond the notes: the flash core's memory -------------------
FLASH_PATHS = ("composed", "fused", "fused + flash")


def _sdpa_core(q, kT, v, mask=None):
    """torch_ref's self_attention with torch's fused core: (B, h, S, Dh) ×3 -> (B, S, D).
    The layer's mask is the causal one (no padding here), so is_causal=True: made from positions,
    as kernels.py's flash core makes it (an attn_mask would be saved for backward too)."""
    batch_size, n_head, seq_len, head_dim = q.shape
    out = torch.nn.functional.scaled_dot_product_attention(
        q, kT.transpose(-2, -1), v, is_causal=True)                            # (B, h, S, Dh)
    return out.permute(0, 2, 1, 3).reshape(batch_size, seq_len, n_head * head_dim)  # -> (B, S, D)


def sdpa_core_saved(seq_len: int, n_embd: int = 64, n_head: int = 4) -> list[torch.Tensor]:
    """What torch's scaled_dot_product_attention alone (CPU, float32, causal) saves for backward."""
    shape = (1, n_head, seq_len, n_embd // n_head)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return saved


def tensor_layer_saved(seq_len: int, n_embd: int, n_head: int, path: str, seed: int = 0) -> dict:
    """tensor.py's own accounting for one Pre-LN layer (float64, p_dropout 0): elements saved for
    backward (parameters left out) and the backward's FLOPs."""
    if path not in FLASH_PATHS:
        raise ValueError(f"unknown path {path!r}; choose one of {', '.join(FLASH_PATHS)}")
    transformer.set_seed(seed)
    layer = transformer.TransformerLayer(n_embd, n_head, p_dropout=0.0)
    x = np.random.default_rng(seed).standard_normal((1, seq_len, n_embd))
    inputs = tensor.Tensor(x, requires_grad=True)
    switch = (contextlib.nullcontext() if path == "composed"
              else kernels.fused(flash=path == "fused + flash"))
    with switch:
        out = layer(inputs)
        nbytes = tensor.saved_bytes(out, exclude=layer.parameters())
        with tensor.count_traffic() as backward:
            out.backward(np.ones(out.shape))
    return dict(floats=nbytes // out.data.itemsize, backward_flops=backward.total("flops"))


def flash_memory(seq_lens=(16, 32, 64, 128, 256, 512), n_embd: int = 64, n_head: int = 4) -> dict:
    """Per S: elements one Pre-LN layer saves for backward, composed, fused and with the flash
    core (tensor.py's accounting), and torch's layer with scaled_dot_product_attention as its core
    (saved_tensors_hooks, as part 4); torch's core alone; a fit a·S·d + b·h·S² per path."""
    d, h = n_embd, n_head
    rows = []
    for S in seq_lens:
        row = dict(S=S, **{path: tensor_layer_saved(S, d, h, path) for path in FLASH_PATHS})
        torch_layer = saved_activations(S, d, h, sdpa=True)
        row["torch_sdpa_layer"] = sum(t.untyped_storage().nbytes() for t in torch_layer) // 4
        core = sdpa_core_saved(S, d, h)
        row["torch_sdpa_core"] = sum(t.untyped_storage().nbytes() for t in core) // 4
        row["torch_sdpa_shapes"] = sorted({tuple(t.shape) for t in core}, key=len)
        rows.append(row)
    A = np.array([[r["S"] * d, h * r["S"] ** 2] for r in rows], dtype=np.float64)
    fits = {}
    for key in (*FLASH_PATHS, "torch_sdpa_layer"):
        y = np.array([r[key]["floats"] if key in FLASH_PATHS else r[key] for r in rows],
                     dtype=np.float64)
        (a, b), *_ = np.linalg.lstsq(A, y, rcond=None)
        fits[key] = dict(a=float(a), b=float(b) if abs(b) > 1e-9 else 0.0)  # never "-0.0000"
    return dict(d=d, h=h, rows=rows, fits=fits)


def show_flash_memory(args):
    seq_lens = (16, 32, 64, 128, 256) if args.quick else (16, 32, 64, 128, 256, 512)
    d, h = 64, 4   # part 4's layer
    common.header(6, __doc__, f"(d = {d}, h = {h},")
    r = flash_memory(seq_lens, d, h)
    rows = r["rows"]

    def formulas(S):  # the exact counts, in elements: fused, flash, torch's layer with SDPA
        flash = costs.flash_saved_floats(S, d, h)
        return costs.exact_saved_floats(S, d, h), flash["tensor.py"], flash["torch SDPA"]

    def extra_flops(x):  # the flash backward's recomputation of q kᵀ
        return x["fused + flash"]["backward_flops"] - x["fused"]["backward_flops"]

    common.table([[x["S"], f"{x['composed']['floats']:,}", f"{x['fused']['floats']:,}",
                   f"{formulas(x['S'])[0]:,}", f"{x['fused + flash']['floats']:,}",
                   f"{formulas(x['S'])[1]:,}", f"{x['torch_sdpa_layer']:,}",
                   f"{formulas(x['S'])[2]:,}", f"{extra_flops(x) / 1e6:.2f}"] for x in rows],
                 headers=["S", "composed", "fused", "16·S·d + h·S² + 4·S", "flash",
                          "16·S·d + 2·h·S + 4·S", "torch SDPA layer", "16·S·d + h·S + 4·S",
                          "flash: + bwd MFLOP"],
                 disable_numparse=True)
    exact = all((x["fused"]["floats"], x["fused + flash"]["floats"], x["torch_sdpa_layer"])
                == formulas(x["S"]) for x in rows)
    recompute = all(extra_flops(x) == 2 * x["S"] ** 2 * d for x in rows)
    print_flash_fits(r, exact)
    print_flash_price(r, recompute)
    draw_flash_memory(r, args.figures)


def print_flash_fits(r: dict, exact: bool):
    """Whether every count follows its formula, and each path's fit a·S·d + b·h·S²."""
    d, h, fits = r["d"], r["h"], r["fits"]
    common.note("(elements saved for backward, parameters left out: tensor.py's accounting for "
                "its float64 layer, saved_tensors_hooks\nfor torch's float32 one. Every formula "
                f"{'holds exactly' if exact else 'does NOT hold'}: the fused layer saves what part "
                "4's torch layer does;\nwith a flash core, tensor.py's or torch's, no h × S × S "
                "matrix is kept.)")
    labels = {"composed": "composed", "fused": "fused", "fused + flash": "fused + flash",
              "torch_sdpa_layer": "torch, SDPA core"}
    for key, label in labels.items():
        fit = fits[key]
        where = (f"the two parts are equal at S = a·d/(b·h) = {fit['a'] * d / (fit['b'] * h):.1f}"
                 if fit["b"] > 1e-6 else "no h·S² part, so no crossover")
        common.note(f"fit floats ≈ a·S·d + b·h·S², {label:16}: a = {fit['a']:.4f}, "
                    f"b = {fit['b']:.4f}; {where}")


def print_flash_price(r: dict, recompute: bool):
    """What torch's SDPA and kernels.py's flash core keep, what the flash backward pays, and what it
    saves at LLaMA-7B's size."""
    d, h, x = r["d"], r["h"], r["rows"][-1]
    shapes = " and ".join(str(s) for s in x["torch_sdpa_shapes"])
    common.note(f"torch's scaled_dot_product_attention alone (CPU, float32, causal) saves "
                f"{x['torch_sdpa_core']:,} floats at S = {x['S']}\n= 4·S·d + h·S = "
                f"{4 * x['S'] * d + h * x['S']:,} (q, k, v, the output, the logsumexp; shapes "
                f"{shapes}).\nkernels.py's flash core keeps the logsumexp as its two parts, max "
                f"and log-sum (2·h·S), so that a fully masked row\n(max ≈ -1e9) keeps full "
                f"precision.")
    common.note(f"The price: the flash backward recomputes q kᵀ block by block, 2·S²·d more FLOPs "
                f"({'as counted' if recompute else 'NOT as counted'} above),\nand it cannot drop "
                f"attention weights (they never exist).")
    llama_d, llama_h, S = LLAMA_7B["n_embd"], LLAMA_7B["n_head"], 8192
    common.note(f"LLaMA-7B's layer at S = {S}, fp16: the h × S × S matrix "
                f"({llama_h * S * S * 2 / GIB:.1f} GiB) gives way to a float32 logsumexp\nof "
                f"{llama_h * S * 4 / MIB:.0f} MiB, beside 16 × S × d = "
                f"{16 * S * llama_d * 2 / MIB:,.0f} MiB: part 4's crossover at S = 16d/h is gone.")


@common.draws_figure
def draw_flash_memory(r: dict, figures_dir):
    import matplotlib.pyplot as plt
    d, h = r["d"], r["h"]
    S = np.array([x["S"] for x in r["rows"]])
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    styles = {"composed": ("#c44e52", "o"), "fused": ("#4c72b0", "s"),
              "fused + flash": ("#55a868", "^")}
    for path, (colour, marker) in styles.items():
        ax.plot(S, [x[path]["floats"] for x in r["rows"]], marker=marker, color=colour,
                label=f"tensor.py, {path}")
    ax.plot(S, [x["torch_sdpa_layer"] for x in r["rows"]], ls="--", color="black",
            label="torch, SDPA core (saved_tensors_hooks)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length S")
    ax.set_ylabel("elements saved for backward")
    ax.set_title(f"One Pre-LN layer, d = {d}, h = {h}: the flash core removes the h·S² term",
                 fontsize=10)
    ax.legend(fontsize=8)
    common.save_figure(fig, "06_flash_memory", figures_dir)


# ---- Part 7 · §8.3 and §13: Korthikanti et al.'s per-layer formula beside the measurement --------
def korthikanti_comparison(seq_len: int = 128, n_embd: int = 64, n_head: int = 4,
                           p_dropout: float = 0.1) -> dict:
    """The formula term by term at (s, b, h, a) = (S, 1, d, heads), beside part 4's layer measured
    in float32 and cast to bfloat16 (16-bit, as the paper's), and tensor.py's own float64 layer
    (fused primitives, its dropout) in total."""
    S, d, h = seq_len, n_embd, n_head
    measured = {dtype: costs.saved_by_term(S, d, h, p_dropout, dtype)
                for dtype in (torch.float32, torch.bfloat16)}
    transformer.set_seed(0)
    ours = transformer.TransformerLayer(d, h, p_dropout=p_dropout)
    x = tensor.Tensor(np.random.default_rng(0).standard_normal((1, S, d)), requires_grad=True)
    with kernels.fused():
        tensor_py = tensor.saved_bytes(ours(x), exclude=ours.parameters())
    return dict(S=S, b=1, d=d, h=h, p_dropout=p_dropout,
                terms=costs.korthikanti_terms(S, 1, d, h),
                formula=costs.korthikanti_bytes(S, 1, d, h), float32=measured[torch.float32],
                bfloat16=measured[torch.bfloat16], tensor_py=tensor_py)


def show_korthikanti(args):
    common.header(7, __doc__)
    r = korthikanti_comparison()
    S, b, d, h = r["S"], r["b"], r["d"], r["h"]
    common.note(f"Their s·b·h·(34 + 5·a·s/h) bytes (16-bit activations, 1-byte dropout masks; "
                f"their h is our d, their a our h) at part 4's layer:\ns = {S}, b = {b}, h = d "
                f"= {d}, a = {h} heads, dropout {r['p_dropout']:g}, training mode. Measured: the "
                f"storages kept for backward (saved_tensors_hooks), each named\nby the module "
                f"whose input or output it is, or by the autograd node that keeps it (a "
                f"dropout's mask, a LayerNorm's statistics).")
    f32, bf16 = r["float32"]["by_term"], r["bfloat16"]["by_term"]
    rows = []
    for t in r["terms"]:
        mine, half = f32.get(t["term"], [0, 0]), bf16.get(t["term"], [0, 0])
        rows.append([t["block"], t["term"], f"{t['per_unit']}·{t['unit']}", f"{t['elements']:,}",
                     f"{t['their_bytes']:,}", f"{mine[0]:,}", f"{mine[1]:,}", f"{half[1]:,}",
                     f"{mine[1] / t['their_bytes']:.0f}×"])
    stats = f32.get(costs.LAYER_NORM_STATISTICS, [0, 0])
    stats_half = bf16.get(costs.LAYER_NORM_STATISTICS, [0, 0])
    rows.append(["(not counted)", costs.LAYER_NORM_STATISTICS, "", "0", "0", f"{stats[0]:,}",
                 f"{stats[1]:,}", f"{stats_half[1]:,}", ""])
    common.table(rows, headers=["block", "kept for backward", "elements (formula)", "elements",
                                "their bytes", "measured elements", "float32 bytes",
                                "bfloat16 bytes", "float32 / theirs"],
                 disable_numparse=True)
    print()
    print_korthikanti_blocks(r)


def print_korthikanti_blocks(r: dict):
    """Each block's bytes by the formula against the measurement, the totals in three precisions,
    and what accounts for every difference."""
    S, b = r["S"], r["b"]
    f32, bf16 = r["float32"]["by_term"], r["bfloat16"]["by_term"]
    rows = []
    for block, expression in costs.KORTHIKANTI_BLOCKS.items():
        terms = [t["term"] for t in r["terms"] if t["block"] == block]
        theirs = sum(t["their_bytes"] for t in r["terms"] if t["block"] == block)
        mine = sum(f32.get(term, [0, 0])[1] for term in terms)
        half = sum(bf16.get(term, [0, 0])[1] for term in terms)
        rows.append([block, expression, f"{theirs:,}", f"{mine:,}", f"{half:,}",
                     f"{mine / theirs:.2f}"])
    stats = {key: r[key]["by_term"].get(costs.LAYER_NORM_STATISTICS, [0, 0])[1]
             for key in ("float32", "bfloat16")}
    rows.append(["(not counted)", costs.LAYER_NORM_STATISTICS, "0", f"{stats['float32']:,}",
                 f"{stats['bfloat16']:,}", ""])
    total = {key: sum(v[1] for v in r[key]["by_term"].values()) for key in ("float32", "bfloat16")}
    rows.append(["layer", "s·b·h·(34 + 5·a·s/h)", f"{r['formula']:,}", f"{total['float32']:,}",
                 f"{total['bfloat16']:,}", f"{total['float32'] / r['formula']:.2f}"])
    common.table(rows, headers=["block", "their formula", "their bytes", "float32 bytes",
                                "bfloat16 bytes", "float32 / theirs"], disable_numparse=True)
    elements = {t["term"]: t["elements"] for t in r["terms"]}
    same = all(f32.get(term, [0])[0] == n == bf16.get(term, [0])[0]
               for term, n in elements.items())
    unnamed = r["float32"]["unnamed"] + r["bfloat16"]["unnamed"]
    masks = sum(t["elements"] for t in r["terms"] if t["their_bytes_per_element"] == 1)
    stats = f32.get(costs.LAYER_NORM_STATISTICS, [0, 0])[0]
    common.note(f"Every tensor the formula counts, torch's autograd keeps, element for element "
                f"({'at every term' if same else 'NOT at every term'}; "
                + ("no storage left unnamed" if not unnamed else f"unnamed: {unnamed}")
                + f"), and one more: the LayerNorms' mean and 1/σ,\n{stats:,} elements = "
                f"4·s·b{'' if stats == 4 * S * b else ' NOT'} (a number per token each, "
                f"which the paper leaves out). Apart from those {stats:,}, the bytes differ by "
                f"precision only: float32 keeps 4 bytes\nwhere they count 2 (2×), and each "
                f"dropout mask in the activations' dtype: on CPU torch's dropout multiplies by a "
                f"mask of its input's\ndtype (4 bytes, 4× their 1-byte mask). Their 1 byte is a "
                f"bool mask, what torch's fused dropout keeps on a GPU (its source,\n"
                f"aten/src/ATen/native/Dropout.cpp, sends CUDA tensors to native_dropout; not "
                f"measured here).")
    half_extra = total["bfloat16"] - r["formula"]
    accounted = "equal" if half_extra == masks + 2 * stats else "NOT equal"
    common.note(f"In bfloat16 the layer keeps {total['bfloat16']:,} bytes, {half_extra:,} more "
                f"than theirs: {masks:,} mask elements × 1 byte (2 bytes each, not 1) + {stats:,} "
                f"statistics × 2 bytes ({accounted}).")
    kept = sum(elements.values()) + stats
    common.note(f"tensor.py's own layer (fused primitives, its dropout {r['p_dropout']:g}) keeps "
                f"the same {kept:,} elements in float64, 8 bytes each: {r['tensor_py']:,} bytes "
                f"({'equal' if r['tensor_py'] == 8 * kept else 'NOT equal'}), "
                f"{r['tensor_py'] / r['formula']:.2f}× theirs.")


PARTS = {1: show_parameters, 2: show_flops, 3: show_crossover, 4: show_activation_memory,
         5: show_attention_time, 6: show_flash_memory, 7: show_korthikanti}

if __name__ == "__main__":
    common.main(__doc__, PARTS)
