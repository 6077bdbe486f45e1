"""The cost models that scripts 03, 06 and 09 share (notes §8.2-§8.4, §13), and the measurement of
what torch keeps for backward that 06 and 09 hold them against.

- fusion_counts, fusion_counts_from_shapes (03 part 7): one Pre-LN layer's launches, bytes moved,
  FLOPs and bytes kept for backward along three paths, composed, fused and fused + flash, counted
  by tensor.py (count_traffic, saved_bytes); 09 parts 1-3 put torch's kernels beside them;
- flop_formula, attention_share (06 parts 2-3, 5; 09 part 4): matmul FLOPs per forward by term;
- exact_saved_floats, flash_saved_floats (06 parts 4 and 6; 09 part 3): the elements a layer keeps
  for backward, by formula;
- korthikanti_terms, korthikanti_bytes (06 part 7, 09 part 3): Korthikanti et al.'s per-layer
  activation bytes, term by term; saved_by_term measures torch's layer by the same terms, on any
  device (on a GPU torch's dropout keeps a 1-byte mask: dropout_mask).

The numbered scripts cannot import each other (their names start with digits), so what more than
one of them computes lives here.
"""
from __future__ import annotations

import contextlib
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import torch

from lecture05 import tensor
from lecture05.tensor import Tensor
from lecture06 import kernels, torch_ref, transformer

# ---- one Pre-LN layer's traffic along three paths (03 part 7, 09 parts 1-3) ----------------------
FUSION_PATHS = ("composed", "fused", "fused + flash")
# the notes' shapes: GPT-2 small's layer at its full context
GPT2_LAYER = dict(d=768, h=12, S=1024)


def fusion_switch(path: str):
    """The context that selects a path: composed primitives, fused ones, or fused + flash core."""
    if path not in FUSION_PATHS:
        raise ValueError(f"unknown path {path!r}; choose one of {', '.join(FUSION_PATHS)}")
    if path == "composed":
        return contextlib.nullcontext()
    return kernels.fused(flash=path == "fused + flash", block_size=64)


def layer_traffic(layer, x: np.ndarray, path: str) -> dict:
    """One Pre-LN layer's forward and backward under `path`, counted by tensor.py: launches (every
    primitive call, and those that move memory, in all and by primitive), bytes moved, FLOPs, bytes
    saved for backward.
    A contiguous() that finds its input contiguous already is a call but no launch: it moves
    nothing."""
    inputs = Tensor(x, requires_grad=True)
    with fusion_switch(path):
        with tensor.count_traffic() as forward:
            out = layer(inputs)
        saved = tensor.saved_bytes(out, exclude=layer.parameters())
        copies_nothing = contiguous_calls_that_copy_nothing(out)
        with tensor.count_traffic() as backward:
            out.backward(np.ones(out.shape))
    layer.zero_grad()
    row = dict(path=path, saved=saved)
    for direction, traffic in (("forward", forward), ("backward", backward)):
        row[f"{direction}_calls"] = traffic.total("launches")
        # the launches that move memory, by primitive (09 part 1 sorts torch's kernels the same way)
        row[f"{direction}_by_primitive"] = Counter({
            kind: n for (d, kind), n in traffic.launches.items()
            if kind not in tensor.MOVES_NOTHING[d]})
        row[f"{direction}_moving"] = row[f"{direction}_by_primitive"].total()
        row[f"{direction}_bytes"] = traffic.total("bytes")
        row[f"{direction}_flops"] = traffic.total("flops")
    # tensor.py charges every contiguous() call a launch that reads and writes its array; one that
    # finds its input contiguous already hands back the same array, so nothing ran (torch's
    # contiguous() returns its input there): the flash core writes the heads merged
    for node in copies_nothing:
        row["forward_moving"] -= 1
        row["forward_by_primitive"]["contiguous"] -= 1
        row["forward_bytes"] -= node._parents[0].data.nbytes + node.data.nbytes
    return row


