"""HW3's Transformer modules, built only from lecture 5's tensor.py primitives (notes §9.1).

Not one line of backward is written here: every module is a composition of tensor.py's primitives
(add, sub, mul, exp, log, sigmoid, matmul, sum, max, view, permute, contiguous, embedding), so
autodiff differentiates all of it. torch_ref.py is the PyTorch twin with the same names.

The file in reading order, each section under a ruler, with the part of the notes (and of the
paper, Vaswani et al. 2017) it follows:
- set_seed ........................... the two random generators
- logsumexp, softmax, gelu ........... §9.1 (max subtracted; tanh GELU as x·sigmoid(2u))
- sinusoidal_frequencies, _positions . §4.2
- softmax_loss, lm_loss .............. §9.1 HW3 Problem 1 (logsumexp(z) - z_y); next-token loss
- check_sizes, check_pad_mask ........ the checks behind the modules' error messages
- Parameter, Module .................. named parameters, train/eval, parameter counts
- Linear, Embedding, Dropout ......... §4.1, §7.2 (inverted dropout; identity in eval mode)
- LayerNorm .......................... §5.3 (biased variance, eps inside the sqrt, like torch)
- MultiHeadAttention ................. §2.2-§2.3, §3.1-§3.3 (causal / pad masks, cross-attention)
- FeedForward ........................ §5.1 (tanh GELU as GPT-2 and HW3; ReLU as the paper)
- TransformerLayer ................... §5.4: Pre-LN by default (GPT-2, HW3), Post-LN: pre_ln=False
- DecoderLM .......................... §6.3 (GPT-2 / HW3: embeddings, dropout, N layers, LN, head)
- EncoderLayer, DecoderLayer ......... §3.3, §6.1 (the paper's layers: Post-LN and ReLU by default)
- EncoderDecoder ..................... §1.1, §4.1, §4.4, §6.1-§6.2, §7.1 (the paper's model)
- KVCache, Generation ................ §2.3, §7.6, exercise 11 (what generate() keeps and returns)
- _decode, _beam_search ............. §7.6: greedy, sampling (temperature, top-k, top-p) and
                                       the paper's beam search with a length penalty
- SGD, Adam, noam_lr ................. §7.5 (Adam as torch.optim.Adam; the paper's learning rate)
- fused .............................. beyond the notes (03 part 7, 06 part 6): inside
                                       `with fused():` LayerNorm, gelu and the attention core
                                       call tensor.py's fused primitives, backward derived by hand

Masks, written down once: an additive mask holds 0 where a query may look and MASK_VALUE (-1e9,
tensor.py's, so that its flash core adds the same) where it may not. In float64, exp(-1e9 - m) is
exactly 0, and a fully masked row still gets finite weights summing to 1 instead of nan (a real
-inf would give nan; notes §2.3). They are uniform only if its scores are equal: float64 keeps
s - 1e9 apart for different s (float32 would round them together). MultiHeadAttention makes its
causal mask in one place, self_attention (a KV cache's mask: KVCache.causal_mask).
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

import paths  # noqa: F401  (makes lecture 5's tensor.py importable)
import tensor
from tensor import MASK_VALUE, Tensor, embedding, no_grad   # MASK_VALUE: see "Masks" above


# ---- seeds ---------------------------------------------------------------------------------------
# One generator for parameter initialisation and one for dropout masks; set_seed resets both.
_init_rng = np.random.default_rng(0)
_dropout_rng = np.random.default_rng(1)


def set_seed(seed: int):
    global _init_rng, _dropout_rng
    _init_rng = np.random.default_rng(seed)
    _dropout_rng = np.random.default_rng(seed + 1_000_003)


# ---- functions: softmax, GELU, sinusoidal positions (§9.1, §4.2) ---------------------------------
def logsumexp(x: Tensor, dim: int = -1) -> Tensor:
    """log Σ exp(x) along dim, keepdims. The max is subtracted first so nothing overflows.

    As torch.logsumexp: a row of -inf gives -inf, a row holding +inf gives +inf (the shift is 0
    there, since subtracting an infinite max would give inf - inf = nan)."""
    # m is a constant: exact, since the result does not depend on m
    m = x.max(axis=dim, keepdims=True, finite=True)
    return (x - m).exp().sum(axis=dim, keepdims=True).log() + m


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """exp((x - m) - log Σ exp(x - m)): no division, no overflow. The max m is subtracted before
    anything else, so the result keeps full precision even where |x| is huge (exp(x - logsumexp(x))
    would lose it to rounding in logsumexp ≈ m: a row of -1e9 would give 0.2499999990, not 1/4)."""
    shifted = x - x.max(axis=dim, keepdims=True)     # the max is a constant (see logsumexp)
    return (shifted - shifted.exp().sum(axis=dim, keepdims=True).log()).exp()


def gelu(x: Tensor) -> Tensor:
    """tanh GELU 0.5x(1 + tanh u) written as x·sigmoid(2u), u = √(2/π)(x + 0.044715x³)
    (notes §9.1)."""
    if _fusion is not None:   # beyond the notes: one launch each way (see fused(), at the end)
        return tensor.gelu(x)
    u = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
    return x * (u * 2.0).sigmoid()


def sinusoidal_frequencies(d: int, base: float = 10000.0) -> np.ndarray:
    """(d/2,) angular frequencies ω_i = base^(-2i/d) of the sinusoidal encoding's (sin, cos)
    pairs."""
    if d % 2:
        raise ValueError(f"sinusoidal_positions: d must be even (sin/cos pairs), got {d}")
    return base ** (-np.arange(0, d, 2, dtype=np.float64) / d)


def sinusoidal_positions(n_positions: int, d: int, base: float = 10000.0) -> np.ndarray:
    """PE[t, 2i] = sin(t ω_i), PE[t, 2i+1] = cos(t ω_i), ω_i = base^(-2i/d) (notes §4.2).

    Returns:
        (n_positions, d) float64 array (a constant: it has no parameters)
    """
    omega = sinusoidal_frequencies(d, base)
    t = np.arange(n_positions, dtype=np.float64)[:, None]
    pe = np.empty((n_positions, d))
    pe[:, 0::2] = np.sin(t * omega)
    pe[:, 1::2] = np.cos(t * omega)
    return pe


# ---- losses (§9.1, HW3 Problem 1) ----------------------------------------------------------------
def softmax_loss(logits: Tensor, target) -> Tensor:
    """HW3 Problem 1: per-example cross-entropy logsumexp(z) - z_y.

    Args:
        logits: (N, C)
        target: (N,) integer class ids
    Returns:
        loss: (N,); its gradient with respect to logits is softmax(z) - onehot(y)
    """
    target = np.asarray(target)
    if logits.ndim != 2 or target.shape != logits.shape[:1]:
        raise ValueError(f"softmax_loss: expected logits (N, C) and target (N,), "
                         f"got {logits.shape} and {target.shape}")
    if target.size == 0:
        target = target.astype(np.int64)  # an empty list arrives as float64
    if not np.issubdtype(target.dtype, np.integer):
        raise TypeError(f"softmax_loss: target must hold integer class ids, got dtype "
                        f"{target.dtype} (class probabilities are not supported)")
    n_classes = logits.shape[1]
    if target.size and (target.min() < 0 or target.max() >= n_classes):
        raise IndexError(f"softmax_loss: target ids must lie in 0..{n_classes - 1}, "
                         f"got min {target.min()}, max {target.max()}")
    # z_y by lookup: the N·C logits as a table of one-number rows. (A one-hot multiply would make
    # -inf · 0 = nan wherever a row holds an infinite logit; torch gathers too.)
    flat = (logits if logits.is_contiguous() else logits.contiguous()).view(-1, 1)
    picked = embedding(flat, np.arange(len(target)) * n_classes + target).view(-1)   # (N,)
    return logsumexp(logits, dim=1).view(-1) - picked


def lm_loss(logits: Tensor, targets, ignore_index: int = -100) -> Tensor:
    """Mean next-token cross-entropy: (B, S, V) logits, (B, S) targets.

    Positions whose target is ignore_index are left out, as in F.cross_entropy (same default, -100):
    the mean is over the other positions, and the ignored ones get exactly zero gradient. Use it for
    padding, or to train only on the target half of a decoder-only translation (notes §6.3).
    """
    batch_size, seq_len, n_vocab = logits.shape
    targets = np.asarray(targets).reshape(-1)
    keep = targets != ignore_index
    n_kept = int(keep.sum())
    if n_kept == 0:  # F.cross_entropy returns nan here
        raise ValueError(f"lm_loss: every target is ignore_index={ignore_index}, so there is no "
                         f"position to average over")
    losses = softmax_loss(logits.view(batch_size * seq_len, n_vocab), np.where(keep, targets, 0))
    if n_kept == targets.size:
        return losses.mean()
    return (losses * (keep / n_kept)).sum()   # ignored positions weigh 0: no loss, no gradient


# ---- checks behind the error messages ------------------------------------------------------------
def check_sizes(owner: str, **sizes):
    """Each size=(value, least allowed) must be an int (not a bool) of at least that value."""
    for name, (value, least) in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise ValueError(f"{owner}: {name} must be an integer >= {least}, got {value!r}")


def check_pad_mask(pad_mask) -> np.ndarray:
    """pad_mask as a bool array; 0/1 numbers are refused, because conventions disagree on which
    is which."""
    pad_mask = np.asarray(pad_mask)
    if pad_mask.dtype != bool:
        raise TypeError(f"pad_mask must be a bool array with True at padded positions, got dtype "
                        f"{pad_mask.dtype}; HuggingFace's attention_mask is the opposite "
                        f"(1 = keep, 0 = pad), so pass attention_mask == 0")
    return pad_mask


# ---- Module: parameters, sub-modules, train/eval -------------------------------------------------
class Parameter(Tensor):
    def __init__(self, data):
        super().__init__(np.array(data, dtype=np.float64), requires_grad=True)


class Module:
    """Parameters and sub-modules are found by walking attributes, in the order they were set."""
    training = True

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def named_children(self):
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value
            elif (isinstance(value, (list, tuple)) and value
                  and all(isinstance(v, Module) for v in value)):
                for i, v in enumerate(value):
                    yield f"{name}.{i}", v

    def named_modules(self, prefix: str = ""):
        yield prefix, self
        for name, child in self.named_children():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def named_parameters(self):
        """(name, Parameter) pairs; a parameter shared by two modules (tied weights) appears
        once."""
        seen = set()
        for module_name, module in self.named_modules():
            for name, value in vars(module).items():
                if isinstance(value, Parameter) and id(value) not in seen:
                    seen.add(id(value))
                    yield (f"{module_name}.{name}" if module_name else name), value

    def parameters(self):
        return [p for _, p in self.named_parameters()]

    def num_parameters(self) -> int:
        return sum(p.data.size for p in self.parameters())

    def zero_grad(self):
        for p in self.parameters():
            p.grad = None

    def train(self, mode: bool = True):
        for _, module in self.named_modules():
            module.training = mode
        return self

    def eval(self):
        return self.train(False)


# ---- Linear, Embedding, Dropout, LayerNorm (§4.1, §7.2, §5.3) ------------------------------------
class Linear(Module):
    """y = x W + b with W stored (in_size, out_size), as HW3 stores it; PyTorch's default init."""

    def __init__(self, in_size: int, out_size: int, bias: bool = True):
        bound = 1.0 / math.sqrt(in_size)
        self.in_size, self.out_size = in_size, out_size
        self.weights = Parameter(_init_rng.uniform(-bound, bound, (in_size, out_size)))
        self.bias = Parameter(_init_rng.uniform(-bound, bound, (out_size,))) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        """
        Args:
            x: (..., in_size)
        Returns:
            (..., out_size)
        """
        if x.shape[-1] != self.in_size:
            raise ValueError(f"Linear({self.in_size}, {self.out_size}): input's last dimension is "
                             f"{x.shape[-1]} (shape {x.shape}), expected {self.in_size}")
        y = x @ self.weights
        return y + self.bias if self.bias is not None else y


