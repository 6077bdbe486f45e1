"""The notes' §14 preview: from HW3's GPT to a LLaMA-style decoder, one switch at a time, built
from lecture 5's tensor.py primitives like transformer.py (not one line of backward is written
here). llama_ref.py is the float64 PyTorch twin with the same names.

The file in reading order, with the paper each change comes from:
- RMSNorm .............................. Zhang & Sennrich 2019: x / √(mean(x²) + eps) · w, no
                                         centring and no bias, so a row needs one reduction, not two
- swiglu_hidden_dim, swiglu_parameter_count, SwiGLU
                                         Shazeer 2020: down(silu(gate·x) ⊙ up·x); three matrices, so
                                         the hidden size is 2/3 of GELU's 4d (LLaMA's rounding)
- rope_pairs, rope_tables, apply_rope, interleaved_to_rotate_half
                                         Su et al. 2021: each pair of a head's dimensions turned by
                                         its position times a frequency; HuggingFace's rotate-half
                                         layout and Meta's interleaved one, and the column order
                                         that converts a checkpoint from one to the other
- GroupedQueryAttention ................ Ainslie et al. 2023: n_kv_heads key/value heads, each read
                                         by n_head / n_kv_heads query heads; n_kv_heads = n_head is
                                         multi-head attention
- TransformerLayer, DecoderLM .......... Pre-LN, with each choice a switch of its own: norm, ffn,
                                         positions, n_kv_heads; at GPT's values it is
                                         transformer.DecoderLM
- kv_cache_bytes, kv_cache_formula ..... the cache keeps only the KV heads: 2·L·B·T·n_kv·Dh·itemsize

Decoding is decoding.py's, unchanged: DecoderLM inherits new_cache and generate, and the attention
writes into decoding.KVCache itself, because RoPE turns a key by its absolute position, which only
the cache knows (cache.length) when the key is made.
"""
from __future__ import annotations

import math

import numpy as np

from lecture06 import transformer
from lecture05.tensor import Tensor
from lecture06.transformer import (Dropout, Embedding, FeedForward, LayerNorm, Linear, Module,
                                   MultiHeadAttention, Parameter, check_sizes,
                                   sinusoidal_frequencies, softmax)

NORMS = ("layernorm", "rmsnorm")
FFNS = ("gelu", "swiglu")
POSITIONS = ("learned", "sinusoidal", "rope")
ROPE_LAYOUTS = ("rotate_half", "interleaved")


def check_choice(owner: str, name: str, value, choices: tuple):
    if value not in choices:
        raise ValueError(f"{owner}: {name} must be one of {', '.join(map(repr, choices))}, "
                         f"got {value!r}")