def contiguous_calls_that_copy_nothing(out: Tensor) -> list[Tensor]:
    """The contiguous() results in out's graph that are their input's own array, not a copy."""
    return [node for node in tensor.graph(out)
            if node._op == "contiguous" and node.data is node._parents[0].data]


def fusion_counts(d: int, h: int, S: int, B: int = 1, seed: int = 0, layer=None) -> list[dict]:
    """layer_traffic for the three paths, run at (B, S, d) (on `layer` if given: built once)."""
    if layer is None:
        transformer.set_seed(seed)
        layer = transformer.TransformerLayer(d, h, p_dropout=0.0)
    x = np.random.default_rng(seed).standard_normal((B, S, d))
    return [layer_traffic(layer, x, path) for path in FUSION_PATHS]


def fusion_counts_from_shapes(d: int, h: int, S: int, sample_lengths=(2, 4, 6),
                              check_length: int = 8, seed: int = 0) -> list[dict]:
    """fusion_counts at (1, S, d) without computing at S. At fixed d and h every count is
    c₂·S² + c₁·S + c₀ (each array's size is S·(something), S²·h or free of S; launches do not
    depend on S), so three small runs fix c₂, c₁, c₀ exactly (in integers), and the polynomial
    gives S. A fourth run, at check_length, must agree (tests check a larger S against a run)."""
    lengths = (*sample_lengths, check_length)
    transformer.set_seed(seed)
    layer = transformer.TransformerLayer(d, h, p_dropout=0.0)   # counts don't depend on the weights
    runs = [fusion_counts(d, h, n, seed=seed, layer=layer) for n in lengths]
    rows = []
    for per_length in zip(*runs):
        row = dict(path=per_length[0]["path"])
        for key in per_length[0]:
            if key == "path":
                continue
            values = [r[key] for r in per_length]
            if isinstance(values[0], Counter):   # launches by primitive: the same at every S
                if any(value != values[0] for value in values):
                    raise ArithmeticError(f"{row['path']}: {key} depends on S: {values}")
                row[key] = values[0]
                continue
            if extrapolate_quadratic(sample_lengths, values[:-1], check_length) != values[-1]:
                raise ArithmeticError(f"{row['path']}: {key} is not quadratic in S: "
                                      f"{dict(zip(lengths, values))}")
            row[key] = extrapolate_quadratic(sample_lengths, values[:-1], S)
        rows.append(row)
    return rows


def extrapolate_quadratic(xs, ys, x) -> int:
    """The quadratic through (xs, ys) at x in exact fractions (Lagrange): an integer or an error."""
    value = sum(Fraction(y) * math.prod(Fraction(x - xj, xi - xj) for xj in xs if xj != xi)
                for xi, y in zip(xs, ys))
    if value.denominator != 1:
        raise ArithmeticError(f"counts at S = {xs} ({ys}) are not a quadratic in S with integer "
                              f"values")
    return int(value)


# ---- FLOPs per forward by term (06 parts 2-3 and 5, 09 part 4) -----------------------------------
FLOP_TERMS = ["QKV projections", "W_O", "attention (QKᵀ, AV)", "FFN", "output layer"]


def flop_formula(n_embd, seq_len, n_layers=1, n_vocab=0, middle_dim=None, ffn_matrices=2,
                 **_) -> dict:
    """Matmul FLOPs (2 per multiply-add) of one forward over a sequence of seq_len tokens.
    Per layer 24·S·d² + 4·S²·d with m = 4d; plus 2·S·d·V for the output layer."""
    S, d, L = seq_len, n_embd, n_layers
    m = middle_dim or 4 * d
    terms = [L * 6 * S * d * d, L * 2 * S * d * d, L * 4 * S * S * d,
             L * ffn_matrices * 2 * S * d * m,
             2 * S * d * n_vocab]
    return dict(zip(FLOP_TERMS, terms))


def attention_share(flops: dict) -> float:
    """The attention core's (QKᵀ, AV) share of a layer's matmul FLOPs, output layer left out."""
    layer = sum(v for k, v in flops.items() if k in FLOP_TERMS[:4])
    return flops["attention (QKᵀ, AV)"] / layer