class Embedding(Module):
    """A table of num_embeddings rows, initialised N(0, std²) (std = 1 as torch.nn.Embedding)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, std: float = 1.0):
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weights = Parameter(_init_rng.standard_normal((num_embeddings, embedding_dim)) * std)

    def forward(self, ids) -> Tensor:
        """
        Args:
            ids: (B, S) integer ids
        Returns:
            (B, S, embedding_dim)
        """
        return embedding(self.weights, ids)


class Dropout(Module):
    """Inverted dropout: keep with probability 1-p and scale kept values by 1/(1-p); eval: identity.

    The scaled mask of the last call is kept in `last_mask`, so that torch_ref's twin can apply
    exactly the same one; a mask can also be passed in.
    """

    def __init__(self, p_dropout: float = 0.1):
        if not 0.0 <= p_dropout < 1.0:
            raise ValueError(f"Dropout: p_dropout must be in [0, 1), got {p_dropout}")
        self.p_dropout = p_dropout
        self.last_mask = None

    def forward(self, x: Tensor, mask: np.ndarray | None = None) -> Tensor:
        if not self.training or self.p_dropout == 0.0:
            return x
        if mask is None:
            keep = _dropout_rng.random(x.shape) >= self.p_dropout
            mask = keep / (1.0 - self.p_dropout)
        self.last_mask = mask
        return x * mask


class LayerNorm(Module):
    """y = (x - μ) / √(σ² + eps) · weights + bias over the last dimension (biased σ², like
    torch)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        self.dim, self.eps = dim, eps
        self.weights = Parameter(np.ones(dim))
        self.bias = Parameter(np.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:
        """
        Args:
            x: (..., dim)
        Returns:
            (..., dim), each row normalised on its own
        """
        if x.shape[-1] != self.dim:
            raise ValueError(f"LayerNorm({self.dim}): input's last dimension is {x.shape[-1]} "
                             f"(shape {x.shape})")
        if _fusion is not None:   # beyond the notes: one launch each way (see fused(), at the end)
            return tensor.layer_norm(x, self.weights, self.bias, self.eps)
        centred = x - x.mean(axis=-1, keepdims=True)
        variance = (centred * centred).mean(axis=-1, keepdims=True)
        inv_std = ((variance + self.eps).log() * -0.5).exp()  # 1/√(σ² + eps) from exp and log
        return centred * inv_std * self.weights + self.bias


# ---- multi-head attention (§2.2-§2.3, §3) --------------------------------------------------------
class MultiHeadAttention(Module):
    """softmax(q kᵀ/√Dh + mask) v in h heads, then out_projection (notes §2.2, §3)."""

    def __init__(self, n_embd: int, n_head: int, causal: bool = True, p_dropout: float = 0.1,
                 bias: bool = True):
        check_sizes("MultiHeadAttention", n_embd=(n_embd, 1), n_head=(n_head, 1))
        if n_embd % n_head:
            raise ValueError(f"MultiHeadAttention: n_embd={n_embd} is not divisible by "
                             f"n_head={n_head}")
        self.n_embd, self.n_head, self.causal = n_embd, n_head, causal
        self.attn_hidden_dim = n_embd // n_head
        self.q_projection = Linear(n_embd, n_embd, bias=bias)
        self.k_projection = Linear(n_embd, n_embd, bias=bias)
        self.v_projection = Linear(n_embd, n_embd, bias=bias)
        self.out_projection = Linear(n_embd, n_embd, bias=bias)
        self.dropout = Dropout(p_dropout)       # on the attention weights, as GPT-2
        self.out_dropout = Dropout(p_dropout)   # on the sub-layer's output, before the residual
        self.last_attention = None              # (B, h, S_q, S_k) weights of the last forward

    @staticmethod
    def create_causal_mask(seq_len: int) -> Tensor:
        """(1, 1, S, S): 0 on and below the diagonal, MASK_VALUE above it (the future)."""
        return Tensor(MASK_VALUE * np.triu(np.ones((1, 1, seq_len, seq_len)), k=1))

    @staticmethod
    def create_pad_mask(pad_mask) -> Tensor:
        """(B, S_k) with True at padded keys -> additive (B, 1, 1, S_k): no query sees a pad."""
        return Tensor(np.where(check_pad_mask(pad_mask), MASK_VALUE, 0.0)[:, None, None, :])

    def _split_heads(self, x: Tensor, dims=(0, 2, 1, 3)) -> Tensor:
        batch_size, seq_len, _ = x.shape
        # (B, S, D) -> (B, S, h, Dh)
        x = x.view(batch_size, seq_len, self.n_head, self.attn_hidden_dim)
        return x.permute(*dims)        # -> (B, h, S, Dh) by default, no copy

    def project_to_query_key_value(self, x: Tensor, kv: Tensor | None = None):
        """
        Args:
            x: (B, S_q, D) queries' source; kv: (B, S_k, D) keys' and values' source (default x)
        Returns:
            q:  (B, h, S_q, Dh)
            kT: (B, h, Dh, S_k)
            v:  (B, h, S_k, Dh)
        """
        kv = x if kv is None else kv
        q = self._split_heads(self.q_projection(x))
        # (B, S, h, Dh) -> (B, h, Dh, S) at once
        kT = self._split_heads(self.k_projection(kv), (0, 2, 3, 1))
        v = self._split_heads(self.v_projection(kv))
        return q, kT, v

    def self_attention(self, q: Tensor, kT: Tensor, v: Tensor, mask: Tensor | None = None,
                       causal: bool = False) -> Tensor:
        """
        Args:
            q: (B, h, S_q, Dh), kT: (B, h, Dh, S_k), v: (B, h, S_k, Dh)
            mask: additive, broadcastable to (B, h, S_q, S_k); pad masks, a KV cache's mask
            causal: also hide the future (forward passes self.causal); the causal mask is made here
        Returns:
            (B, S_q, D): heads concatenated, before out_projection
        """
        batch_size, n_head, seq_len, head_dim = q.shape
        if causal and kT.shape[-1] != seq_len:
            raise ValueError("MultiHeadAttention: a causal mask needs as many keys as queries; "
                             "use causal=False for cross-attention")
        if _fusion is not None and _fusion["flash"]:
            # beyond the notes: the whole core in one launch (see fused(), at the end of the file)
            out = self._flash_core(q, kT, v, mask, causal)            # (B, h, S_q, Dh)
        else:
            if causal:
                causal_mask = self.create_causal_mask(seq_len)
                mask = causal_mask if mask is None else causal_mask + mask
            if _fusion is None:
                scores = (q @ kT) * (1.0 / math.sqrt(head_dim))     # (B, h, S_q, S_k)
                if mask is not None:
                    scores = scores + mask
                weights = softmax(scores, dim=-1)
            else:   # beyond the notes: scale, mask and softmax in one launch (see fused())
                weights = tensor.softmax(q @ kT, 1.0 / math.sqrt(head_dim), mask)
            self.last_attention = weights
            out = self.dropout(weights) @ v                       # (B, h, S_q, Dh)
        out = out.permute(0, 2, 1, 3).contiguous()       # -> (B, S_q, h, Dh), copied once
        return out.view(batch_size, seq_len, n_head * head_dim)  # -> (B, S_q, D)

    def _flash_core(self, q: Tensor, kT: Tensor, v: Tensor, mask: Tensor | None,
                    causal: bool) -> Tensor:
        """Beyond the notes, under fused(flash=True): softmax(q kᵀ/√Dh + mask) v in one launch over
        key blocks, the causal mask made from positions inside it. It never forms the attention
        weights, so it keeps none (last_attention is None) and cannot drop them."""
        if self.training and self.dropout.p_dropout > 0:
            raise ValueError(f"MultiHeadAttention: the flash core never forms the attention "
                             f"weights, so it cannot apply dropout {self.dropout.p_dropout:g} to "
                             f"them; call .eval(), build the model with p_dropout=0, or use "
                             f"fused(flash=False)")
        self.last_attention = None
        return tensor.flash_attention(q, kT, v, mask, causal, _fusion["block_size"])

    def forward(self, x: Tensor, kv: Tensor | None = None, pad_mask=None,
                cache: KVCache | None = None) -> Tensor:
        """
        Args:
            x: (B, S, D); kv: (B, S_k, D) for cross-attention; pad_mask: (B, S_k), True at pads
            cache: decoding only (see KVCache); x then holds just the new positions
        Returns:
            (B, S, D)
        """
        if x.ndim != 3 or x.shape[-1] != self.n_embd:
            raise ValueError(f"MultiHeadAttention: expected x of shape (B, S, {self.n_embd}), "
                             f"got {x.shape}")
        if cache is not None:
            heads = self._attend_with_cache(x, kv, pad_mask, cache)
            return self.out_dropout(self.out_projection(heads))
        q, kT, v = self.project_to_query_key_value(x, kv)
        mask = None
        if pad_mask is not None:
            mask = self.create_pad_mask(pad_mask)
            if mask.shape[0] != x.shape[0] or mask.shape[-1] != kT.shape[-1]:
                raise ValueError(f"MultiHeadAttention: pad_mask must have shape (B, S_k) = "
                                 f"({x.shape[0]}, {kT.shape[-1]}), got {np.shape(pad_mask)}")
        heads = self.self_attention(q, kT, v, mask, causal=self.causal)
        return self.out_dropout(self.out_projection(heads))

    def _attend_with_cache(self, x: Tensor, kv, pad_mask, cache: KVCache) -> Tensor:
        """(B, n, D) new positions -> (B, n, D) heads concatenated, keys and values from the
        cache."""
        if cache.capacity is None:      # cross-attention: project the encoder output once
            if cache.kT is None:
                if kv is None:
                    raise ValueError("MultiHeadAttention: a cross-attention cache needs kv= (the "
                                     "encoder output) on its first step")
                q, cache.kT, cache.v = self.project_to_query_key_value(x, kv)
            else:
                q = self._split_heads(self.q_projection(x))   # (B, n, D) -> (B, h, n, Dh)
            mask = None
            if pad_mask is not None:
                mask = self.create_pad_mask(pad_mask)
                if mask.shape[0] != x.shape[0] or mask.shape[-1] != cache.kT.shape[-1]:
                    raise ValueError(f"MultiHeadAttention: pad_mask must have shape (B, S_k) = "
                                     f"({x.shape[0]}, {cache.kT.shape[-1]}), "
                                     f"got {np.shape(pad_mask)}")
            return self.self_attention(q, cache.kT, cache.v, mask)
        if not self.causal or kv is not None or pad_mask is not None:
            raise ValueError("MultiHeadAttention: a KV cache with a capacity serves causal "
                             "self-attention without padding; for cross-attention use KVCache() "
                             "(capacity None)")
        q, kT_new, v_new = self.project_to_query_key_value(x)
        cache.write(kT_new, v_new)
        return self.self_attention(q, cache.kT, cache.v, cache.causal_mask(x.shape[1]))


# ---- feed-forward, the layer, the decoder-only LM (§5.1, §5.4, §6.3) -----------------------------
ACTIVATIONS = ("gelu", "relu")


class FeedForward(Module):
    """linear_out(act(linear_in(x))), middle_dim = 4·n_embd by default (notes §5.1).

    activation: "gelu" (tanh GELU: GPT-2, HW3; the default) or "relu" (the 2017 paper, torch.nn's
    default).
    """

    def __init__(self, n_embd: int, middle_dim: int | None = None, p_dropout: float = 0.1,
                 bias: bool = True, activation: str = "gelu"):
        if activation not in ACTIVATIONS:
            raise ValueError(f"FeedForward: activation must be 'gelu' or 'relu', "
                             f"got {activation!r}")
        middle_dim = 4 * n_embd if middle_dim is None else middle_dim
        self.activation = activation
        self.linear_in = Linear(n_embd, middle_dim, bias=bias)
        self.linear_out = Linear(middle_dim, n_embd, bias=bias)
        self.dropout = Dropout(p_dropout)

    def forward(self, x: Tensor) -> Tensor:
        """
        Args:
            x: (B, S, D)
        Returns:
            (B, S, D)
        """
        hidden = self.linear_in(x)
        hidden = gelu(hidden) if self.activation == "gelu" else hidden.relu()
        return self.dropout(self.linear_out(hidden))


class TransformerLayer(Module):
    """One layer; pre_ln=True (default, GPT-2/HW3) or False (the 2017 paper), notes §5.4.

    Pre-LN:  x = x + attention(ln_1(x));  x = x + ff(ln_2(x))
    Post-LN: x = ln_1(x + attention(x));  x = ln_2(x + ff(x))
    """

    def __init__(self, n_embd: int, n_head: int, p_dropout: float = 0.1, ln_eps: float = 1e-5,
                 bias: bool = True, causal: bool = True, pre_ln: bool = True,
                 middle_dim: int | None = None, activation: str = "gelu"):
        self.pre_ln = pre_ln
        self.ln_1 = LayerNorm(n_embd, eps=ln_eps)
        self.ln_2 = LayerNorm(n_embd, eps=ln_eps)
        self.attention = MultiHeadAttention(n_embd, n_head, causal=causal, p_dropout=p_dropout,
                                            bias=bias)
        self.ff = FeedForward(n_embd, middle_dim=middle_dim, p_dropout=p_dropout, bias=bias,
                              activation=activation)

    def forward(self, x: Tensor, pad_mask=None, cache: KVCache | None = None) -> Tensor:
        """
        Args:
            x: (B, S, D); pad_mask: (B, S), True at padded positions; cache: decoding only
        Returns:
            (B, S, D)
        """
        if self.pre_ln:
            x = x + self.attention(self.ln_1(x), pad_mask=pad_mask, cache=cache)
            return x + self.ff(self.ln_2(x))
        x = self.ln_1(x + self.attention(x, pad_mask=pad_mask, cache=cache))
        return self.ln_2(x + self.ff(x))


class DecoderLM(Module):
    """GPT-2 / HW3 decoder-only LM (notes §6.3):
    token + position embeddings -> dropout -> n_layers layers -> ln -> lm_head.

    positions: "learned" (a table, GPT-2/HW3), "sinusoidal" (the 2017 paper), or "none".
    tie_weights: lm_head reuses token_embeddings (GPT-2, the paper; notes §4.1).
    The final LayerNorm `ln` exists for Pre-LN (GPT-2's ln_f); a Post-LN stack already ends in one.
    """

    def __init__(self, n_vocab: int, n_embd: int, n_head: int, n_positions: int, n_layers: int = 4,
                 p_dropout: float = 0.1, ln_eps: float = 1e-5, bias: bool = True,
                 pre_ln: bool = True, causal: bool = True, tie_weights: bool = False,
                 positions: str = "learned", middle_dim: int | None = None):
        if positions not in ("learned", "sinusoidal", "none"):
            raise ValueError(f"DecoderLM: positions must be 'learned', 'sinusoidal' or 'none', "
                             f"got {positions!r}")
        check_sizes("DecoderLM", n_vocab=(n_vocab, 1), n_layers=(n_layers, 0))
        self.n_vocab, self.n_embd, self.n_positions = n_vocab, n_embd, n_positions
        self.positions, self.tie_weights = positions, tie_weights
        self.token_embeddings = Embedding(n_vocab, n_embd)
        self.position_embeddings = (Embedding(n_positions, n_embd) if positions == "learned"
                                    else None)
        self.dropout = Dropout(p_dropout)
        self.layers = [TransformerLayer(n_embd, n_head, p_dropout=p_dropout, ln_eps=ln_eps,
                                        bias=bias, causal=causal, pre_ln=pre_ln,
                                        middle_dim=middle_dim) for _ in range(n_layers)]
        self.ln = LayerNorm(n_embd, eps=ln_eps) if pre_ln else None
        self.lm_head = None if tie_weights else Linear(n_embd, n_vocab, bias=False)

    def embed(self, idx, start: int = 0) -> Tensor:
        """(B, S) ids at positions start.. -> (B, S, D) token + position embeddings."""
        idx = np.asarray(idx)
        if idx.ndim != 2:
            raise ValueError(f"DecoderLM: expected token ids of shape (B, S), got {idx.shape}")
        seq_len = start + idx.shape[1]      # with a cache, the positions before start count too
        # only a table has a last row
        if self.positions == "learned" and seq_len > self.n_positions:
            missing = (f"position {seq_len - 1}" if seq_len == self.n_positions + 1
                       else f"positions {self.n_positions}..{seq_len - 1}")
            raise ValueError(f"DecoderLM: sequence length {seq_len} exceeds "
                             f"n_positions={self.n_positions}: the learned position table has no "
                             f"row for {missing}; shorten the input or build the model with a "
                             f"larger n_positions")
        x = self.token_embeddings(idx)
        if self.positions == "learned":
            # (1, S, D), broadcast over B
            x = x + self.position_embeddings(np.arange(start, seq_len)[None, :])
        elif self.positions == "sinusoidal":
            # (S, D) -> (1, S, D)
            x = x + sinusoidal_positions(seq_len, self.n_embd)[start:][None]
        return x

    def forward(self, idx, pad_mask=None, cache: list | None = None) -> Tensor:
        """
        Args:
            idx: (B, S) token ids; pad_mask: (B, S), True at padded positions
            cache: decoding only, from new_cache; idx then holds just the positions not yet cached
        Returns:
            logits: (B, S, n_vocab)
        """
        if cache is not None and len(cache) != len(self.layers):
            raise ValueError(f"DecoderLM: cache has {len(cache)} entries for {len(self.layers)} "
                             f"layers; make it with new_cache")
        x = self.dropout(self.embed(idx, start=0 if cache is None else cache[0].length))
        for i, layer in enumerate(self.layers):
            x = layer(x, pad_mask=pad_mask, cache=None if cache is None else cache[i])
        if self.ln is not None:
            x = self.ln(x)
        if self.tie_weights:
            # (B, S, D) @ (D, V) -> (B, S, V)
            return x @ self.token_embeddings.weights.permute(1, 0)
        return self.lm_head(x)

    def new_cache(self, capacity: int) -> list:
        """One KVCache per layer, for up to `capacity` positions (prompt and generated tokens)."""
        if not self.layers or not all(layer.attention.causal for layer in self.layers):
            raise ValueError("DecoderLM: a KV cache needs causal self-attention layers "
                             "(causal=True)")
        if self.positions == "learned" and capacity > self.n_positions:
            raise ValueError(f"DecoderLM: a KV cache of {capacity} positions exceeds n_positions="
                             f"{self.n_positions}: the learned position table has no row past "
                             f"position {self.n_positions - 1}; ask for at most {self.n_positions}")
        return [KVCache(capacity) for _ in self.layers]

    def generate(self, prompt, max_new_tokens: int, *, sample: bool = False,
                 temperature: float = 1.0, rng=None, end_id: int | None = None, pad_id: int = 0,
                 use_cache: bool = True, num_beams: int = 1, length_penalty: float = 0.0,
                 top_k: int | None = None, top_p: float = 1.0) -> "Generation":
        """Continue every prompt row by up to max_new_tokens tokens, one per step (exercise 11).

        Args:
            prompt: (B, P) token ids, P >= 1 (rows of equal length: no padding)
            max_new_tokens: >= 0; with learned positions P + max_new_tokens must fit in n_positions
            sample: False: greedy (the argmax); True: draw from softmax(logits / temperature) with
                rng, a np.random.Generator (or an int seed), so a seed fixes every draw
            top_k, top_p: sampling only: draw from the top_k largest logits, then from the
                smallest set of those whose probability reaches top_p (nucleus sampling)
            num_beams: 1 greedy; k > 1 beam search with k hypotheses per row (see _beam_search)
            length_penalty: beam search's α: finished text ranked by its sum of log-probabilities
                / ((5 + |Y|)/6)^α; 0 (the default) by the sum alone, 0.6 the paper's
            end_id: a row stops after this token; later steps give it pad_id
            use_cache: False reruns the whole prefix every step (the baseline the cache is timed
                against)
        Returns:
            Generation: tokens (B, T), lengths (B,), logits (B, T, n_vocab), n_forward,
            positions_computed, scores (B,); num_beams > 1: finished
        """
        prompt = np.asarray(prompt)
        if prompt.ndim != 2 or prompt.shape[1] == 0:
            raise ValueError(f"DecoderLM.generate: expected a prompt of shape (B, P) with P >= 1, "
                             f"got {prompt.shape}")
        rng = _check_decoding("DecoderLM.generate", max_new_tokens, sample, temperature, rng,
                              num_beams, length_penalty, top_k, top_p)
        if not all(layer.attention.causal for layer in self.layers):
            raise ValueError("DecoderLM.generate: the model is not causal (causal=False): each "
                             "position sees the future, so it cannot generate left to right")
        total = prompt.shape[1] + max_new_tokens
        if self.positions == "learned" and total > self.n_positions:
            raise ValueError(f"DecoderLM.generate: prompt length {prompt.shape[1]} + "
                             f"max_new_tokens {max_new_tokens} = {total} exceeds "
                             f"n_positions={self.n_positions}: the learned position table has no "
                             f"row past position {self.n_positions - 1}; ask for at most "
                             f"{max(self.n_positions - prompt.shape[1], 0)} new tokens or build "
                             f"the model with a larger n_positions")
        # the last token is only returned, never fed back: the cache needs total - 1 positions
        cache = (self.new_cache(total - 1) if use_cache and max_new_tokens > 0 and self.layers
                 else None)
        beams = np.repeat(prompt, num_beams, axis=0)      # (B, P) -> (B·k, P): k rows per prompt

        def step(generated):
            if cache is None:
                # (B·k, P + t): the whole prefix
                ids = np.concatenate([beams, generated], axis=1)
            else:
                # only what is not cached
                ids = beams if generated.shape[1] == 0 else generated[:, -1:]
            return _last_position(self(ids, cache=cache)), ids.shape[1]

        with _decoding(self):
            return _decode(step, np.full(prompt.shape[0], max_new_tokens), self.n_vocab, sample,
                           temperature, rng, end_id, pad_id, num_beams, length_penalty, top_k,
                           top_p, reorder=None if cache is None else _reorder(cache))


# ---- the paper's encoder-decoder (§3.3, §6.1-§6.2) -----------------------------------------------
class EncoderLayer(TransformerLayer):
    """Encoder layer of the paper (notes §6.1): self-attention that sees the whole source (not
    causal, padded keys hidden), then the FFN. Post-LN by default as in the paper, Pre-LN with
    pre_ln=True; ReLU by default as in the paper. A TransformerLayer with those defaults: same
    names, same forward.
    """

    def __init__(self, n_embd: int, n_head: int, p_dropout: float = 0.1, ln_eps: float = 1e-5,
                 bias: bool = True, pre_ln: bool = False, middle_dim: int | None = None,
                 activation: str = "relu"):
        super().__init__(n_embd, n_head, p_dropout=p_dropout, ln_eps=ln_eps, bias=bias,
                         causal=False, pre_ln=pre_ln, middle_dim=middle_dim,
                         activation=activation)


class DecoderLayer(Module):
    """Decoder layer of the paper (notes §3.3, §6.1): causal self-attention, cross-attention
    whose keys and values come from the encoder output (padded source positions hidden), then the
    FFN.

    Post-LN (default, the paper):  y = ln_1(y + attention(y))
                                   y = ln_2(y + cross_attention(y, memory))
                                   y = ln_3(y + ff(y))
    Pre-LN (pre_ln=True):          y = y + attention(ln_1(y))
                                   y = y + cross_attention(ln_2(y), memory)
                                   y = y + ff(ln_3(y))
    """

    def __init__(self, n_embd: int, n_head: int, p_dropout: float = 0.1, ln_eps: float = 1e-5,
                 bias: bool = True, pre_ln: bool = False, middle_dim: int | None = None,
                 activation: str = "relu"):
        self.pre_ln = pre_ln
        self.ln_1 = LayerNorm(n_embd, eps=ln_eps)
        self.ln_2 = LayerNorm(n_embd, eps=ln_eps)
        self.ln_3 = LayerNorm(n_embd, eps=ln_eps)
        self.attention = MultiHeadAttention(n_embd, n_head, causal=True, p_dropout=p_dropout,
                                            bias=bias)
        self.cross_attention = MultiHeadAttention(n_embd, n_head, causal=False,
                                                  p_dropout=p_dropout, bias=bias)
        self.ff = FeedForward(n_embd, middle_dim=middle_dim, p_dropout=p_dropout, bias=bias,
                              activation=activation)

    def forward(self, y: Tensor, memory: Tensor, src_pad_mask=None, tgt_pad_mask=None,
                cache=None) -> Tensor:
        """
        Args:
            y: (B, T, D) decoder stream; memory: (B, S, D) encoder output
            src_pad_mask: (B, S), True at padded source positions
            tgt_pad_mask: (B, T), True at pads
            cache: decoding only, a (self-attention KVCache, cross-attention KVCache) pair
        Returns:
            (B, T, D)
        """
        self_cache, cross_cache = (None, None) if cache is None else cache
        if self.pre_ln:
            y = y + self.attention(self.ln_1(y), pad_mask=tgt_pad_mask, cache=self_cache)
            y = y + self.cross_attention(self.ln_2(y), kv=memory, pad_mask=src_pad_mask,
                                         cache=cross_cache)
            return y + self.ff(self.ln_3(y))
        y = self.ln_1(y + self.attention(y, pad_mask=tgt_pad_mask, cache=self_cache))
        y = self.ln_2(y + self.cross_attention(y, kv=memory, pad_mask=src_pad_mask,
                                               cache=cross_cache))
        return self.ln_3(y + self.ff(y))


class EncoderDecoder(Module):
    """The paper's encoder-decoder (notes §1.1, §6.1-§6.2; Vaswani et al. 2017):

        source -> token_embeddings · √d + sinusoidal positions -> encoder_dropout
               -> n_layers EncoderLayers (-> encoder_ln, Pre-LN only) = memory
        target shifted right -> token_embeddings · √d + positions -> decoder_dropout
               -> n_layers DecoderLayers (cross-attending to memory) (-> decoder_ln, Pre-LN only)
               -> logits = y @ token_embeddingsᵀ

    One table serves as source embedding, target embedding and output projection (§4.1); it starts
    N(0, 1/d), so that after the ·√d of §4.4 a token vector has entries of variance 1, the scale of
    the position encoding. Post-LN (the paper) ends every layer in a LayerNorm, so it needs no final
    one; Pre-LN (pre_ln=True) leaves the residual stream unnormalised and adds encoder_ln and
    decoder_ln.

    n_positions: the longest source or target the model accepts (the sinusoidal table is computed
    once for that many positions). bos_id: the token the decoder input starts with (teacher forcing
    shifts the target right by one, putting bos_id in front). Pad masks: bool, True at padded
    positions.
    """

    def __init__(self, n_vocab: int, n_embd: int, n_head: int, n_layers: int = 6,
                 n_positions: int = 1024, p_dropout: float = 0.1, ln_eps: float = 1e-5,
                 bias: bool = True, pre_ln: bool = False, middle_dim: int | None = None,
                 activation: str = "relu", bos_id: int = 1):
        if not 0 <= bos_id < n_vocab:
            raise ValueError(f"EncoderDecoder: bos_id={bos_id} is not a token id "
                             f"(0..{n_vocab - 1})")
        self.n_vocab, self.n_embd, self.n_positions = n_vocab, n_embd, n_positions
        self.bos_id, self.pre_ln = bos_id, pre_ln
        # a constant, not a parameter
        self.position_encoding = sinusoidal_positions(n_positions, n_embd)
        self.token_embeddings = Embedding(n_vocab, n_embd, std=n_embd ** -0.5)
        self.encoder_dropout = Dropout(p_dropout)   # two modules, so each keeps its own last mask
        self.decoder_dropout = Dropout(p_dropout)
        layer_options = dict(p_dropout=p_dropout, ln_eps=ln_eps, bias=bias, pre_ln=pre_ln,
                             middle_dim=middle_dim, activation=activation)
        self.encoder_layers = [EncoderLayer(n_embd, n_head, **layer_options)
                               for _ in range(n_layers)]
        self.encoder_ln = LayerNorm(n_embd, eps=ln_eps) if pre_ln else None
        self.decoder_layers = [DecoderLayer(n_embd, n_head, **layer_options)
                               for _ in range(n_layers)]
        self.decoder_ln = LayerNorm(n_embd, eps=ln_eps) if pre_ln else None

    def _check_ids(self, ids, what: str, start: int = 0) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.ndim != 2 or ids.shape[1] == 0:
            raise ValueError(f"EncoderDecoder: expected {what} token ids of shape (B, S) with "
                             f"S >= 1, got {ids.shape}")
        if start + ids.shape[1] > self.n_positions:
            raise ValueError(f"EncoderDecoder: {what} length {start + ids.shape[1]} exceeds "
                             f"n_positions={self.n_positions}, the longest sequence this model "
                             f"accepts; shorten the {what} or build the model with a larger "
                             f"n_positions")
        return ids

    @staticmethod
    def _check_pad_mask(pad_mask, ids: np.ndarray, name: str, what: str):
        if pad_mask is None:
            return None
        pad_mask = np.asarray(pad_mask)
        if pad_mask.shape != ids.shape:
            raise ValueError(f"EncoderDecoder: {name} must have the shape of the {what} ids "
                             f"{ids.shape} (True at padded positions), got {pad_mask.shape}")
        return pad_mask.astype(bool)

    def embed(self, ids, start: int = 0) -> Tensor:
        """(B, S) ids at positions start.. -> (B, S, D) token_embeddings · √d + sinusoidal
        positions."""
        x = self.token_embeddings(ids) * math.sqrt(self.n_embd)
        return x + self.position_encoding[start:start + ids.shape[1]][None]   # (S, D) -> (1, S, D)

    def shift_right(self, tgt, tgt_pad_mask=None):
        """Teacher forcing's decoder input (notes §7.1): [bos, y_0, ..., y_{T-2}], and its pad
        mask."""
        tgt = np.asarray(tgt)
        bos = np.full((tgt.shape[0], 1), self.bos_id, dtype=tgt.dtype)
        tgt_in = np.concatenate([bos, tgt[:, :-1]], axis=1)                # (B, T) -> (B, T)
        if tgt_pad_mask is None:
            return tgt_in, None
        real = np.zeros((tgt.shape[0], 1), dtype=bool)
        return tgt_in, np.concatenate([real, tgt_pad_mask[:, :-1]], axis=1)  # (B, T) -> (B, T)

    def encode(self, src, src_pad_mask=None) -> Tensor:
        """
        Args:
            src: (B, S) source ids; src_pad_mask: (B, S), True at padded positions
        Returns:
            memory: (B, S, D) the encoder output that every decoder layer cross-attends to
        """
        src = self._check_ids(src, "source")
        src_pad_mask = self._check_pad_mask(src_pad_mask, src, "src_pad_mask", "source")
        x = self.encoder_dropout(self.embed(src))
        for layer in self.encoder_layers:
            x = layer(x, pad_mask=src_pad_mask)
        return self.encoder_ln(x) if self.encoder_ln is not None else x

    def decode(self, tgt_in, memory: Tensor, src_pad_mask=None, tgt_in_pad_mask=None,
               cache: list | None = None) -> Tensor:
        """
        Args:
            tgt_in: (B, T) decoder input ids (already shifted right); memory: (B, S, D)
            src_pad_mask: (B, S), True at padded source positions; tgt_in_pad_mask: (B, T)
            cache: decoding only, from new_cache; tgt_in then holds just the positions not yet
                cached
        Returns:
            logits: (B, T, n_vocab); position t predicts the token after tgt_in[:, :t + 1]
        """
        if cache is not None and len(cache) != len(self.decoder_layers):
            raise ValueError(f"EncoderDecoder: cache has {len(cache)} entries for "
                             f"{len(self.decoder_layers)} decoder layers; make it with new_cache")
        start = 0 if cache is None else cache[0][0].length
        tgt_in = self._check_ids(tgt_in, "target", start)
        y = self.decoder_dropout(self.embed(tgt_in, start))
        for i, layer in enumerate(self.decoder_layers):
            y = layer(y, memory, src_pad_mask=src_pad_mask, tgt_pad_mask=tgt_in_pad_mask,
                      cache=None if cache is None else cache[i])
        if self.decoder_ln is not None:
            y = self.decoder_ln(y)
        return y @ self.token_embeddings.weights.permute(1, 0)     # (B, T, D) @ (D, V) -> (B, T, V)

    def forward(self, src, tgt, src_pad_mask=None, tgt_pad_mask=None) -> Tensor:
        """Teacher forcing (notes §7.1): every target position in one pass, the target shifted
        right.

        Args:
            src: (B, S) source ids; tgt: (B, T) target ids
            src_pad_mask: (B, S), tgt_pad_mask: (B, T); True at padded positions
        Returns:
            logits: (B, T, n_vocab); logits[:, t] is the distribution of tgt[:, t] given
                tgt[:, :t] and src
        """
        src, tgt = self._check_ids(src, "source"), self._check_ids(tgt, "target")
        if src.shape[0] != tgt.shape[0]:
            raise ValueError(f"EncoderDecoder: source and target batch sizes differ "
                             f"({src.shape[0]} vs {tgt.shape[0]}); pass one target row per source "
                             f"row")
        src_pad_mask = self._check_pad_mask(src_pad_mask, src, "src_pad_mask", "source")
        tgt_pad_mask = self._check_pad_mask(tgt_pad_mask, tgt, "tgt_pad_mask", "target")
        tgt_in, tgt_in_pad_mask = self.shift_right(tgt, tgt_pad_mask)
        return self.decode(tgt_in, self.encode(src, src_pad_mask), src_pad_mask, tgt_in_pad_mask)

    def new_cache(self, capacity: int) -> list:
        """Per decoder layer a (self-attention KVCache(capacity), cross-attention KVCache())
        pair."""
        if capacity > self.n_positions:
            raise ValueError(f"EncoderDecoder: a KV cache of {capacity} positions exceeds "
                             f"n_positions={self.n_positions}; ask for at most {self.n_positions}")
        return [(KVCache(capacity), KVCache()) for _ in self.decoder_layers]

    def generate(self, src, src_pad_mask=None, max_new_tokens: int | None = None, *,
                 sample: bool = False, temperature: float = 1.0, rng=None,
                 end_id: int | None = None, pad_id: int = 0, use_cache: bool = True,
                 num_beams: int = 1, length_penalty: float = 0.0, top_k: int | None = None,
                 top_p: float = 1.0) -> "Generation":
        """Translate: encode the source once, then decode from bos_id one token per step (notes
        §1.1).

        Args:
            src: (B, S) source ids; src_pad_mask: (B, S), True at padded positions
            max_new_tokens: None: each row's own source length + 50 (the paper's limit, notes §7.6),
                at most n_positions; an int >= 0: the same limit for every row
            sample, temperature, rng, top_k, top_p, num_beams, length_penalty, end_id, pad_id:
                as DecoderLM.generate (the paper: num_beams=4, length_penalty=0.6)
            use_cache: False reruns the decoder over the whole prefix every step (the encoder runs
                once either way, on each source once, whatever num_beams; the cache also keeps the
                cross-attention keys/values of the memory)
        Returns:
            Generation: tokens (B, T) without the bos, lengths (B,), logits (B, T, n_vocab),
            n_forward, positions_computed, scores (B,); num_beams > 1: finished
        """
        src = self._check_ids(src, "source")
        src_pad_mask = self._check_pad_mask(src_pad_mask, src, "src_pad_mask", "source")
        rng = _check_decoding("EncoderDecoder.generate", max_new_tokens, sample, temperature, rng,
                              num_beams, length_penalty, top_k, top_p)
        if max_new_tokens is None:
            src_lengths = src.shape[1] - (0 if src_pad_mask is None else src_pad_mask.sum(axis=1))
            limits = np.minimum(np.broadcast_to(src_lengths + 50, (src.shape[0],)),
                                self.n_positions)
        elif max_new_tokens > self.n_positions:
            raise ValueError(f"EncoderDecoder.generate: max_new_tokens={max_new_tokens} exceeds "
                             f"n_positions={self.n_positions}, the longest target this model "
                             f"accepts; ask for at most {self.n_positions} or build the model with "
                             f"a larger n_positions")
        else:
            limits = np.full(src.shape[0], max_new_tokens)
        bos = np.full((src.shape[0] * num_beams, 1), self.bos_id)
        with _decoding(self):
            memory = self.encode(src, src_pad_mask)
            if num_beams > 1:
                # (B, S, D) -> (B·k, S, D): each source's memory once per beam, copied, not
                # recomputed
                beam_rows = np.repeat(np.arange(src.shape[0]), num_beams)
                memory = Tensor(memory.numpy()[beam_rows])
                src_pad_mask = None if src_pad_mask is None else src_pad_mask[beam_rows]
            cache = self.new_cache(int(limits.max())) if use_cache and limits.max() > 0 else None

            def step(generated):
                if cache is None:
                    # (B·k, 1 + t): the whole prefix
                    ids = np.concatenate([bos, generated], axis=1)
                else:
                    ids = bos if generated.shape[1] == 0 else generated[:, -1:]
                logits = self.decode(ids, memory, src_pad_mask, cache=cache)
                return _last_position(logits), ids.shape[1]

            return _decode(step, limits, self.n_vocab, sample, temperature, rng, end_id, pad_id,
                           num_beams, length_penalty, top_k, top_p,
                           reorder=None if cache is None else _reorder(cache))


# ---- decoding: the KV cache, generate's loop, beam search (§7.6, exercise 11) --------------------
class KVCache:
    """The keys and values one attention sub-layer keeps between decoding steps, so that a new token
    costs one position's projections and FFN instead of a rerun over the whole prefix (exercise 11).

    capacity=L (causal self-attention): keys (B, h, Dh, L) and values (B, h, L, Dh) at their final
    size. A step writes its n new positions as kT + kT_new @ P, with P the (n, L) 0/1 placement
    matrix: tensor.py has no slicing or concatenation, and 0/1 weights copy exactly. Slots not yet
    written are masked like the future (MASK_VALUE), so they get weight exactly 0.
    capacity=None (cross-attention): the keys and values of the encoder output, projected on the
    first step and only read afterwards.
    """

    def __init__(self, capacity: int | None = None):
        if capacity is not None and capacity < 1:
            raise ValueError(f"KVCache: capacity must be >= 1 position, got {capacity}")
        self.capacity = capacity
        self.kT = self.v = None
        self.length = 0                      # positions written so far (self-attention)

    def write(self, kT_new: Tensor, v_new: Tensor):
        """Append n positions: kT_new (B, h, Dh, n), v_new (B, h, n, Dh)."""
        n_new = kT_new.shape[-1]
        if self.length + n_new > self.capacity:
            raise ValueError(f"KVCache: cannot write {n_new} more position(s) after "
                             f"{self.length}: the cache holds {self.capacity}; make it with a "
                             f"larger capacity")
        place = np.zeros((n_new, self.capacity))
        place[np.arange(n_new), self.length + np.arange(n_new)] = 1.0
        kT_placed = kT_new @ Tensor(place)                 # (B, h, Dh, n) @ (n, L) -> (B, h, Dh, L)
        v_placed = Tensor(place.T) @ v_new                 # (L, n) @ (B, h, n, Dh) -> (B, h, L, Dh)
        self.kT = kT_placed if self.kT is None else self.kT + kT_placed
        self.v = v_placed if self.v is None else self.v + v_placed
        self.length += n_new

    def causal_mask(self, n_new: int) -> Tensor:
        """(1, 1, n, L) for the n positions just written: each sees the cache up to itself."""
        first = self.length - n_new
        return Tensor(MASK_VALUE * np.triu(np.ones((1, 1, n_new, self.capacity)), k=first + 1))

    def reorder(self, rows: np.ndarray):
        """Beam search: row i of the cache becomes what row rows[i] held (its parent beam), so that
        each hypothesis keeps attending to its own prefix. A copy of rows, as the search's other
        bookkeeping: it computes nothing."""
        if self.kT is not None:
            self.kT, self.v = Tensor(self.kT.numpy()[rows]), Tensor(self.v.numpy()[rows])


@dataclass
class Hypothesis:
    """One finished text of a beam search."""
    tokens: np.ndarray          # (|Y|,) its end token included
    score: float                # the sum of its log-probabilities under the model
    ranked: float               # score / lp(|Y|): what the search ranks finished text by
    logits: np.ndarray          # (|Y|, V) the logits each of its tokens was chosen from


@dataclass
class Generation:
    """What generate returns."""
    tokens: np.ndarray          # (B, T) chosen tokens; pad_id after a row has finished
    lengths: np.ndarray         # (B,) tokens each row generated, its end token included
    logits: np.ndarray          # (B, T, V) the logits each token was chosen from (before
                                # temperature)
    n_forward: int              # forward passes of the decoder, one per step
    positions_computed: int     # positions run through the decoder per row (all its beams),
                                # summed over the steps: with the cache beams · (prompt + T - 1),
                                # without it a whole prefix per beam and step
    scores: np.ndarray          # (B,) each row's sum of log-probabilities (softmax of the logits,
                                # whatever temperature or filter chose the tokens)
    finished: list | None = None    # num_beams > 1: per row its finished Hypothesis list, best
                                    # first (at most num_beams)


def length_penalty(length, alpha: float):
    """lp(Y) = ((5 + |Y|) / 6)^α (Wu et al. 2016; the paper's beam search uses α = 0.6). Finished
    text is ranked by its sum of log-probabilities divided by lp, so that a longer text is not
    ranked lower only because it has more (negative) terms. lp(1) = 1, and α = 0 gives lp = 1."""
    return ((5.0 + np.asarray(length, dtype=float)) / 6.0) ** alpha


def _check_decoding(who: str, max_new_tokens, sample: bool, temperature: float, rng,
                    num_beams=1, length_penalty=0.0, top_k=None, top_p=1.0):
    if max_new_tokens is not None and (not isinstance(max_new_tokens, (int, np.integer))
                                       or max_new_tokens < 0):
        raise ValueError(f"{who}: max_new_tokens must be an integer >= 0, got {max_new_tokens!r}; "
                         f"0 generates nothing")
    if (not isinstance(num_beams, (int, np.integer)) or isinstance(num_beams, bool)
            or num_beams < 1):
        raise ValueError(f"{who}: num_beams must be an integer >= 1 (the hypotheses kept per "
                         f"row), got {num_beams!r}; num_beams=1 decodes greedily")
    if num_beams > 1 and sample:
        raise ValueError(f"{who}: num_beams={num_beams} searches for the most likely text and does "
                         f"not sample; pass sample=False for beam search, or num_beams=1 to "
                         f"sample")
    if not length_penalty >= 0:
        raise ValueError(f"{who}: length_penalty must be >= 0 (α in lp(Y) = ((5 + |Y|)/6)^α), got "
                         f"{length_penalty!r}; 0 ranks by the sum of log-probabilities alone, 0.6 "
                         f"is the paper's")
    if top_k is not None and (not isinstance(top_k, (int, np.integer)) or isinstance(top_k, bool)
                              or top_k < 1):
        raise ValueError(f"{who}: top_k must be an integer >= 1 (the largest logits kept), got "
                         f"{top_k!r}; top_k=None keeps every token")
    if not 0 < top_p <= 1:
        raise ValueError(f"{who}: top_p must be in (0, 1] (the probability the kept tokens reach), "
                         f"got {top_p!r}; top_p=1 keeps every token")
    if not sample and (top_k is not None or top_p < 1):
        raise ValueError(f"{who}: top_k= and top_p= filter what sampling draws from; pass "
                         f"sample=True with them (greedy decoding and beam search take the most "
                         f"likely tokens already)")
    if not sample:
        return rng
    if not temperature > 0:
        raise ValueError(f"{who}: temperature must be > 0 when sampling (the logits are divided "
                         f"by it), got {temperature}; for the most likely token use sample=False "
                         f"(greedy)")
    if isinstance(rng, (int, np.integer)):
        return np.random.default_rng(rng)
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"{who}: sampling needs rng=np.random.default_rng(seed) (or an int "
                         f"seed), so that a seed fixes every draw; got {rng!r}")
    return rng


