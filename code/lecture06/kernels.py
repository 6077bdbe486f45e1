"""Beyond the notes (03 part 7, 06 part 6): fused kernels, and the switch that turns them on.

The lesson (transformer.py) composes tensor.py's primitives, so its softmax and LayerNorm make 7 to
20 launches each, every one reading and writing a whole tensor. What fusing them buys a layer
(launches, bytes moved, memory kept for backward) is measured by 03 part 7 and 06 part 6, which run
the same modules inside `with kernels.fused():`. There transformer.py's gelu, LayerNorm and
attention core each take one labelled branch into this file:
- layer_norm, softmax (with scale and mask), gelu: one launch forward and one backward each, the
  backward derived by hand (what the course's CUDA homework does for softmax and LayerNorm);
- flash_attention, under fused(flash=True): the attention core in one launch over key blocks,
  never forming the S_q × S_k weights.

Each is a primitive in tensor.py's own terms (Tensor._result records it for the op counter, the
traffic accounting and backward; _accumulate hands a gradient on), written here rather than in
tensor.py so that lecture 5's file holds lecture 5 alone. Imports only tensor.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from lecture05 import tensor
from lecture05.tensor import DTYPE, MASK_VALUE, Tensor


# ---- the switch ----------------------------------------------------------------------------------
_fusion = None   # None: compose the primitives (the default); else dict(flash=..., block_size=...)


@contextmanager
def fused(flash: bool = False, block_size: int = 64):
    """Inside the block, LayerNorm, gelu and the attention core use the fused primitives below
    (one launch each way); flash=True makes the core one flash_attention launch over key blocks of
    block_size. The flash core never forms the attention weights, so it cannot drop them: a
    MultiHeadAttention in training mode with p_dropout > 0 refuses to run under flash=True (no
    silent change of the model)."""
    global _fusion
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"fused: block_size must be an integer >= 1, got {block_size!r}")
    previous, _fusion = _fusion, dict(flash=bool(flash), block_size=block_size)
    try:
        yield
    finally:
        _fusion = previous


def fusing() -> bool:
    """Whether the modules run inside `with fused():`."""
    return _fusion is not None


def flashing() -> bool:
    """Whether the attention core is one flash_attention launch (`with fused(flash=True):`)."""
    return _fusion is not None and _fusion["flash"]


def flash_core(q: Tensor, kT: Tensor, v: Tensor, mask, causal: bool, p_dropout: float) -> Tensor:
    """MultiHeadAttention's core under fused(flash=True): softmax(q kᵀ/√Dh + mask) v in one launch
    over key blocks of the switch's block_size, the causal mask made from positions inside it.
    p_dropout: the module's attention dropout (0 in eval mode); the core never forms the attention
    weights, so it cannot drop them, and refuses rather than silently change the model."""
    if p_dropout > 0:
        raise ValueError(f"MultiHeadAttention: the flash core never forms the attention "
                         f"weights, so it cannot apply dropout {p_dropout:g} to "
                         f"them; call .eval(), build the model with p_dropout=0, or use "
                         f"fused(flash=False)")
    return flash_attention(q, kT, v, mask, causal, _fusion["block_size"])


# ---- the fused primitives ------------------------------------------------------------------------
def _constant_mask(mask, shape: tuple, op: str):
    """An additive mask as an array that broadcasts to `shape` (the scores' shape), or None."""
    if mask is None:
        return None
    if isinstance(mask, Tensor) and mask.requires_grad:
        raise ValueError(f"{op}: the mask requires a gradient; a mask is a constant (0 where a "
                         f"query may look, {MASK_VALUE:g} where it may not), so pass it without "
                         f"requires_grad")
    mask = np.asarray(mask.data if isinstance(mask, Tensor) else mask, dtype=DTYPE)
    if len(mask.shape) > len(shape) or not tensor._broadcasts(mask.shape, shape):
        raise ValueError(f"{op}: a mask of shape {mask.shape} does not broadcast to the scores' "
                         f"shape {shape}; trailing dimensions must be equal or 1")
    return mask


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """(x - μ)/√(σ² + eps) · weight + bias over the last dimension (biased σ², eps inside the root).

    Forward writes y and, per row, μ and r = 1/√(σ² + eps); backward reads x, μ, r (x̂ is
    recomputed). Backward, with x̂ = (x - μ)·r, g = dy∘weight and n the row length:
    ∂x̂_j/∂x_i = r(δ_ij - 1/n - x̂_i x̂_j/n) (μ moves by 1/n, r by -r x̂_i/n), so
    dx = r(g - mean(g) - x̂·mean(g∘x̂)); dweight = Σ_rows dy∘x̂, dbias = Σ_rows dy."""
    if weight.shape != x.shape[-1:] or bias.shape != x.shape[-1:]:
        raise ValueError(f"layer_norm: weight {weight.shape} and bias {bias.shape} must both have "
                         f"shape ({x.shape[-1]},), the last dimension of x {x.shape}")
    mean = x.data.mean(axis=-1, keepdims=True)                        # (..., 1)
    centred = x.data - mean
    inv_std = 1.0 / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps)

    def backward(g):
        x_hat = (x.data - mean) * inv_std
        rows = tuple(range(g.ndim - 1))
        if weight.requires_grad:
            weight._accumulate((g * x_hat).sum(axis=rows))
        if bias.requires_grad:
            bias._accumulate(g.sum(axis=rows))
        if x.requires_grad:
            gw = g * weight.data
            x._accumulate(inv_std * (gw - gw.mean(axis=-1, keepdims=True)
                                     - x_hat * (gw * x_hat).mean(axis=-1, keepdims=True)))
    return x._result(centred * inv_std * weight.data + bias.data, (x, weight, bias), "layer_norm",
                     backward, saved=(x.data, weight.data, mean, inv_std),
                     written=(mean, inv_std))