# ---- what a layer keeps for backward, by formula (06 parts 4 and 6, 09 part 3) -------------------
def exact_saved_floats(S: int, d: int, h: int, p_dropout: float = 0.0) -> int:
    """What the layer saves, in float32 elements: 16·S·d + h·S² + 4·S without dropout. With dropout
    (CPU: each mask is a float tensor the multiply keeps for backward) also the masks of the
    attention output and the FFN output (2·S·d), the attention weights' mask and the dropped weights
    that AV's backward needs (2·h·S²; the softmax output stays for softmax's backward)."""
    if p_dropout == 0:
        return 16 * S * d + h * S * S + 4 * S
    return 18 * S * d + 3 * h * S * S + 4 * S


def flash_saved_floats(S: int, d: int, h: int) -> dict:
    """Elements one Pre-LN layer (no dropout) keeps with a flash core instead of the h × S × S
    softmax output: kernels.py's keeps each row's max and log-sum (2·h·S), torch's
    scaled_dot_product_attention its logsumexp (h·S)."""
    return {"tensor.py": 16 * S * d + 2 * h * S + 4 * S, "torch SDPA": 16 * S * d + h * S + 4 * S}


# ---- Korthikanti et al.'s per-layer formula, and torch's layer measured by its terms -------------
# Korthikanti et al. (2022), "Reducing Activation Recomputation in Large Transformer Models", §4.1:
# one layer keeps s·b·h·(34 + 5·a·s/h) bytes, 16-bit activations and 1-byte dropout masks, with s
# the sequence, b the batch, h the hidden size (our d) and a the heads (our h). Each term: (block,
# what is kept, elements per s·b·h or per a·s²·b, the unit, their bytes per element).
KORTHIKANTI_TERMS = [
    ("attention", "QKV input (ln_1's output)", 1, "sbh", 2),
    ("attention", "Q and K (for QKᵀ)", 2, "sbh", 2),
    ("attention", "softmax output", 1, "as²b", 2),
    ("attention", "softmax dropout mask", 1, "as²b", 1),
    ("attention", "dropped weights (for AV)", 1, "as²b", 2),
    ("attention", "V (for AV)", 1, "sbh", 2),
    ("attention", "output projection input", 1, "sbh", 2),
    ("attention", "attention dropout mask", 1, "sbh", 1),
    ("MLP", "first linear input (ln_2's output)", 1, "sbh", 2),
    ("MLP", "GELU input", 4, "sbh", 2),
    ("MLP", "GELU output (second linear input)", 4, "sbh", 2),
    ("MLP", "MLP dropout mask", 1, "sbh", 1),
    ("LayerNorms", "LayerNorm inputs", 2, "sbh", 2),
]
LAYER_NORM_STATISTICS = "LayerNorm mean and 1/σ"   # kept by torch, left out of the formula
KORTHIKANTI_BLOCKS = {"attention": "11·s·b·h + 5·a·s²·b", "MLP": "19·s·b·h",
                      "LayerNorms": "4·s·b·h"}


def korthikanti_terms(s: int, b: int, h: int, a: int) -> list[dict]:
    """The formula's terms at this size: elements, and bytes in their precisions."""
    units = {"sbh": s * b * h, "as²b": a * s * s * b}
    return [dict(block=block, term=term, per_unit=n, unit=unit, their_bytes_per_element=size,
                 elements=n * units[unit], their_bytes=n * units[unit] * size)
            for block, term, n, unit, size in KORTHIKANTI_TERMS]


def korthikanti_bytes(s: int, b: int, h: int, a: int) -> int:
    """s·b·h·(34 + 5·a·s/h) in integers: 34·s·b·h + 5·a·s²·b."""
    return 34 * s * b * h + 5 * a * s * s * b