# ---- RMSNorm (Zhang & Sennrich 2019) -------------------------------------------------------------
class RMSNorm(Module):
    """y = x / √(mean(x²) + eps) · weights over the last dimension: LayerNorm without the mean's
    subtraction and without a bias (eps inside the root, as LLaMA and torch.nn.RMSNorm)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        self.dim, self.eps = dim, eps
        self.weights = Parameter(np.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        """
        Args:
            x: (..., dim)
        Returns:
            (..., dim), each row scaled to root mean square 1, then by weights
        """
        if x.shape[-1] != self.dim:
            raise ValueError(f"RMSNorm({self.dim}): input's last dimension is {x.shape[-1]} "
                             f"(shape {x.shape})")
        mean_square = (x * x).mean(axis=-1, keepdims=True)       # the row's one reduction
        inv_rms = ((mean_square + self.eps).log() * -0.5).exp()  # 1/√(ms + eps) from exp and log
        return x * inv_rms * self.weights


def make_norm(norm: str, dim: int, eps: float) -> Module:
    return LayerNorm(dim, eps=eps) if norm == "layernorm" else RMSNorm(dim, eps=eps)


# ---- SwiGLU (Shazeer 2020; LLaMA's hidden size) --------------------------------------------------
def swiglu_hidden_dim(n_embd: int, multiple_of: int, ffn_dim_multiplier: float | None = None
                      ) -> int:
    """LLaMA's rule (its model.py): 2/3 of GELU's 4·n_embd, so that three matrices hold about the
    parameters of two; times ffn_dim_multiplier if given (LLaMA-2-70B, LLaMA-3: 1.3); rounded up
    to a multiple of multiple_of. n_embd = 4096, multiple_of = 256 gives LLaMA-7B's 11,008."""
    check_sizes("swiglu_hidden_dim", n_embd=(n_embd, 1), multiple_of=(multiple_of, 1))
    hidden = 2 * 4 * n_embd // 3                  # int(2 · 4d / 3), as LLaMA computes it
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * -(-hidden // multiple_of)


def swiglu_parameter_count(n_embd: int, hidden_dim: int) -> tuple[int, int]:
    """(SwiGLU's 3·n_embd·hidden_dim, GELU's 8·n_embd² at hidden 4·n_embd), biases left out (LLaMA
    has none)."""
    return 3 * n_embd * hidden_dim, 8 * n_embd * n_embd


def silu(x: Tensor) -> Tensor:
    """x·sigmoid(x), "Swish-1"."""
    return x * x.sigmoid()


class SwiGLU(Module):
    """dropout(down_projection(silu(gate_projection(x)) ⊙ up_projection(x))), no biases.

    hidden_dim defaults to the 2/3·4d rule with no rounding (multiple_of=1), which keeps the
    parameters at or just under GELU's 8d²; pass swiglu_hidden_dim(d, 256) for LLaMA's sizes.
    The dropout on the output is GPT's (FeedForward's); LLaMA trains with p_dropout = 0.
    """

    def __init__(self, n_embd: int, hidden_dim: int | None = None, p_dropout: float = 0.1):
        hidden_dim = swiglu_hidden_dim(n_embd, 1) if hidden_dim is None else hidden_dim
        self.gate_projection = Linear(n_embd, hidden_dim, bias=False)
        self.up_projection = Linear(n_embd, hidden_dim, bias=False)
        self.down_projection = Linear(hidden_dim, n_embd, bias=False)
        self.dropout = Dropout(p_dropout)

    def forward(self, x: Tensor) -> Tensor:
        """(B, S, D) -> (B, S, D)."""
        gated = silu(self.gate_projection(x)) * self.up_projection(x)     # (B, S, hidden)
        return self.dropout(self.down_projection(gated))


# ---- RoPE (Su et al. 2021) -----------------------------------------------------------------------
def rope_pairs(head_dim: int, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """(first, second): the dimensions RoPE turns together, pair i being (first[i], second[i]),
    turned at frequency ω_i = base^(-2i/Dh). rotate_half (HuggingFace): c with c + Dh/2;
    interleaved (Meta's checkpoints, the paper): 2i with 2i + 1."""
    check_choice("RoPE", "layout", layout, ROPE_LAYOUTS)
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) \
            or head_dim < 2 or head_dim % 2:
        raise ValueError(f"RoPE: the head size must be an even integer (it turns pairs of "
                         f"dimensions), got head_dim={head_dim!r}; choose n_embd / n_head even")
    if layout == "rotate_half":
        first = np.arange(head_dim // 2)
        return first, first + head_dim // 2
    first = np.arange(0, head_dim, 2)
    return first, first + 1


def rope_tables(positions, head_dim: int, layout: str = "rotate_half", base: float = 10000.0):
    """cos, sin: (S, Dh) the cosine and sine of each dimension's angle t·ω_pair at each position t,
    and quarter_turn: (Dh, Dh) the matrix that takes every pair (a, b) to (-b, a). A pair then
    turns by its angle as x·cos + (x @ quarter_turn)·sin. Computed for any position: no table is
    stored, so no trained length limits it."""
    first, second = rope_pairs(head_dim, layout)
    # (S,) ⊗ (Dh/2,) -> (S, Dh/2): the angle of each pair at each position
    pair_angles = np.outer(np.asarray(positions, dtype=np.float64),
                           sinusoidal_frequencies(head_dim, base))
    angles = np.empty((pair_angles.shape[0], head_dim))
    angles[:, first] = angles[:, second] = pair_angles
    quarter_turn = np.zeros((head_dim, head_dim))
    quarter_turn[second, first] = -1.0                 # a pair's first becomes minus its second
    quarter_turn[first, second] = 1.0                  # and its second becomes its first
    return np.cos(angles), np.sin(angles), quarter_turn


def apply_rope(x: Tensor, positions, layout: str = "rotate_half",
               base: float = 10000.0) -> Tensor:
    """Turn every head's pairs by their position's angles (q and k, after the head split).

    Args:
        x: (B, S, h, Dh); positions: (S,) the absolute position of each of the S rows
    Returns:
        (B, S, h, Dh). The product of a query turned at m and a key turned at n depends on m - n
        only: the turns by m and n leave the turn by m - n between them.
    """
    cos, sin, quarter_turn = rope_tables(positions, x.shape[-1], layout, base)
    # (S, Dh) -> (S, 1, Dh): the same angles for every head
    cos, sin = Tensor(cos[:, None, :]), Tensor(sin[:, None, :])
    # x @ quarter_turn only moves and negates numbers (0/±1 weights): exact
    return x * cos + (x @ Tensor(quarter_turn)) * sin


def interleaved_to_rotate_half(n_heads: int, head_dim: int) -> np.ndarray:
    """The output columns of a q or k projection, (in, n_heads·Dh) as Linear stores it, that turn
    a model trained with the interleaved layout into the same model in the rotate-half layout:
    weights[:, order] (and bias[order]). Within each head, rotate-half's pair i (i, i + Dh/2)
    takes interleaved pair i (2i, 2i + 1): HuggingFace's conversion of Meta's checkpoints permutes
    the same rows of torch's (out, in) weights. Without it only a query and a key at the same
    position still score right (their turns cancel, and a dot product does not see the order of
    the dimensions): the attention weights are wrong from the second position on."""
    rotate_first, rotate_second = rope_pairs(head_dim, "rotate_half")
    interleaved_first, interleaved_second = rope_pairs(head_dim, "interleaved")
    within = np.empty(head_dim, dtype=np.int64)
    within[rotate_first], within[rotate_second] = interleaved_first, interleaved_second
    # (h, 1) + (Dh,) -> (h, Dh) -> (h·Dh,): each head's columns, reordered within the head
    return (np.arange(n_heads)[:, None] * head_dim + within).reshape(-1)


# ---- grouped-query attention (Ainslie et al. 2023) -----------------------------------------------
class GroupedQueryAttention(Module):
    """Causal self-attention with n_kv_heads key/value heads shared by groups of
    n_head / n_kv_heads query heads: query head j reads KV head j // (n_head / n_kv_heads).
    n_kv_heads = n_head (the default) is multi-head attention, n_kv_heads = 1 multi-query
    attention. rope: turn q and k by their positions (rope_layout) after the head split.

    The grouping is an axis, not a copy: q is (B, n_kv, g, S, Dh) and kT, v carry a group axis of
    size 1, so each KV head's keys meet its g query heads by broadcasting in the matmul (HF's
    repeat_kv copies them g times). The names are MultiHeadAttention's, so at n_kv_heads = n_head
    without RoPE the same seed draws the same weights.
    """

    def __init__(self, n_embd: int, n_head: int, n_kv_heads: int | None = None,
                 p_dropout: float = 0.1, bias: bool = True, rope: bool = False,
                 rope_layout: str = "rotate_half", rope_base: float = 10000.0):
        n_kv_heads = n_head if n_kv_heads is None else n_kv_heads
        check_sizes("GroupedQueryAttention", n_embd=(n_embd, 1), n_head=(n_head, 1),
                    n_kv_heads=(n_kv_heads, 1))
        if n_embd % n_head:
            raise ValueError(f"GroupedQueryAttention: n_embd={n_embd} is not divisible by "
                             f"n_head={n_head}")
        if n_head % n_kv_heads:
            divisors = [k for k in range(1, n_head + 1) if n_head % k == 0]
            raise ValueError(f"GroupedQueryAttention: n_head={n_head} is not a multiple of "
                             f"n_kv_heads={n_kv_heads} (each KV head serves n_head / n_kv_heads "
                             f"query heads); pass n_kv_heads in {divisors}")
        head_dim = n_embd // n_head
        if rope:
            check_choice("GroupedQueryAttention", "rope_layout", rope_layout, ROPE_LAYOUTS)
            rope_pairs(head_dim, rope_layout)          # refuses an odd head size here, not later
        self.n_embd, self.n_head, self.n_kv_heads, self.causal = n_embd, n_head, n_kv_heads, True
        self.attn_hidden_dim, self.group_size = head_dim, n_head // n_kv_heads
        self.rope_layout, self.rope_base = (rope_layout if rope else None), rope_base
        self.q_projection = Linear(n_embd, n_embd, bias=bias)
        self.k_projection = Linear(n_embd, n_kv_heads * head_dim, bias=bias)
        self.v_projection = Linear(n_embd, n_kv_heads * head_dim, bias=bias)
        self.out_projection = Linear(n_embd, n_embd, bias=bias)
        self.dropout = Dropout(p_dropout)       # on the attention weights, as GPT-2
        self.out_dropout = Dropout(p_dropout)   # on the sub-layer's output, before the residual
        self.last_attention = None              # (B, n_kv, g, S_q, S_k) weights of the last forward

    def project_to_query_key_value(self, x: Tensor, start: int = 0):
        """
        Args:
            x: (B, S, D) at positions start, ..., start + S - 1 (RoPE turns by them)
        Returns:
            q:  (B, n_kv, g, S, Dh), query head j = kv · g + i at [kv, i]
            kT: (B, n_kv, 1, Dh, S)
            v:  (B, n_kv, 1, S, Dh)
        """
        batch_size, seq_len, _ = x.shape
        n_kv, group, head_dim = self.n_kv_heads, self.group_size, self.attn_hidden_dim
        # (B, S, D) -> (B, S, h, Dh) and (B, S, n_kv·Dh) -> (B, S, n_kv, Dh)
        q = self.q_projection(x).view(batch_size, seq_len, self.n_head, head_dim)
        k = self.k_projection(x).view(batch_size, seq_len, n_kv, head_dim)
        if self.rope_layout is not None:
            positions = np.arange(start, start + seq_len)
            q = apply_rope(q, positions, self.rope_layout, self.rope_base)
            k = apply_rope(k, positions, self.rope_layout, self.rope_base)
        # (B, S, h, Dh) -> (B, S, n_kv, g, Dh) -> (B, n_kv, g, S, Dh)
        q = q.view(batch_size, seq_len, n_kv, group, head_dim).permute(0, 2, 3, 1, 4)
        # (B, S, n_kv, Dh) -> (B, S, n_kv, 1, Dh) -> (B, n_kv, 1, Dh, S)
        kT = k.view(batch_size, seq_len, n_kv, 1, head_dim).permute(0, 2, 3, 4, 1)
        # (B, S, n_kv·Dh) -> (B, S, n_kv, 1, Dh) -> (B, n_kv, 1, S, Dh)
        v = (self.v_projection(x).view(batch_size, seq_len, n_kv, 1, head_dim)
             .permute(0, 2, 3, 1, 4))
        return q, kT, v

    def self_attention(self, q: Tensor, kT: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """
        Args:
            q: (B, n_kv, g, S_q, Dh), kT: (B, n_kv, 1, Dh, S_k), v: (B, n_kv, 1, S_k, Dh)
            mask: additive, broadcastable to (B, n_kv, g, S_q, S_k)
        Returns:
            (B, S_q, D): heads concatenated in order j = kv · g + i, before out_projection
        """
        batch_size, _, _, seq_len, head_dim = q.shape
        # (B, n_kv, g, S_q, Dh) @ (B, n_kv, 1, Dh, S_k) -> (B, n_kv, g, S_q, S_k)
        scores = (q @ kT) * (1.0 / math.sqrt(head_dim))
        if mask is not None:
            scores = scores + mask
        weights = softmax(scores, dim=-1)
        self.last_attention = weights
        out = self.dropout(weights) @ v                      # -> (B, n_kv, g, S_q, Dh)
        out = out.permute(0, 3, 1, 2, 4).contiguous()        # -> (B, S_q, n_kv, g, Dh), copied once
        return out.view(batch_size, seq_len, self.n_embd)    # -> (B, S_q, D)

    def forward(self, x: Tensor, pad_mask=None, cache=None) -> Tensor:
        """
        Args:
            x: (B, S, D); pad_mask: (B, S), True at padded positions
            cache: decoding only, a decoding.KVCache; x then holds just the new positions, and
                they are turned at their absolute positions cache.length, ...
        Returns:
            (B, S, D)
        """
        if x.ndim != 3 or x.shape[-1] != self.n_embd:
            raise ValueError(f"GroupedQueryAttention: expected x of shape (B, S, {self.n_embd}), "
                             f"got {x.shape}")
        batch_size, seq_len, _ = x.shape
        if cache is None:
            q, kT, v = self.project_to_query_key_value(x)
            mask = MultiHeadAttention.create_causal_mask(seq_len)          # (1, 1, S, S)
            if pad_mask is not None:
                # (B, 1, 1, S) -> (B, 1, 1, 1, S): past the group axis too
                pad = MultiHeadAttention.create_pad_mask(pad_mask, batch_size, seq_len)
                mask = mask + pad.view(batch_size, 1, 1, 1, seq_len)
        else:
            if pad_mask is not None:
                raise ValueError("GroupedQueryAttention: a KV cache serves decoding without "
                                 "padding; pass pad_mask=None")
            q, kT, v = self.project_to_query_key_value(x, start=cache.length)
            cache.write(kT, v)             # only the n_kv heads: (B, n_kv, 1, Dh, capacity)
            kT, v, mask = cache.kT, cache.v, cache.causal_mask(seq_len)
        return self.out_dropout(self.out_projection(self.self_attention(q, kT, v, mask)))


# ---- the layer and the model, each choice a switch -----------------------------------------------
class TransformerLayer(transformer.TransformerLayer):
    """A Pre-LN layer, x + attention(ln_1(x)), then x + ff(ln_2(x)), whose parts are switches:
    norm "layernorm" | "rmsnorm", ffn "gelu" | "swiglu", n_kv_heads, RoPE. forward is
    transformer.TransformerLayer's; its __init__ is not called, since it would draw GPT's
    weights."""

    def __init__(self, n_embd: int, n_head: int, n_kv_heads: int | None = None,
                 p_dropout: float = 0.1, ln_eps: float = 1e-5, bias: bool = True,
                 norm: str = "layernorm", ffn: str = "gelu", middle_dim: int | None = None,
                 rope: bool = False, rope_layout: str = "rotate_half", rope_base: float = 10000.0):
        check_choice("TransformerLayer", "norm", norm, NORMS)
        check_choice("TransformerLayer", "ffn", ffn, FFNS)
        self.pre_ln = True
        self.ln_1 = make_norm(norm, n_embd, ln_eps)
        self.ln_2 = make_norm(norm, n_embd, ln_eps)
        self.attention = GroupedQueryAttention(n_embd, n_head, n_kv_heads, p_dropout=p_dropout,
                                               bias=bias, rope=rope, rope_layout=rope_layout,
                                               rope_base=rope_base)
        self.ff = (FeedForward(n_embd, middle_dim=middle_dim, p_dropout=p_dropout, bias=bias)
                   if ffn == "gelu" else SwiGLU(n_embd, middle_dim, p_dropout=p_dropout))


class DecoderLM(transformer.DecoderLM):
    """transformer.DecoderLM (Pre-LN) with each §14 change a switch of its own, so the ladder
    GPT -> +RMSNorm -> +SwiGLU -> +RoPE -> +GQA is one model:
        norm: "layernorm" (GPT) | "rmsnorm";  ffn: "gelu" (GPT) | "swiglu"
        positions: "learned" (GPT) | "sinusoidal" | "rope";  n_kv_heads: n_head (GPT) | a divisor
    At GPT's values it computes what transformer.DecoderLM(pre_ln=True) computes, and the same seed
    draws the same weights under the same names. middle_dim: the FFN's hidden size (default 4d
    for gelu, the 2/3·4d rule for swiglu). bias: the Linears of attention and the GELU FFN (SwiGLU
    has none). embed, forward, new_cache and generate are transformer.DecoderLM's: only a learned
    table refuses a sequence past n_positions; RoPE and sinusoidal positions compute any position.
    """

    def __init__(self, n_vocab: int, n_embd: int, n_head: int, n_positions: int, n_layers: int = 4,
                 p_dropout: float = 0.1, ln_eps: float = 1e-5, bias: bool = True,
                 tie_weights: bool = False, norm: str = "layernorm", ffn: str = "gelu",
                 positions: str = "learned", n_kv_heads: int | None = None,
                 middle_dim: int | None = None, rope_layout: str = "rotate_half",
                 rope_base: float = 10000.0):
        # transformer.DecoderLM.__init__ is not called (it would build GPT's layers); what it
        # sets is set here, in its order, so that GPT's switches draw its weights
        check_choice("DecoderLM", "positions", positions, POSITIONS)
        check_choice("DecoderLM", "norm", norm, NORMS)
        check_choice("DecoderLM", "ffn", ffn, FFNS)
        check_sizes("DecoderLM", n_vocab=(n_vocab, 1), n_layers=(n_layers, 0))
        self.n_vocab, self.n_embd, self.n_positions = n_vocab, n_embd, n_positions
        self.positions, self.tie_weights = positions, tie_weights
        self.token_embeddings = Embedding(n_vocab, n_embd)
        self.position_embeddings = (Embedding(n_positions, n_embd) if positions == "learned"
                                    else None)
        self.dropout = Dropout(p_dropout)
        self.layers = [TransformerLayer(n_embd, n_head, n_kv_heads, p_dropout=p_dropout,
                                        ln_eps=ln_eps, bias=bias, norm=norm, ffn=ffn,
                                        middle_dim=middle_dim, rope=positions == "rope",
                                        rope_layout=rope_layout, rope_base=rope_base)
                       for _ in range(n_layers)]
        self.ln = make_norm(norm, n_embd, ln_eps)
        self.lm_head = None if tie_weights else Linear(n_embd, n_vocab, bias=False)


# ---- the KV cache's size -------------------------------------------------------------------------
def kv_cache_bytes(cache: list) -> int:
    """Bytes a DecoderLM's cache (new_cache's list, one decoding.KVCache per layer) holds in its
    keys and values, measured from the arrays."""
    return sum(c.kT.numpy().nbytes + c.v.numpy().nbytes for c in cache if c.kT is not None)


def kv_cache_formula(n_layers: int, batch_size: int, length: int, n_kv_heads: int,
                     head_dim: int, itemsize: int = 8) -> int:
    """2·L·B·T·n_kv·Dh·itemsize: keys and values, every layer, row, position, KV head and
    dimension (float64: 8 bytes; fp16: 2). With n_kv_heads = n_head it is multi-head
    attention's cache; GQA divides it by n_head / n_kv_heads."""
    return 2 * n_layers * batch_size * length * n_kv_heads * head_dim * itemsize
