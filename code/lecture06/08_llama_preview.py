"""Script 08 · §14's preview: from the notes' GPT to a LLaMA-style decoder, one change at a time.

Part 1 · §14 RMSNorm against LayerNorm: the reductions a row needs
Part 2 · §14 SwiGLU against GELU at equal parameters
Part 3 · §14 RoPE: relative by construction, no table, length extrapolation
Part 4 · §14 Grouped-query attention: the KV cache, and converting a trained model
Part 5 · §14 The ladder: GPT -> +RMSNorm -> +SwiGLU -> +RoPE -> +GQA

Beyond the notes' seven scripts: §14 promises that lecture 7 turns the small GPT into LLaMA's
structure item by item (Pre-RMSNorm, SwiGLU, RoPE, GQA). Each part measures one change with
llama.py's modules (tensor.py primitives; llama_ref.py is the float64 torch twin). Parts 3-5 train
city-language models (city_llama.py) at --seeds seeds (default 5) and count each claim over them.

    python code/lecture06/08_llama_preview.py [--part N] [--seed S] [--seeds N] [--quick]
"""
from __future__ import annotations

import sys

try:   # first: one BLAS thread before numpy loads
    from lecture06 import common
except ModuleNotFoundError as missing:   # the course's package is not installed in this Python
    sys.exit(f"{missing} in {sys.executable}: run `make venv`, then .venv/bin/python {sys.argv[0]}")

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from lecture06 import city_lab, city_llama, llama, llama_ref
from lecture05 import tensor
from lecture06 import torch_ref, transformer
from lecture06.city_lab import N_TEST, SEQ_LEN
from lecture05.tensor import Tensor, no_grad

# The city model's width and heads (city_train.build_model's defaults, 05's CITY_MODEL)
CITY_WIDTH = dict(n_embd=64, n_head=4)


# ---- Part 1 · §14, RMSNorm -----------------------------------------------------------------------
# Each norm as tensor.py builds it (transformer.py, llama.py) and as its torch twin
NORMS = {"LayerNorm": (transformer.LayerNorm, torch_ref.LayerNorm),
         "RMSNorm": (llama.RMSNorm, llama_ref.RMSNorm)}
# Dispatched ops that are not the norm's kernels: autograd's bookkeeping, stride changes, and the
# ones_like that seeds a backward from a sum
NOT_KERNELS = {"detach", "view", "expand", "_unsafe_view", "alias", "t", "ones_like"}


def norm_modules(norm: str) -> tuple:
    llama.check_choice("08 part 1", "norm", norm, tuple(NORMS))
    return NORMS[norm]


def reduction_kind(reduced_shape: tuple, full_shape: tuple) -> str | None:
    """"row" where a (..., 1) result sums (..., d) rows, "rows" where a smaller result sums over
    the rows (a parameter's gradient), None where nothing is summed."""
    if int(np.prod(reduced_shape)) >= int(np.prod(full_shape)):
        return None
    if len(reduced_shape) == len(full_shape) and reduced_shape[-1] == 1 < full_shape[-1]:
        return "row"
    return "rows"


def tensor_norm_reductions(norm: str, n_rows: int, dim: int, seed: int = 0) -> dict:
    """One forward and backward of tensor.py's norm over (n_rows, dim) rows. Forward: the
    primitives (count_ops) and the reductions among them. Backward: the closures run
    (count_traffic) and the reductions among them, read from the graph: a primitive that broadcast
    an input of fewer elements sums the gradient back to it (tensor.py's _unbroadcast)."""
    x = Tensor(np.random.default_rng(seed).standard_normal((1, n_rows, dim)), requires_grad=True)
    module = norm_modules(norm)[0](dim)
    with tensor.count_ops() as forward:
        y = module(x)
    backward = {"row": 0, "rows": 0}
    for node in tensor.graph(y, only_grad=True):
        for parent in node._parents:
            kind = reduction_kind(parent.shape, node.shape) if parent.requires_grad else None
            if kind is not None:
                backward[kind] += 1
    with tensor.count_traffic() as traffic:
        y.backward(np.ones(y.shape))
    return dict(forward_ops=sum(forward.values()), forward_row=forward["sum"] + forward["max"],
                backward_ops=traffic.total("launches", "backward"),
                backward_row=backward["row"], backward_rows=backward["rows"])


