"""PyTorch twins of llama.py's modules: float64, the same names and parameter names, so that
torch_ref.copy_from copies every parameter and links every dropout (a file of its own beside
torch_ref.py because its names are llama.py's: DecoderLM, TransformerLayer).

Written as the reference implementations write them, not transcribed from llama.py, so that
agreement to float64 rounding means something: RMSNorm as HuggingFace's LlamaRMSNorm (x.pow(2),
torch.rsqrt); RoPE in the rotate-half layout as HuggingFace's rotate_half (torch.cat of the
negated second half and the first), in the interleaved layout as Meta's llama (a complex
multiplication, torch.polar and view_as_complex); grouped-query attention as HuggingFace's
repeat_kv (each KV head copied for its group), in (B, h, S, Dh) like every other attention here.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lecture06 import llama, torch_ref
from lecture05.tensor import MASK_VALUE
from lecture06.torch_ref import DTYPE, Dropout, FeedForward, LayerNorm, Linear
from lecture06.transformer import check_pad_mask


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weights = nn.Parameter(torch.ones(dim, dtype=DTYPE))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weights


def make_norm(norm: str, dim: int, eps: float) -> nn.Module:
    return LayerNorm(dim, eps=eps) if norm == "layernorm" else RMSNorm(dim, eps=eps)


class SwiGLU(nn.Module):
    def __init__(self, n_embd: int, hidden_dim: int | None = None, p_dropout: float = 0.1):
        super().__init__()
        hidden_dim = 2 * 4 * n_embd // 3 if hidden_dim is None else hidden_dim
        self.gate_projection = Linear(n_embd, hidden_dim, bias=False)
        self.up_projection = Linear(n_embd, hidden_dim, bias=False)
        self.down_projection = Linear(hidden_dim, n_embd, bias=False)
        self.dropout = Dropout(p_dropout)

    def forward(self, x):
        gated = F.silu(self.gate_projection(x)) * self.up_projection(x)
        return self.dropout(self.down_projection(gated))


def rope_frequencies(head_dim: int, base: float = 10000.0):
    """HuggingFace's inv_freq: 1 / base^(2i/Dh), i < Dh/2."""
    return 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=DTYPE) / head_dim)