def saved_by_term(seq_len: int, n_embd: int = 64, n_head: int = 4, p_dropout: float = 0.1,
                  dtype=torch.float32, device="cpu") -> dict:
    """06 part 4's measurement (saved_tensors_hooks, each storage once, parameters left out) of one
    Pre-LN torch_ref layer in training mode on `device`, each storage named by the formula's term
    it serves (_naming_hooks). Returns {term: [elements, bytes]} and the shapes of the storages no
    term names."""
    layer = torch_ref.TransformerLayer(n_embd, n_head, p_dropout=p_dropout).to(device, dtype)
    layer.train()
    names = {}
    handles = [module.register_forward_hook(hook) for module, hook in _naming_hooks(layer, names)]
    x = torch.randn(1, seq_len, n_embd, dtype=dtype, device=device, requires_grad=True)
    saved = saved_storages(layer, x)
    for handle in handles:
        handle.remove()
    by_term, unnamed = {}, []
    for address, t in saved.items():
        if address not in names:
            unnamed.append(tuple(t.shape))
            continue
        entry = by_term.setdefault(names[address], [0, 0])
        entry[0] += t.untyped_storage().nbytes() // t.element_size()
        entry[1] += t.untyped_storage().nbytes()
    return dict(by_term=by_term, unnamed=unnamed)


def dropout_mask(output: torch.Tensor) -> torch.Tensor:
    """The mask a dropout's output keeps for its backward. On CPU torch's dropout multiplies by a
    mask of its input's dtype, which the multiply keeps (MulBackward0's `other`); on a GPU it is
    one fused kernel, native_dropout, which keeps a bool mask (NativeDropoutBackward0's result1:
    aten/src/ATen/native/Dropout.cpp sends CUDA tensors there)."""
    node = output.grad_fn
    if type(node).__name__ == "NativeDropoutBackward0":
        return node._saved_result1
    return node._saved_other


def _naming_hooks(layer, names: dict) -> list[tuple]:
    """[(submodule, forward hook)]: hooks that fill names {storage address: the formula's term}
    from the submodules' inputs and outputs, and from the autograd node that keeps a dropout's mask
    or a LayerNorm's statistics. A storage keeps the first name it gets."""
    def name(term: str, t: torch.Tensor):
        names.setdefault(t.untyped_storage().data_ptr(), term)

    def layer_norm(output_term: str):
        def hook(module, inputs, output):
            name("LayerNorm inputs", inputs[0])
            name(output_term, output)
            name(LAYER_NORM_STATISTICS, output.grad_fn._saved_result1)        # mean
            name(LAYER_NORM_STATISTICS, output.grad_fn._saved_result2)        # 1/σ
        return hook

    def dropout(mask_term: str, input_term: str | None = None, output_term: str | None = None):
        def hook(module, inputs, output):
            name(mask_term, dropout_mask(output))
            if input_term:
                name(input_term, inputs[0])
                name(output_term, output)
        return hook

    def output_is(term: str):
        return lambda module, inputs, output: name(term, output)

    def input_is(term: str):
        return lambda module, inputs, output: name(term, inputs[0])

    mha, ff = layer.attention, layer.ff
    return [(layer.ln_1, layer_norm("QKV input (ln_1's output)")),
            (layer.ln_2, layer_norm("first linear input (ln_2's output)")),
            (mha.q_projection, output_is("Q and K (for QKᵀ)")),
            (mha.k_projection, output_is("Q and K (for QKᵀ)")),
            (mha.v_projection, output_is("V (for AV)")),
            (mha.dropout, dropout("softmax dropout mask", "softmax output",
                                  "dropped weights (for AV)")),
            (mha.out_projection, input_is("output projection input")),
            (mha.out_dropout, dropout("attention dropout mask")),
            (ff.linear_in, output_is("GELU input")),
            (ff.linear_out, input_is("GELU output (second linear input)")),
            (ff.dropout, dropout("MLP dropout mask"))]


def saved_storages(layer, x: torch.Tensor) -> dict:
    """{storage address: a tensor on it}: what autograd keeps for the backward of layer(x), each
    storage once, the layer's parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    saved = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            saved[t.untyped_storage().data_ptr()] = t   # holding t keeps its address unused
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x)
    return saved