class KernelLog(TorchDispatchMode):
    """Every ATen op dispatched inside the block, but NOT_KERNELS: (name, input shapes, output
    shapes), forward and backward alike (autograd's backward dispatches its ops too)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in NOT_KERNELS:
            shapes = [[tuple(t.shape) for t in tree_leaves(tree) if isinstance(t, torch.Tensor)]
                      for tree in ((args, kwargs), out)]
            self.ops.append((name, *shapes))
        return out


def kernel_reductions(ops: list) -> dict:
    """The kernels named in order, and how many of their results sum a row or over rows."""
    counts = {"row": 0, "rows": 0}
    for _, inputs, outputs in ops:
        largest = max(inputs, key=lambda shape: int(np.prod(shape)))
        for shape in outputs:
            kind = reduction_kind(shape, largest)
            if kind is not None:
                counts[kind] += 1
    return dict(kernels=[name for name, _, _ in ops], **counts)


def torch_norm_reductions(norm: str, n_rows: int, dim: int, seed: int = 0) -> dict:
    """The torch twin's kernels forward and backward, seen by a dispatch-mode counter."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(1, n_rows, dim, dtype=torch.float64, generator=generator, requires_grad=True)
    module = norm_modules(norm)[1](dim)
    with KernelLog() as forward:
        y = module(x)
    # from a sum, whose backward only expands: torch's backward(gradient) imports sympy (3 s)
    total = y.sum()
    with KernelLog() as backward:
        total.backward()
    return dict(forward=kernel_reductions(forward.ops), backward=kernel_reductions(backward.ops))


def norm_times(n_rows: int, dim: int, repeats: int, budget: float, seed: int = 0) -> dict:
    """(wall, CPU) median seconds of one forward and backward, tensor.py's and torch's."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, n_rows, dim))
    times = {}
    for norm, (ours, twin) in NORMS.items():
        module, torch_module = ours(dim), twin(dim)

        def ours_once():
            module(Tensor(x, requires_grad=True)).sum().backward()

        def torch_once():
            torch_module(torch.tensor(x, requires_grad=True)).sum().backward()
        times[norm] = dict(tensor_py=common.median_time(ours_once, repeats, 1, budget),
                           torch=common.median_time(torch_once, repeats, 1, budget))
    return times


def show_norm_reductions(args):
    common.header(1, __doc__)
    n_rows, dim = 6, CITY_WIDTH["n_embd"]
    ours = {norm: tensor_norm_reductions(norm, n_rows, dim, args.seed) for norm in NORMS}
    common.note(f"tensor.py, {n_rows} rows of d = {dim}: primitives by count_ops (forward) and "
                "count_traffic (backward); a reduction sums a row to one number, a parameter's "
                "gradient sums over the rows")
    common.table([[norm, r["forward_ops"], r["forward_row"], r["backward_ops"], r["backward_row"],
                   r["backward_rows"]] for norm, r in ours.items()],
                 headers=["norm", "forward: primitives", "row reductions",
                          "backward: closures", "row reductions", "sums over rows (parameters)"])
    print()
    twins = {norm: torch_norm_reductions(norm, n_rows, dim, args.seed) for norm in NORMS}
    common.note("the torch twins, every ATen kernel dispatched (a TorchDispatchMode counter):")
    for norm, r in twins.items():
        for direction in ("forward", "backward"):
            k = r[direction]
            count = len(k["kernels"])
            common.note(f"  {norm:9} {direction:8} {count:2} kernel{'s' * (count != 1)}, row "
                        f"reductions {k['row']}, sums over rows {k['rows']}: "
                        f"{' '.join(k['kernels'])}")
    fused = [len(twins["LayerNorm"][way]["kernels"]) for way in ("forward", "backward")]
    if fused == [1, 1]:
        common.note("torch's LayerNorm is one fused kernel each way: forward, its two row "
                    "statistics (mean, 1/σ) come out of native_layer_norm; backward, "
                    "native_layer_norm_backward sums each row inside, where no counter sees it "
                    "(tensor.py's graph shows the two)")
    layer, rms = ours["LayerNorm"], ours["RMSNorm"]
    common.note(f"a row is reduced {layer['forward_row']} times forward and "
                f"{layer['backward_row']} backward under LayerNorm, {rms['forward_row']} and "
                f"{rms['backward_row']} under RMSNorm (notes: 'RMSNorm 少一次归约', one reduction "
                "fewer)")
    show_norm_times(args, n_rows=32 * 16, dim=dim, twins=twins)


def show_norm_times(args, n_rows: int, dim: int, twins: dict):
    times = norm_times(n_rows, dim, repeats=5 if args.quick else 50, budget=0.5, seed=args.seed)
    for engine in ("tensor_py", "torch"):
        layer, rms = (times[norm][engine][1] for norm in NORMS)
        common.timing(f"{engine.replace('_', '.'):9} forward + backward over ({n_rows}, {dim}), "
                      f"CPU time: LayerNorm {1e6 * layer:.0f} µs, RMSNorm {1e6 * rms:.0f} µs, "
                      f"RMSNorm/LayerNorm {rms / layer:.2f} (Zhang & Sennrich: 0.36-0.93, "
                      "7-64% less time)")
    kernels = {norm: [len(r[way]["kernels"]) for way in ("forward", "backward")]
               for norm, r in twins.items()}
    common.timing(f"(torch's RMSNorm twin is composed, {kernels['RMSNorm'][0]} kernels forward and "
                  f"{kernels['RMSNorm'][1]} backward; its LayerNorm {kernels['LayerNorm'][0]} "
                  f"forward and {kernels['LayerNorm'][1]} backward)")


# ---- Part 2 · §14, SwiGLU ------------------------------------------------------------------------
# Published configurations (each model's params.json / config.json): width, LLaMA's
# ffn_dim_multiplier and multiple_of, and the hidden size its checkpoint has, to check the rule by.
# The city model's SwiGLU takes the rule unrounded (llama.SwiGLU's default).
FFN_CONFIGS = {"city model": dict(n_embd=CITY_WIDTH["n_embd"], ffn_dim_multiplier=None,
                                  multiple_of=1, published=None),
               "LLaMA-7B": dict(n_embd=4096, ffn_dim_multiplier=None, multiple_of=256,
                                published=11008),
               "LLaMA-2-70B": dict(n_embd=8192, ffn_dim_multiplier=1.3, multiple_of=4096,
                                   published=28672),
               "LLaMA-3-8B": dict(n_embd=4096, ffn_dim_multiplier=1.3, multiple_of=1024,
                                  published=14336)}


def swiglu_sizes(configs: dict) -> list[dict]:
    """Per configuration: the hidden size by LLaMA's rule; SwiGLU's 3·d·h parameters against
    GELU's 8d²; FLOPs per token of the FFN's matrices, term by term (2 per multiply-add)."""
    rows = []
    for name, c in configs.items():
        d = c["n_embd"]
        hidden = llama.swiglu_hidden_dim(d, c["multiple_of"], c["ffn_dim_multiplier"])
        swiglu, gelu = llama.swiglu_parameter_count(d, hidden)
        flops = dict(gelu_in=2 * d * 4 * d, gelu_out=2 * 4 * d * d, gate=2 * d * hidden,
                     up=2 * d * hidden, down=2 * hidden * d)
        rows.append(dict(c, name=name, two_thirds=2 * 4 * d // 3, hidden=hidden, swiglu=swiglu,
                         gelu=gelu, flops=flops))
    return rows


def counted_ffn_flops(n_embd: int, hidden: int, seq_len: int, seed: int = 0) -> dict:
    """Matmul FLOPs per token of tensor.py's GELU FFN (bias-free, 4d) and SwiGLU (hidden), as
    tensor.py's traffic counter counts them over one forward of seq_len tokens."""
    transformer.set_seed(seed)
    x = Tensor(np.random.default_rng(seed).standard_normal((1, seq_len, n_embd)))
    counted = {}
    for name, module in (("GELU", transformer.FeedForward(n_embd, bias=False)),
                         ("SwiGLU", llama.SwiGLU(n_embd, hidden))):
        with no_grad(), tensor.count_traffic() as traffic:
            module.eval()(x)
        counted[name] = traffic.total("flops", "forward") // seq_len
    return counted