def rotate_half(x):
    """HuggingFace's: (x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x, layout: str, base: float = 10000.0):
    """x: (B, h, S, Dh) at positions 0, ..., S - 1."""
    positions = torch.arange(x.shape[-2], dtype=DTYPE)
    angles = torch.outer(positions, rope_frequencies(x.shape[-1], base))     # (S, Dh/2)
    if layout == "rotate_half":
        doubled = torch.cat((angles, angles), dim=-1)                        # (S, Dh)
        # angles in float64, rotations in x's dtype: a float32 model (city training) stays float32
        return x * doubled.cos().to(x.dtype) + rotate_half(x) * doubled.sin().to(x.dtype)
    turns = torch.polar(torch.ones_like(angles), angles)                    # (S, Dh/2) e^{iθ}
    # (B, h, S, Dh) -> (B, h, S, Dh/2, 2) -> complex (B, h, S, Dh/2): pair (2i, 2i+1) = a + ib
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    # complex (B, h, S, Dh/2) -> (B, h, S, Dh/2, 2) -> (B, h, S, Dh)
    return torch.view_as_real(pairs * turns).flatten(-2)


def repeat_kv(x, group_size: int):
    """HuggingFace's: (B, n_kv, S, Dh) -> (B, n_kv·g, S, Dh), KV head kv copied for heads
    kv·g, ..., kv·g + g - 1."""
    batch_size, n_kv, seq_len, head_dim = x.shape
    # (B, n_kv, S, Dh) -> (B, n_kv, g, S, Dh) -> (B, h, S, Dh)
    return (x[:, :, None].expand(batch_size, n_kv, group_size, seq_len, head_dim)
            .reshape(batch_size, n_kv * group_size, seq_len, head_dim))


class GroupedQueryAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, n_kv_heads: int | None = None,
                 p_dropout: float = 0.1, bias: bool = True, rope: bool = False,
                 rope_layout: str = "rotate_half", rope_base: float = 10000.0):
        super().__init__()
        n_kv_heads = n_head if n_kv_heads is None else n_kv_heads
        self.n_embd, self.n_head, self.n_kv_heads, self.causal = n_embd, n_head, n_kv_heads, True
        self.head_dim = n_embd // n_head
        self.rope_layout, self.rope_base = (rope_layout if rope else None), rope_base
        self.q_projection = Linear(n_embd, n_embd, bias)
        self.k_projection = Linear(n_embd, n_kv_heads * self.head_dim, bias)
        self.v_projection = Linear(n_embd, n_kv_heads * self.head_dim, bias)
        self.out_projection = Linear(n_embd, n_embd, bias)
        self.dropout = Dropout(p_dropout)
        self.out_dropout = Dropout(p_dropout)

    def heads(self, x, n_heads: int):
        """(B, S, n·Dh) -> (B, n, S, Dh)."""
        batch_size, seq_len, _ = x.shape
        # (B, S, n·Dh) -> (B, S, n, Dh) -> (B, n, S, Dh)
        return x.view(batch_size, seq_len, n_heads, self.head_dim).transpose(1, 2)

    def forward(self, x, pad_mask=None):
        batch_size, seq_len, _ = x.shape
        q = self.heads(self.q_projection(x), self.n_head)
        k = self.heads(self.k_projection(x), self.n_kv_heads)
        v = self.heads(self.v_projection(x), self.n_kv_heads)
        if self.rope_layout is not None:
            q = apply_rope(q, self.rope_layout, self.rope_base)
            k = apply_rope(k, self.rope_layout, self.rope_base)
        group_size = self.n_head // self.n_kv_heads
        k, v = repeat_kv(k, group_size), repeat_kv(v, group_size)      # -> (B, h, S, Dh)
        # (B, h, S, Dh) @ (B, h, Dh, S) -> (B, h, S, S)
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        scores = scores + torch_ref.MultiHeadAttention.create_causal_mask(seq_len, x.dtype)
        if pad_mask is not None:
            pad = torch.as_tensor(check_pad_mask(pad_mask, batch_size, seq_len))
            # (B, S) -> (B, 1, 1, S): no query sees a padded key
            scores = scores + torch.where(pad, MASK_VALUE, 0.0).to(x.dtype)[:, None, None, :]
        weights = torch.softmax(scores, dim=-1)                        # (B, h, S, S)
        # (B, h, S, S) -> (B, n_kv, g, S, S): our dropout's mask has llama.py's group axis
        grouped = weights.view(batch_size, self.n_kv_heads, group_size, seq_len, seq_len)
        # (B, n_kv, g, S, S) -> (B, h, S, S)
        weights = self.dropout(grouped).view(batch_size, self.n_head, seq_len, seq_len)
        # (B, h, S, Dh) -> (B, S, h, Dh) -> (B, S, D)
        out = (weights @ v).transpose(1, 2).reshape(batch_size, seq_len, self.n_embd)
        return self.out_dropout(self.out_projection(out))


class TransformerLayer(torch_ref.TransformerLayer):
    """forward is torch_ref.TransformerLayer's (Pre-LN); nn.Module.__init__ directly, because the
    parent's would build GPT's parts."""

    def __init__(self, n_embd: int, n_head: int, n_kv_heads: int | None = None,
                 p_dropout: float = 0.1, ln_eps: float = 1e-5, bias: bool = True,
                 norm: str = "layernorm", ffn: str = "gelu", middle_dim: int | None = None,
                 rope: bool = False, rope_layout: str = "rotate_half", rope_base: float = 10000.0):
        nn.Module.__init__(self)
        self.pre_ln = True
        self.ln_1 = make_norm(norm, n_embd, ln_eps)
        self.ln_2 = make_norm(norm, n_embd, ln_eps)
        self.attention = GroupedQueryAttention(n_embd, n_head, n_kv_heads, p_dropout, bias, rope,
                                               rope_layout, rope_base)
        self.ff = (FeedForward(n_embd, middle_dim=middle_dim, p_dropout=p_dropout, bias=bias)
                   if ffn == "gelu" else SwiGLU(n_embd, middle_dim, p_dropout=p_dropout))


class DecoderLM(torch_ref.DecoderLM):
    """embed and forward are torch_ref.DecoderLM's (RoPE adds nothing at the embedding). Its
    __init__ builds the embeddings and the head with no layers; the layers and the final norm are
    then replaced in place, so the parameter names keep their order."""

    def __init__(self, n_vocab: int, n_embd: int, n_head: int, n_positions: int, n_layers: int = 4,
                 p_dropout: float = 0.1, ln_eps: float = 1e-5, bias: bool = True,
                 tie_weights: bool = False, norm: str = "layernorm", ffn: str = "gelu",
                 positions: str = "learned", n_kv_heads: int | None = None,
                 middle_dim: int | None = None, rope_layout: str = "rotate_half",
                 rope_base: float = 10000.0):
        # as llama.DecoderLM refuses them: torch_ref would build no positions for a misspelt one
        for name, value, choices in (("positions", positions, llama.POSITIONS),
                                     ("norm", norm, llama.NORMS), ("ffn", ffn, llama.FFNS)):
            llama.check_choice("llama_ref.DecoderLM", name, value, choices)
        super().__init__(n_vocab, n_embd, n_head, n_positions, n_layers=0, p_dropout=p_dropout,
                         ln_eps=ln_eps, bias=bias, tie_weights=tie_weights, positions=positions)
        self.layers = nn.ModuleList(
            TransformerLayer(n_embd, n_head, n_kv_heads, p_dropout=p_dropout, ln_eps=ln_eps,
                             bias=bias, norm=norm, ffn=ffn, middle_dim=middle_dim,
                             rope=positions == "rope", rope_layout=rope_layout,
                             rope_base=rope_base)
            for _ in range(n_layers))
        self.ln = make_norm(norm, n_embd, ln_eps)