@contextmanager
def _decoding(model: Module):
    """Eval mode (no dropout) and no graph while decoding; the model's mode is restored
    afterwards."""
    was_training = model.training
    model.eval()
    try:
        with no_grad():
            yield
    finally:
        model.train(was_training)


def _last_position(logits: Tensor) -> Tensor:
    """(B, S, V) -> (B, V), the last position. tensor.py has no indexing: a 0/1 row picks it,
    exactly."""
    batch_size, seq_len, n_vocab = logits.shape
    if seq_len > 1:
        pick = np.zeros((1, seq_len))
        pick[0, -1] = 1.0
        logits = Tensor(pick) @ logits               # (1, S) @ (B, S, V) -> (B, 1, V)
    return logits.view(batch_size, n_vocab)          # (B, 1, V) -> (B, V)


def _log_probabilities(logits: Tensor) -> np.ndarray:
    """(B, V) logits -> (B, V) log softmax, the max subtracted first (as softmax)."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return (shifted - shifted.exp().sum(axis=-1, keepdims=True).log()).numpy()


def _kept_tokens(logits: np.ndarray, scaled: np.ndarray, top_k: int | None,
                 top_p: float) -> np.ndarray:
    """(B, V) True at the tokens sampling may draw: the top_k largest logits, then of those the
    smallest set, most likely first, whose probability under softmax(scaled) reaches top_p
    (nucleus sampling, Holtzman et al. 2019). Ranked by the logits themselves, so that top_k=1
    keeps exactly greedy's argmax (ties: the first)."""
    order = np.argsort(-logits, axis=-1, kind="stable")              # most likely first
    kept = np.ones(logits.shape, dtype=bool)
    if top_k is not None:
        kept[:, top_k:] = False
    if top_p < 1:
        ranked = np.take_along_axis(scaled, order, axis=-1)
        p = np.where(kept, np.exp(ranked - ranked.max(axis=-1, keepdims=True)), 0.0)
        p /= p.sum(axis=-1, keepdims=True)
        # the probability of the more likely tokens: a token is kept while that is below top_p
        before = np.concatenate([np.zeros((len(p), 1)), np.cumsum(p, axis=-1)[:, :-1]], axis=1)
        kept &= before < top_p
    keep = np.empty_like(kept)
    np.put_along_axis(keep, order, kept, axis=-1)
    return keep