def show_swiglu_sizes(args):
    common.header(2, __doc__)
    rows = swiglu_sizes(FFN_CONFIGS)
    common.note("hidden size h = 2/3 · 4d, × ffn_dim_multiplier if set, rounded up to a multiple "
                "(LLaMA's model.py); parameters of the FFN's matrices (no biases)")
    common.table([[r["name"], r["n_embd"], r["ffn_dim_multiplier"] or "", r["multiple_of"],
                   r["two_thirds"], f"{r['hidden']:,}",
                   "" if r["published"] is None else f"{r['published']:,}",
                   f"{r['swiglu']:,}", f"{r['gelu']:,}", f"{r['swiglu'] / r['gelu']:.4f}"]
                  for r in rows],
                 headers=["model", "d", "multiplier", "multiple of", "⌊2/3·4d⌋", "h by the rule",
                          "h published", "SwiGLU 3dh", "GELU 8d²", "ratio"],
                 disable_numparse=True)
    print_ffn_flops(rows, seed=args.seed)


def print_ffn_flops(rows: list, seed: int):
    terms = [("GELU up", "2·d·4d", ["gelu_in"]), ("GELU down", "2·4d·d", ["gelu_out"]),
             ("GELU total", "16d²", ["gelu_in", "gelu_out"]),
             ("SwiGLU gate", "2·d·h", ["gate"]), ("SwiGLU up", "2·d·h", ["up"]),
             ("SwiGLU down", "2·h·d", ["down"]), ("SwiGLU total", "6dh", ["gate", "up", "down"])]
    print()
    common.note("FLOPs per token of the FFN's matrices, by formula (2 per multiply-add; the "
                "elementwise GELU, SiLU and product are left out, as the notes count)")
    total = {name: {r["name"]: sum(r["flops"][k] for k in keys) for r in rows}
             for name, _, keys in terms}
    common.table([[name, formula] + [f"{total[name][r['name']]:,}" for r in rows]
                  for name, formula, _ in terms]
                 + [["SwiGLU / GELU", "6dh / 16d² = 3h/8d"]
                    + [f"{total['SwiGLU total'][r['name']] / total['GELU total'][r['name']]:.4f}"
                       for r in rows]],
                 headers=["term", "formula"] + [r["name"] for r in rows], disable_numparse=True)
    city = rows[0]
    counted = counted_ffn_flops(city["n_embd"], city["hidden"], seq_len=4, seed=seed)
    agree = all(counted[ffn] == total[f"{ffn} total"][city["name"]] for ffn in counted)
    common.note(f"counted by tensor.py's traffic counter at the city model (a forward of 4 "
                f"tokens): GELU {counted['GELU']:,}, SwiGLU {counted['SwiGLU']:,} per token, "
                f"{'equal to' if agree else 'NOT equal to'} the formula; per token the FLOPs are "
                "2 × the matrices' parameters, so at equal parameters SwiGLU costs what GELU costs")