def softmax(x: Tensor, scale: float = 1.0, mask=None) -> Tensor:
    """softmax(x·scale + mask) along the last dimension in one launch; the mask is additive and
    constant.

    The same arithmetic as transformer.softmax on (x·scale + mask), so a fully masked row gets the
    same finite weights summing to 1. Backward from the saved output y alone: with
    z = x·scale + mask, ∂y_i/∂z_j = y_i(δ_ij - y_j), so dz = y∘(dy - Σ_j dy_j y_j), and
    dx = scale·dz (no gradient to the mask)."""
    mask = _constant_mask(mask, x.shape, "softmax")
    z = x.data * scale if mask is None else x.data * scale + mask
    shifted = z - z.max(axis=-1, keepdims=True, initial=-np.inf)
    y = np.exp(shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True)))

    def backward(g):
        x._accumulate(scale * y * (g - (g * y).sum(axis=-1, keepdims=True)))
    return x._result(y, (x,), "softmax", backward, saved=(y,),
                     read=x.data.nbytes + (0 if mask is None else mask.nbytes))


def gelu(x: Tensor) -> Tensor:
    """tanh GELU 0.5x(1 + tanh u), u = c(x + 0.044715x³), c = √(2/π), in one launch; saves x only.

    Backward: d/dx = 0.5(1 + tanh u) + 0.5x(1 - tanh² u)·c(1 + 3·0.044715x²), tanh u recomputed."""
    c = np.sqrt(2.0 / np.pi)

    def backward(g):
        squared = x.data * x.data
        t = np.tanh(c * x.data * (1.0 + 0.044715 * squared))
        slope = 0.5 * (1.0 + t) + 0.5 * c * x.data * (1.0 - t * t) * (1.0 + 3 * 0.044715 * squared)
        x._accumulate(g * slope)
    t = np.tanh(c * x.data * (1.0 + 0.044715 * x.data * x.data))
    return x._result(0.5 * x.data * (1.0 + t), (x,), "gelu", backward, saved=(x.data,))


def _block_scores(q, kT, mask, causal: bool, scale: float, start: int, stop: int) -> np.ndarray:
    """The scores of keys start..stop-1, masked: (..., S_q, Dh) @ (..., Dh, n) -> (..., S_q, n)."""
    scores = (q @ kT[..., start:stop]) * scale
    if mask is not None:
        scores = scores + mask[..., start:stop]
    if causal:  # made from positions, not read from an S × S array: the future of query i is j > i
        future = np.arange(start, stop) > np.arange(q.shape[-2])[:, None]   # (S_q, n)
        scores = scores + np.where(future, MASK_VALUE, 0.0)
    return scores


def _check_flash_arguments(q: Tensor, kT: Tensor, v: Tensor, causal: bool, block_size):
    """flash_attention's arguments, each refused with what it needs."""
    batch, (n_queries, head_dim), n_keys = q.shape[:-2], q.shape[-2:], kT.shape[-1]
    if (kT.shape[:-2] != batch or v.shape[:-2] != batch or kT.shape[-2] != head_dim
            or v.shape[-2] != n_keys):
        raise ValueError(f"flash_attention: expected q (..., S_q, Dh), kT (..., Dh, S_k), "
                         f"v (..., S_k, Dv) with the same leading dimensions, got q {q.shape}, "
                         f"kT {kT.shape}, v {v.shape}")
    if (isinstance(block_size, bool) or not isinstance(block_size, (int, np.integer))
            or block_size < 1):
        raise ValueError(f"flash_attention: block_size must be an integer >= 1, "
                         f"got {block_size!r}")
    if n_keys == 0:
        raise ValueError(f"flash_attention: no keys (kT has shape {kT.shape}); attention needs "
                         f"S_k >= 1")
    if causal and n_keys != n_queries:
        raise ValueError(f"flash_attention: causal=True needs as many keys as queries, got "
                         f"S_q = {n_queries}, S_k = {n_keys}; pass the mask as mask= instead "
                         f"(a KV cache's, say)")