def _choose_tokens(logits: Tensor, sample: bool, temperature: float, rng, top_k: int | None = None,
                   top_p: float = 1.0) -> np.ndarray:
    """(B, V) logits -> (B,) token ids. Sampling is the Gumbel-max trick: argmax(z/T + g) with
    g ~ Gumbel(0, 1) drawn from rng is an exact draw from softmax(z/T), one rng call per step;
    over the tokens top_k / top_p keep, an exact draw from softmax(z/T) renormalised over them."""
    if not sample:
        return np.argmax(logits.numpy(), axis=-1)    # reading the result to choose; no arithmetic
    scaled = logits * (1.0 / temperature)
    perturbed = (scaled + Tensor(rng.gumbel(size=logits.shape))).numpy()
    if top_k is not None or top_p < 1:
        keep = _kept_tokens(logits.numpy(), scaled.numpy(), top_k, top_p)
        perturbed = np.where(keep, perturbed, -np.inf)
    return np.argmax(perturbed, axis=-1)


def _decode(step, limits: np.ndarray, n_vocab: int, sample: bool, temperature: float, rng,
            end_id: int | None, pad_id: int, num_beams: int = 1, alpha: float = 0.0,
            top_k: int | None = None, top_p: float = 1.0, reorder=None) -> Generation:
    """The loop both generate methods share. step(generated (B·num_beams, t)) -> (next logits
    (B·num_beams, V), positions it ran per row). Row b stops after end_id or after limits[b]
    tokens; the batch stops when every row has. num_beams > 1: _beam_search, with reorder(rows)
    reordering the KV cache (None without one)."""
    if num_beams > 1:
        return _beam_search(step, limits, n_vocab, num_beams, alpha, end_id, pad_id, reorder)
    batch_size = len(limits)
    generated = np.zeros((batch_size, 0), dtype=np.int64)
    lengths = np.zeros(batch_size, dtype=np.int64)
    scores = np.zeros(batch_size)
    finished = limits <= 0
    steps_logits, n_forward, positions = [], 0, 0
    while not finished.all():
        logits, n_positions = step(generated)
        n_forward, positions = n_forward + 1, positions + n_positions
        chosen = np.where(finished, pad_id,
                          _choose_tokens(logits, sample, temperature, rng, top_k, top_p))
        log_p = np.take_along_axis(_log_probabilities(logits), chosen[:, None], axis=1)[:, 0]
        scores += np.where(finished, 0.0, log_p)
        lengths += ~finished
        finished = finished | (lengths >= limits) | (end_id is not None and chosen == end_id)
        generated = np.concatenate([generated, chosen[:, None]], axis=1)     # (B, t) -> (B, t + 1)
        steps_logits.append(logits.numpy())
    logits_all = (np.stack(steps_logits, axis=1) if steps_logits
                  else np.zeros((batch_size, 0, n_vocab)))
    return Generation(generated, lengths, logits_all, n_forward, positions, scores)