# ---- The city runs parts 3, 4 and 5 train (city_llama.py) ----------------------------------------
# one layer, so that 30 runs fit the script's budget (DEVELOPING.md); --quick: a few steps of a toy
CITY_MODEL, QUICK_MODEL = dict(n_layers=1, **CITY_WIDTH), dict(n_layers=1, n_embd=16, n_head=4)
STEPS, QUICK_STEPS, LR, BATCH = 160, 8, 3e-3, 8
GQA_KV_HEADS, CONVERT_TO = 2, (4, 2, 1)   # the +GQA rung's; what the +RoPE rung is pooled to
UPTRAIN_FRACTION = 0.1   # of the base run's steps (Ainslie et al. uptrain 5%), at its peak lr
LONGER = (2, 4)                           # the lengths scored, in trained window lengths


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
    results = iter(city_llama.run_many(runs))
    return {name: [next(results) for _ in plan[name]] for name in names}


def ahead(*names):
    """common.main's train_ahead entry for a part that asks for these runs."""
    return lambda args: city_llama.planned([run for name in names
                                            for run in trained_runs(args)[name]])


def setup_line(args) -> str:
    first = trained_runs(args)["GPT"][0]
    size, training = first["model"], first["training"]
    seeds = common.seeds_of(args)
    layers = size["n_layers"]
    return (f"{layers} layer{'s' * (layers > 1)}, d = {size['n_embd']}, {size['n_head']} heads; "
            f"Adam, {training['steps']} steps of {training['batch_size']} windows × {SEQ_LEN}, lr "
            f"{training['lr']:g} decaying linearly to 0;\nseed{'s' * (len(seeds) > 1)} "
            f"{seeds[0]}{f'..{seeds[-1]}' if len(seeds) > 1 else ''} (a seed draws the weights "
            "and the batches)")


def spread(values) -> str:
    """The median of a row of seeds, and their range when there are several."""
    if len(values) == 1:
        return f"{values[0]:.0f}"
    return f"{np.median(values):.0f} ({min(values):.0f}–{max(values):.0f})"


# ---- Part 3 · §14, RoPE --------------------------------------------------------------------------
def show_rope(args):
    common.header(3, __doc__)
    show_rope_relative(args)
    show_extrapolation(args)


# Position tables a model with learned positions stores: (n_positions, d), at each model's context
# length and width (GPT-2's config.json, LLaMA's papers)
POSITION_TABLES = {"GPT-2 small": (1024, 768), "LLaMA-7B": (2048, 4096),
                   "LLaMA-2-70B": (4096, 8192), "LLaMA-3-8B": (8192, 4096)}


def position_table_bytes(tables: dict) -> list[dict]:
    """The bytes of each learned position table, (n_positions, d), in float32 and float16."""
    return [dict(name=name, n_positions=n_positions, n_embd=d, float32=n_positions * d * 4,
                 float16=n_positions * d * 2) for name, (n_positions, d) in tables.items()]


def turned(vector: np.ndarray, n_positions: int, layout: str = "rotate_half") -> np.ndarray:
    """(n_positions, Dh): the one vector turned by RoPE at each position 0, ..., n_positions - 1."""
    # (Dh,) -> (1, S, 1, Dh): the vector at every position, one head
    rows = Tensor(np.broadcast_to(vector, (1, n_positions, 1, vector.shape[-1])).copy())
    # (1, S, 1, Dh) -> (S, Dh)
    return llama.apply_rope(rows, np.arange(n_positions), layout).numpy().reshape(n_positions, -1)


def spread_by_offset(scores: np.ndarray) -> dict:
    """{m − n: max − min of scores[m, n] over the pairs at that offset}, offsets with ≥ 2 pairs."""
    size = scores.shape[0]
    return {offset: np.ptp(np.diagonal(scores, -offset))
            for offset in range(-(size - 2), size - 1)}