def flash_attention(q: Tensor, kT: Tensor, v: Tensor, mask=None, causal: bool = False,
                    block_size: int = 64) -> Tensor:
    """softmax(q kᵀ/√Dh + mask) v in one launch, over key blocks, never forming the S_q × S_k
    weights.

    q (..., S_q, Dh), kT (..., Dh, S_k), v (..., S_k, Dv); mask additive and constant,
    broadcastable to (..., S_q, S_k); causal=True adds MASK_VALUE above the diagonal, made from
    positions (so no S × S mask is read or kept). The online softmax: per block s, the running row
    max m, sum l and output acc are rescaled by e^(m - m') when the max grows to m'. Saved for
    backward: q, k, v, the output and per row m and log l (the logsumexp m + log l in its two
    parts: at a fully masked row m ≈ -1e9, and the sum would round log l away to ~1e-7). Backward
    recomputes each block's scores: p = e^((s - m) - log l), D = rowsum(dO∘O) (= Σ_j p_j dp_j),
    dv = pᵀdO, dp = dO vᵀ, ds = p∘(dp - D), dq += ds k/√Dh, dk = dsᵀq/√Dh. It cannot drop
    attention weights (it never holds them all)."""
    _check_flash_arguments(q, kT, v, causal, block_size)
    batch, (n_queries, head_dim), n_keys = q.shape[:-2], q.shape[-2:], kT.shape[-1]
    scores_shape = (*batch, n_queries, n_keys)
    mask = _constant_mask(mask, scores_shape, "flash_attention")
    mask_view = None if mask is None else np.broadcast_to(mask, scores_shape)   # no copy
    scale = 1.0 / np.sqrt(head_dim)
    blocks = [(start, min(start + block_size, n_keys)) for start in range(0, n_keys, block_size)]
    row_max = np.full((*batch, n_queries, 1), -np.inf)
    row_sum = np.zeros((*batch, n_queries, 1))
    acc = np.zeros((*batch, n_queries, v.shape[-1]))
    for start, stop in blocks:
        s = _block_scores(q.data, kT.data, mask_view, causal, scale, start, stop)
        new_max = np.maximum(row_max, s.max(axis=-1, keepdims=True))
        rescale, p = np.exp(row_max - new_max), np.exp(s - new_max)
        row_sum = row_sum * rescale + p.sum(axis=-1, keepdims=True)
        acc = acc * rescale + p @ v.data[..., start:stop, :]
        row_max = new_max
    # written in (..., S_q, h, Dv) order, as torch's CPU kernel writes it: merging the heads
    # afterwards (permute, then contiguous) finds it contiguous, so no second copy of the output is
    # made or kept
    merged = np.empty((*batch[:-1], n_queries, *batch[-1:], v.shape[-1]))   # (B, S_q, h, Dv)
    out = np.swapaxes(merged, -3, -2) if batch else merged          # -> (B, h, S_q, Dv), no copy
    np.divide(acc, row_sum, out=out)
    log_sum = np.log(row_sum)

    def backward(g):
        row_dot = (g * out).sum(axis=-1, keepdims=True)       # D = rowsum(dO∘O): (..., S_q, 1)
        dq, dkT, dv = np.zeros(q.shape), np.zeros(kT.shape), np.zeros(v.shape)
        for start, stop in blocks:
            s = _block_scores(q.data, kT.data, mask_view, causal, scale, start, stop)
            p = np.exp((s - row_max) - log_sum)               # the block's weights, recomputed
            dv[..., start:stop, :] = np.swapaxes(p, -1, -2) @ g
            ds = p * (g @ np.swapaxes(v.data[..., start:stop, :], -1, -2) - row_dot) * scale
            dq += ds @ np.swapaxes(kT.data[..., start:stop], -1, -2)
            dkT[..., start:stop] = np.swapaxes(q.data, -1, -2) @ ds
        for t, grad in ((q, dq), (kT, dkT), (v, dv)):
            if t.requires_grad:
                t._accumulate(grad)
    pairs = int(np.prod(batch)) * n_queries * n_keys
    kept = (q.data, kT.data, v.data, out, row_max, log_sum) + (() if mask is None else (mask,))
    read = q.data.nbytes + kT.data.nbytes + v.data.nbytes + (0 if mask is None else mask.nbytes)
    # FLOPs per (query, key) pair: forward q·k and p·v; backward q·k again, then dv, dp, dq and dk
    return q._result(out, (q, kT, v), "flash_attention", backward, saved=kept,
                     written=(row_max, log_sum),
                     flops=2 * pairs * (head_dim + v.shape[-1]),
                     backward_flops=2 * pairs * (3 * head_dim + 2 * v.shape[-1]), read=read)