def _reorder(cache: list):
    """reorder(rows) for a model's cache: every KVCache in it (a DecoderLM's list, an
    EncoderDecoder's (self, cross) pairs) takes its rows from the parent beams."""
    caches = [c for entry in cache for c in (entry if isinstance(entry, tuple) else (entry,))]

    def reorder(rows: np.ndarray):
        for c in caches:
            c.reorder(rows)
    return reorder


def _keep_best(pool: list, hypothesis: Hypothesis, size: int):
    """Add a finished hypothesis to a row's pool, which keeps the `size` best by score / lp, best
    first (ties: the one finished first)."""
    pool.append(hypothesis)
    pool.sort(key=lambda h: -h.ranked)
    del pool[size:]


def _beam_search(step, limits: np.ndarray, n_vocab: int, k: int, alpha: float,
                 end_id: int | None, pad_id: int, reorder) -> Generation:
    """Beam search with k hypotheses per row (Wu et al. 2016, the paper's decoding). Each step
    ranks the k·V extensions of a row's live hypotheses by their sum of log-probabilities: those
    that emit end_id are set aside as finished, the k best others stay live. A row's search ends at
    its limit (its live hypotheses then finish too), or once k are finished and no live one can
    still beat the worst of them: log-probabilities only fall, so a live sum s can at best become
    s / lp(limit). The answer: the finished hypothesis with the best score / lp(|Y|)."""
    batch_size = len(limits)
    rows = np.arange(batch_size)[:, None]                            # (B, 1)
    tokens = np.zeros((batch_size, k, 0), dtype=np.int64)            # (B, k, t) the live beams
    history = np.zeros((batch_size, k, 0, n_vocab))                  # (B, k, t, V) their logits
    # a row's k copies start as one prefix: only the first is live, or each text came k times
    sums = np.full((batch_size, k), -np.inf)
    sums[:, 0] = 0.0
    pools = [[] for _ in range(batch_size)]
    done = limits <= 0
    n_forward = positions = 0
    while not done.all():
        logits, n_positions = step(tokens.reshape(batch_size * k, -1))
        n_forward, positions = n_forward + 1, positions + k * n_positions
        z = logits.numpy().reshape(batch_size, k, n_vocab)
        candidates = sums[:, :, None] + _log_probabilities(logits).reshape(batch_size, k, n_vocab)
        length = tokens.shape[2] + 1
        live = candidates.copy()
        if end_id is not None:
            live[:, :, end_id] = -np.inf
        # (B, k) the k best extensions that do not end, as flat indices parent · V + token
        best = np.argsort(-live.reshape(batch_size, -1), axis=1, kind="stable")[:, :k]
        parent, token = np.divmod(best, n_vocab)
        new_sums = np.take_along_axis(live.reshape(batch_size, -1), best, axis=1)
        extended = np.concatenate([tokens[rows, parent], token[:, :, None]], axis=2)
        extended_history = np.concatenate([history[rows, parent], z[rows, parent][:, :, None]],
                                          axis=2)
        for b in np.flatnonzero(~done):
            if end_id is not None:
                for j in np.flatnonzero(np.isfinite(sums[b])):
                    score = candidates[b, j, end_id]
                    _keep_best(pools[b], Hypothesis(
                        np.append(tokens[b, j], end_id), float(score),
                        float(score / length_penalty(length, alpha)),
                        np.concatenate([history[b, j], z[b, j][None]])), k)
            if length >= limits[b]:
                for j in np.flatnonzero(np.isfinite(new_sums[b])):
                    _keep_best(pools[b], Hypothesis(
                        extended[b, j], float(new_sums[b, j]),
                        float(new_sums[b, j] / length_penalty(length, alpha)),
                        extended_history[b, j]), k)
                done[b] = True
            else:
                worst = pools[b][-1].ranked if len(pools[b]) == k else -np.inf
                done[b] = new_sums[b].max() / length_penalty(limits[b], alpha) <= worst
        # a row that is done keeps its beams and is fed pad_id: its answer is in its pool
        parent = np.where(done[:, None], np.arange(k), parent)
        token = np.where(done[:, None], pad_id, token)
        tokens = np.concatenate([tokens[rows, parent], token[:, :, None]], axis=2)
        history = np.concatenate([history[rows, parent], z[rows, parent][:, :, None]], axis=2)
        sums = np.where(done[:, None], sums, new_sums)
        if reorder is not None and not done.all():
            reorder((rows * k + parent).reshape(-1))
    answers = [pool[0] if pool else Hypothesis(np.zeros(0, dtype=np.int64), 0.0, 0.0,
                                               np.zeros((0, n_vocab))) for pool in pools]
    lengths = np.array([len(h.tokens) for h in answers], dtype=np.int64)
    width = int(lengths.max(initial=0))
    chosen = np.full((batch_size, width), pad_id, dtype=np.int64)
    logits_all = np.zeros((batch_size, width, n_vocab))
    for b, h in enumerate(answers):
        chosen[b, :len(h.tokens)], logits_all[b, :len(h.tokens)] = h.tokens, h.logits
    return Generation(chosen, lengths, logits_all, n_forward, positions,
                      np.array([h.score for h in answers]), pools)