def rope_relative(head_dim: int, n_positions: int, seed: int = 0) -> dict:
    """The score of a query q at m and a key k at n, for every (m, n): with RoPE, q turned by m
    against k turned by n; with sinusoidal positions added (notes §4.2), (q + PE(m))·(k + PE(n)).
    RoPE's depends on m − n alone: its spread over the pairs of one offset is rounding."""
    q, k = np.random.default_rng(seed).standard_normal((2, head_dim))
    rope = turned(q, n_positions) @ turned(k, n_positions).T              # (S, S): [m, n]
    table = transformer.sinusoidal_positions(n_positions, head_dim)
    additive = (q + table) @ (k + table).T                                 # (S, S): [m, n]
    spreads = {name: spread_by_offset(scores) for name, scores
               in (("rope", rope), ("additive", additive))}
    return dict(rope=rope, additive=additive, spreads=spreads,
                largest={name: max(s.values()) for name, s in spreads.items()},
                score_scale=float(np.abs(rope).max()))


def layout_permutation(n_embd: int, n_head: int, seq_len: int, seed: int = 0) -> dict:
    """A q and k projection trained in the interleaved layout (random weights stand in), run in
    the rotate-half layout with and without llama.interleaved_to_rotate_half's column order: the
    largest difference of the attention scores (every head, every (m, n)), and of the scores at
    m = n, where no turn is left between query and key."""
    head_dim = n_embd // n_head
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, seq_len, n_embd))
    weights = rng.standard_normal((2, n_embd, n_embd)) / np.sqrt(n_embd)
    order = llama.interleaved_to_rotate_half(n_head, head_dim)

    def scores(columns, layout: str) -> np.ndarray:
        # (1, S, D) @ (D, D) -> (1, S, h, Dh): q and k, one head per group of Dh columns
        q, k = (llama.apply_rope(Tensor(x @ w[:, columns]).view(1, seq_len, n_head, head_dim),
                                 np.arange(seq_len), layout).numpy()[0] for w in weights)
        # (S, h, Dh) · (S, h, Dh) -> (h, S_q, S_k)
        return np.einsum("mhd,nhd->hmn", q, k)

    interleaved = scores(np.arange(n_embd), "interleaved")
    converted, unconverted = (scores(columns, "rotate_half")
                              for columns in (order, np.arange(n_embd)))
    same_position = np.arange(seq_len)
    return dict(converted=np.abs(converted - interleaved).max(),
                unconverted=np.abs(unconverted - interleaved).max(),
                unconverted_diagonal=np.abs(unconverted - interleaved)[:, same_position,
                                                                       same_position].max(),
                score_scale=np.abs(interleaved).max())


def show_rope_relative(args):
    head_dim = CITY_WIDTH["n_embd"] // CITY_WIDTH["n_head"]
    n_positions = 64
    r = rope_relative(head_dim, n_positions, seed=args.seed)
    common.note(f"a random query q and key k (Dh = {head_dim}) at positions m, n < {n_positions}: "
                "the score's spread (max − min) over the pairs with the same m − n, largest over "
                "m − n")
    common.table([["RoPE: q turned by m · k turned by n",
                   common.at_most(r["largest"]["rope"], 1e-12)],
                  ["sinusoidal added: (q + PE(m)) · (k + PE(n))",
                   f"{r['largest']['additive']:.3f}"]],
                 headers=["score", "largest spread at one m − n"], disable_numparse=True)
    common.note(f"(scores up to {r['score_scale']:.2f}): RoPE's depends on m − n only, to "
                "rounding; the added table's on m and n each")
    draw_rope_relative(r, args.figures)
    print()
    common.note("the position table RoPE does not need: a learned one holds n_positions × d "
                "numbers (GPT-2's own; at LLaMA's context lengths and widths, what one would hold)")
    common.table([[t["name"], f"{t['n_positions']:,} × {t['n_embd']:,}", f"{t['float32']:,}",
                   f"{t['float16']:,}", f"{t['float32'] / 2 ** 20:.1f} MiB"]
                  for t in position_table_bytes(POSITION_TABLES)],
                 headers=["model", "n_positions × d", "bytes, float32", "bytes, float16",
                          "float32"], disable_numparse=True)
    common.note("RoPE stores no table: each position's cos and sin come from Dh/2 frequencies "
                "when the position is met, so no table's length limits it (how well it scores past "
                "the trained length: below)")
    p = layout_permutation(CITY_WIDTH["n_embd"], CITY_WIDTH["n_head"], 16, seed=args.seed)
    print()
    common.note(f"RoPE's two layouts (a model trained interleaved, run rotate-half; scores up to "
                f"{p['score_scale']:.1f}), the largest score difference:")
    common.table([["columns permuted (interleaved_to_rotate_half)", "every (m, n)",
                   common.at_most(p["converted"], 1e-12)],
                  ["not permuted", "every (m, n)", f"{p['unconverted']:.2f}"],
                  ["not permuted", "m = n only", common.at_most(p["unconverted_diagonal"], 1e-12)]],
                 headers=["q, k projections", "scores", "largest difference"],
                 disable_numparse=True)
    common.note("unpermuted, a query still scores its own position right (the turns cancel): the "
                "attention is wrong from the second position on")


@common.draws_figure
def draw_rope_relative(r: dict, figures_dir):
    import matplotlib.pyplot as plt
    size = r["rope"].shape[0]
    m, n = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, key, title in ((axes[0], "rope", "RoPE: q turned by m · k turned by n"),
                           (axes[1], "additive", "sinusoidal added: (q + PE(m))·(k + PE(n))")):
        ax.scatter((m - n).ravel(), r[key].ravel(), s=2, alpha=0.4)
        ax.set_title(title)
        ax.set_xlabel("m − n")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("score, every pair (m, n)")
    fig.suptitle("RoPE's score depends on m − n only: every pair of one offset scores the same",
                 y=1.03)
    common.save_figure(fig, "08_rope_relative", figures_dir)


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
    common.table(rows, ["positions", f"at {SEQ_LEN} (trained)"]
                 + [f"at {n} ({n // SEQ_LEN}× the trained)" for n in lengths],
                  disable_numparse=True, kernel_dependent=True)
    common.note(f"learned refuses: {runs['+SwiGLU'][0]['refusal']}\n"
                "× sinusoidal: embeddings drawn N(0, 1), not 0.02, or the ±1 table drowns the "
                "tokens")
    longest = lengths[-1]
    common.count_line(f"at {longest}, RoPE's excess is below sinusoidal's",
                      [s["long_excess"][longest] - r["long_excess"][longest]
                       for s, r in zip(runs["sinusoidal"], runs["+RoPE"])],
                      "mnat/token (sinusoidal's − RoPE's)")
    common.count_line(f"RoPE's excess at {longest} is above its excess at {SEQ_LEN}",
                      [r["long_excess"][longest] - r["excess"] for r in runs["+RoPE"]],
                      f"mnat/token (at {longest} − at {SEQ_LEN})")


# ---- Part 4 · §14, GQA ---------------------------------------------------------------------------
def show_gqa(args):
    common.header(4, __doc__)
    show_kv_cache(args)
    show_gqa_conversion(args)


# Published configurations (params.json / config.json): layers, query heads, KV heads, head size
KV_CONFIGS = {"LLaMA-2-7B": dict(n_layers=32, n_head=32, n_kv_heads=32, head_dim=128),
              "LLaMA-2-70B": dict(n_layers=80, n_head=64, n_kv_heads=8, head_dim=128),
              "LLaMA-3-8B": dict(n_layers=32, n_head=32, n_kv_heads=8, head_dim=128)}