# ---- optimizers and the paper's learning rate (§7.5) ---------------------------------------------
class SGD:
    """Plain gradient descent, for the smallest demos."""

    def __init__(self, parameters, lr: float):
        if not lr > 0:
            raise ValueError(f"SGD: lr must be > 0, got {lr}")
        self.parameters, self.lr = list(parameters), lr

    def step(self):
        for p in self.parameters:
            if p.grad is not None:
                p.data -= self.lr * p.grad


class Adam:
    """Adam with bias correction, updating parameters in place (matches torch.optim.Adam)."""

    def __init__(self, parameters, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        if not lr > 0:
            raise ValueError(f"Adam: lr must be > 0, got {lr}")
        if len(betas) != 2 or not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"Adam: betas must be two numbers in [0, 1), got {betas}")
        if not eps > 0:  # with eps = 0 a parameter whose gradient is exactly 0 would get 0/0 = nan
            raise ValueError(f"Adam: eps must be > 0, got {eps}")
        self.parameters, self.lr, self.betas, self.eps = list(parameters), lr, betas, eps
        self.m = [np.zeros_like(p.data) for p in self.parameters]
        self.v = [np.zeros_like(p.data) for p in self.parameters]
        self.t = 0

    def step(self):
        self.t += 1
        beta1, beta2 = self.betas
        step_size = self.lr / (1 - beta1 ** self.t)
        sqrt_correction2 = math.sqrt(1 - beta2 ** self.t)
        for p, m, v in zip(self.parameters, self.m, self.v):
            if p.grad is None:
                continue
            m *= beta1
            m += (1 - beta1) * p.grad
            v *= beta2
            v += (1 - beta2) * p.grad * p.grad
            # the same order of operations as torch.optim.Adam, so the twins stay within rounding
            p.data -= step_size * m / (np.sqrt(v) / sqrt_correction2 + self.eps)

    def zero_grad(self):
        for p in self.parameters:
            p.grad = None