def measured_kv_cache(n_kv_heads: int, n_layers: int, batch_size: int, prompt_len: int,
                      new_tokens: int, n_embd: int = CITY_WIDTH["n_embd"],
                      n_head: int = CITY_WIDTH["n_head"], seed: int = 0) -> dict:
    """Greedy decoding with a KV cache in a llama.DecoderLM over the city vocabulary (RoPE,
    n_kv_heads KV heads): the bytes its cache holds, measured from the arrays, and by the formula
    at tensor.py's itemsize."""
    transformer.set_seed(seed)
    model = llama.DecoderLM(city_lab.V, n_embd, n_head, n_positions=city_lab.SEQ_LEN,
                            n_layers=n_layers, positions="rope", n_kv_heads=n_kv_heads).eval()
    length = prompt_len + new_tokens
    tokens = np.random.default_rng(seed).integers(0, city_lab.V, (batch_size, prompt_len))
    cache = model.new_cache(length)
    with no_grad():
        logits = model(tokens, cache=cache)
        while cache[0].length < length:
            # (B, S, V) -> (B, 1): the last position's likeliest token
            logits = model(logits.numpy()[:, -1].argmax(-1)[:, None], cache=cache)
    return dict(n_kv_heads=n_kv_heads, length=cache[0].length,
                measured=llama.kv_cache_bytes(cache),
                formula=llama.kv_cache_formula(n_layers, batch_size, length, n_kv_heads,
                                               n_embd // n_head, np.dtype(tensor.DTYPE).itemsize))


def llama_kv_caches(configs: dict, batch_size: int, length: int, itemsize: int = 2) -> list:
    """The formula at published sizes, with the model's KV heads and with every head its own."""
    return [dict(c, name=name, batch_size=batch_size, length=length, itemsize=itemsize,
                 gqa=llama.kv_cache_formula(c["n_layers"], batch_size, length, c["n_kv_heads"],
                                            c["head_dim"], itemsize),
                 mha=llama.kv_cache_formula(c["n_layers"], batch_size, length, c["n_head"],
                                            c["head_dim"], itemsize))
            for name, c in configs.items()]


def show_kv_cache(args):
    n_layers, batch_size, prompt_len, new_tokens = 2, 2, 3, 4 if args.quick else 8
    n_head = CITY_WIDTH["n_head"]
    kv_heads = [k for k in range(n_head, 0, -1) if n_head % k == 0]
    runs = [measured_kv_cache(k, n_layers, batch_size, prompt_len, new_tokens, seed=args.seed)
            for k in kv_heads]
    full = runs[0]["measured"]
    common.note(f"the city model (d = {CITY_WIDTH['n_embd']}, {n_head} heads, Dh = "
                f"{CITY_WIDTH['n_embd'] // n_head}, RoPE) with {n_layers} layers, {batch_size} "
                f"rows, a {prompt_len}-token prompt and {new_tokens} greedy tokens, float64: the "
                "cache's bytes measured from its arrays, and by 2·L·B·T·n_kv·Dh·itemsize")
    common.table([[r["n_kv_heads"], n_head // r["n_kv_heads"], r["length"], f"{r['measured']:,}",
                   f"{r['formula']:,}", "yes" if r["measured"] == r["formula"] else "NO",
                   f"{full / r['measured']:g}×"] for r in runs],
                 headers=["KV heads", "query heads per KV head", "T", "measured (bytes)",
                          "formula (bytes)", "equal", "smaller than multi-head"],
                 disable_numparse=True)
    common.note(f"the city model's ceiling is {n_head}×: {n_head} query heads can share at most "
                f"{n_head} ways (one KV head, multi-query attention); the notes' 'several-fold' "
                "shows at LLaMA's head counts:")
    batch, length = 1, 4096
    big = llama_kv_caches(KV_CONFIGS, batch, length)
    print()
    common.note(f"the formula at published sizes, B = {batch}, T = {length:,}, float16 "
                "(2 bytes):")
    common.table([[r["name"], r["n_layers"], r["n_head"], r["n_kv_heads"], r["head_dim"],
                   f"{r['gqa']:,}", f"{r['gqa'] / 2 ** 30:g} GiB", f"{r['mha'] / 2 ** 30:g} GiB",
                   f"{r['mha'] / r['gqa']:g}×"] for r in big],
                 headers=["model", "layers", "heads", "KV heads", "Dh", "KV cache (bytes)",
                          "KV cache", "with every head's K, V", "GQA shrinks it"],
                 disable_numparse=True)
    draw_kv_cache(runs, big, n_head, args.figures)


@common.draws_figure
def draw_kv_cache(runs: list, big: list, n_head: int, figures_dir):
    import matplotlib.pyplot as plt
    fig, (city, published) = plt.subplots(1, 2, figsize=(10, 3.6))
    kv_heads = [r["n_kv_heads"] for r in runs]
    city.plot(kv_heads, [r["formula"] for r in runs], "-", color="gray",
              label="2·L·B·T·n_kv·Dh·itemsize")
    city.plot(kv_heads, [r["measured"] for r in runs], "o", label="measured from the cache")
    city.set_xticks(kv_heads)
    city.set_xlabel(f"KV heads (of {n_head} query heads)")
    city.set_ylabel("bytes")
    city.set_title("the city model's cache, decoding")
    city.legend()
    names = [r["name"] for r in big]
    where = np.arange(len(names))
    published.bar(where - 0.2, [r["mha"] / 2 ** 30 for r in big], 0.4, label="every head's K, V")
    published.bar(where + 0.2, [r["gqa"] / 2 ** 30 for r in big], 0.4, label="the model's KV heads")
    published.set_xticks(where, names)
    published.set_ylabel(f"GiB at B = {big[0]['batch_size']}, T = {big[0]['length']}, "
                         f"{big[0]['itemsize']} bytes a number")
    published.set_title("published sizes")
    published.legend()
    fig.suptitle("GQA's KV cache: bytes shrink by query heads / KV heads", y=1.03)
    common.save_figure(fig, "08_kv_cache", figures_dir)


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
    common.table(rows, ["KV heads", "trained (median, range)", "right after pooling",
                        "after uptraining"],
                 disable_numparse=True, kernel_dependent=True)
    full = CONVERT_TO[0]
    control = [r["converted"][full][1] - r["excess"] for r in runs]
    common.kernel_note(f"The {full}-KV-head control ends {abs(np.median(control)):.0f} mnat/token "
                       f"{'above' if np.median(control) > 0 else 'below'} the trained model "
                       "(median over seeds): uptraining starts the lr again at its peak, where "
                       f"training\nhad decayed it to 0, and {steps} steps leave it there; so each "
                       "pooled model is measured against that control, not the trained model.")
    for n_kv in CONVERT_TO[1:]:
        common.count_line(f"{n_kv} KV head{'s' * (n_kv > 1)}: uptraining lowers the excess pooling "
                          "left", [r["converted"][n_kv][0] - r["converted"][n_kv][1] for r in runs],
                          "mnat/token (right after pooling − after uptraining)")
        common.count_line(f"{n_kv} KV head{'s' * (n_kv > 1)}, uptrained, end"
                          f"{'s' * (n_kv == 1)} above the {full}-KV-head control",
                          [r["converted"][n_kv][1] - r["converted"][full][1] for r in runs],
                          f"mnat/token ({n_kv}'s − the control's)")


# ---- Part 5 · §14, the ladder --------------------------------------------------------------------
def show_ladder(args):
    common.header(5, __doc__)
    plan = trained_runs(args)
    runs = trained(args, city_llama.RUNGS)
    common.note(f"Each rung adds one change to the one above it.\n{setup_line(args)}.\n"
                "Parameters matched: SwiGLU's hidden m = 8d/3 rounded holds GELU's 8d² most "
                "nearly (part 2's\nLLaMA rule floors it), and +GQA's m grows by what its smaller "
                "K, V save; RMSNorm drops LayerNorm's biases\nand RoPE the position table.")
    rows = [[name, plan[name][0]["model"].get("middle_dim", 4 * plan[name][0]["model"]["n_embd"]),
             city_llama.parameter_count(plan[name][0]["model"])] for name in runs]
    common.table(rows, ["rung", "FFN hidden", "parameters"], intfmt=",")
    common.note("Test excess over the exact bound, mnat/token, per seed:")
    common.table([[name, spread([r["excess"] for r in results])]
                  + [f"{r['excess']:.0f}" for r in results] for name, results in runs.items()],
                 ["rung", "median (range)"] + [f"seed {s}" for s in common.seeds_of(args)],
                 disable_numparse=True, kernel_dependent=True)
    names = list(runs)
    changes = {name: [p["excess"] - r["excess"] for p, r in zip(runs[previous], runs[name])]
               for previous, name in zip(names, names[1:])}
    for previous, name in zip(names, names[1:]):
        common.count_line(f"{name} lowers the excess (against {previous})", changes[name],
                          f"mnat/token ({previous}'s − {name}'s)")
    draw_ladder({name: [r["excess"] for r in results] for name, results in runs.items()},
                changes, common.seeds_of(args), args.figures)


@common.draws_figure
def draw_ladder(excess: dict, changes: dict, seeds: list, figures_dir):
    """Left, each rung's test excess per seed (a seed's runs joined); right, what each change did
    at each seed (the paired margins its line counts) with the estimate and its 95% bounds."""
    import matplotlib.pyplot as plt
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), width_ratios=(1.1, 1))
    rungs = list(excess)
    for i, seed in enumerate(seeds):   # one seed's runs joined: each step is paired by seed
        left.plot(range(len(rungs)), [excess[name][i] for name in rungs], "o-", ms=4, lw=0.8,
                  alpha=0.7, label=f"seed {seed}")
    left.set_xticks(range(len(rungs)), rungs)
    left.set_ylabel("test excess over the bound (mnat/token)")
    left.set_title("Each rung, per seed")
    left.legend(fontsize=7, ncol=2)
    labels = []
    for x, (name, margins) in enumerate(changes.items()):
        right.plot([x] * len(margins), margins, "o", ms=4, alpha=0.6, color="tab:blue")
        labels.append(name)
        if len(margins) > 1:
            d = common.decide(margins)
            low, high = (max(d.low, min(margins)), min(d.high, max(margins)))   # finite ends
            right.errorbar([x + 0.2], [d.estimate], yerr=[[d.estimate - low], [high - d.estimate]],
                           fmt="s", color="k", ms=5, capsize=4)
            labels[-1] += "\n" + d.outcome.replace("difference at", "difference\nat")
    right.axhline(0, color="grey", lw=0.8)
    right.set_xticks(range(len(changes)), labels, fontsize=8)
    right.set_ylabel("the excess it lowers, per seed (mnat/token)")
    right.set_title("Each change, paired by seed: estimate and 95% bounds (black)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.suptitle("From the notes' GPT to a LLaMA-style decoder, one change per rung")
    fig.tight_layout()
    common.save_figure(fig, "08_ladder", figures_dir)


PARTS = {1: show_norm_reductions, 2: show_swiglu_sizes, 3: show_rope, 4: show_gqa, 5: show_ladder}

SEEDS = 5   # the default of --seeds: how many seeds a training claim is counted over

if __name__ == "__main__":
    common.main(__doc__, PARTS, seeds=SEEDS,
                train_ahead={3: ahead("+SwiGLU", "sinusoidal", "+RoPE"),
                             5: ahead(*city_llama.RUNGS)})