def noam_lr(step, d_model: int = 512, warmup: int = 4000):
    """The paper's learning rate (notes §7.5): d_model^-0.5 · min(step^-0.5, step · warmup^-1.5).

    Rises linearly for `warmup` steps to its peak d_model^-0.5 · warmup^-0.5, then falls as 1/√step.
    step counts updates from 1: at step 0 the formula's step^-0.5 divides by zero, so the first
    update uses peak / warmup, not 0. step may be an int or an integer numpy array (for plots).
    """
    steps = np.asarray(step)
    if not np.issubdtype(steps.dtype, np.integer):
        kind = f"an array of {steps.dtype}" if steps.ndim else f"a {type(step).__name__}"
        raise TypeError(f"noam_lr: step must be an integer (it counts updates, from 1), "
                        f"got {step!r}, {kind}")
    if np.any(steps < 1):
        raise ValueError(f"noam_lr: step must be an integer >= 1 (the number of the update about "
                         f"to be made, counting from 1), got {step!r}; step^-0.5 is undefined at 0")
    steps = steps.astype(np.float64)
    lr = d_model ** -0.5 * np.minimum(steps ** -0.5, steps * warmup ** -1.5)
    return float(lr) if lr.ndim == 0 else lr


# ==== beyond the notes: the fusion switch (03 part 7, 06 part 6) ==================================
# The lesson above composes primitives. What fusing them buys a layer (launches, bytes moved, memory
# kept for backward) is measured by 03 part 7 and 06 part 6, which run the same modules inside
# `with fused():`. gelu, LayerNorm.forward and MultiHeadAttention.self_attention read the switch.
_fusion = None   # None: compose the primitives (the default); else dict(flash=..., block_size=...)


@contextmanager
def fused(flash: bool = False, block_size: int = 64):
    """Inside the block, LayerNorm, gelu and the attention core use tensor.py's fused primitives
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


__all__ = ["MASK_VALUE", "set_seed", "fused", "logsumexp", "softmax", "softmax_loss", "gelu",
           "sinusoidal_frequencies", "sinusoidal_positions", "Parameter", "Module", "Linear",
           "Embedding", "Dropout", "LayerNorm", "MultiHeadAttention", "FeedForward",
           "TransformerLayer", "DecoderLM", "EncoderLayer", "DecoderLayer", "EncoderDecoder",
           "KVCache", "Generation", "lm_loss", "SGD", "Adam", "noam_lr", "Tensor", "no_grad"]
