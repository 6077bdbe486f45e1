"""HW3's Transformer modules, built only from lecture 5's tensor.py primitives (notes §9.1).

Not one line of backward is written here: every module is a composition of tensor.py's primitives
(add, sub, mul, exp, log, sigmoid, matmul, sum, max, view, permute, contiguous, embedding), so
autodiff differentiates all of it. torch_ref.py is the PyTorch twin with the same names.

What follows which part of the notes (and of the paper, Vaswani et al. 2017):
- softmax, logsumexp, softmax_loss ... §9.1 (max subtracted; softmax_loss = logsumexp(z) - z_y)
- Linear, Embedding, Dropout ......... §4.1, §7.2 (inverted dropout; identity in eval mode)
- LayerNorm .......................... §5.3 (biased variance, eps inside the sqrt, like torch)
- MultiHeadAttention ................. §2.2-§2.3, §3.1-§3.3 (causal / pad masks, cross-attention)
- FeedForward ........................ §5.1 (tanh GELU, as GPT-2 and HW3)
- TransformerLayer ................... §5.4: Pre-LN by default (GPT-2, HW3), Post-LN with pre_ln=False
- DecoderLM .......................... §6.3 (GPT-2 / HW3: embeddings -> dropout -> N layers -> LN -> head)
- sinusoidal_positions ............... §4.2

Masks, written down once: an additive mask holds 0 where a query may look and MASK_VALUE (-1e9)
where it may not. In float64, exp(-1e9 - m) is exactly 0, and a fully masked row still gets finite
weights summing to 1 instead of nan (a real -inf would give nan; notes §2.3). They are uniform only if
its scores are equal: float64 keeps s - 1e9 apart for different s (float32 would round them together).
"""
from __future__ import annotations

import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lecture05"))
from tensor import Tensor, embedding, no_grad  # noqa: E402

MASK_VALUE = -1e9

# One generator for parameter initialisation and one for dropout masks; set_seed resets both.
_init_rng = np.random.default_rng(0)
_dropout_rng = np.random.default_rng(1)


def set_seed(seed: int):
    global _init_rng, _dropout_rng
    _init_rng = np.random.default_rng(seed)
    _dropout_rng = np.random.default_rng(seed + 1_000_003)


# ---- functions --------------------------------------------------------------------------------
def logsumexp(x: Tensor, dim: int = -1) -> Tensor:
    """log Σ exp(x) along dim, keepdims. The max is subtracted first so nothing overflows.

    As torch.logsumexp: a row of -inf gives -inf, a row holding +inf gives +inf (the shift is 0 there,
    since subtracting an infinite max would give inf - inf = nan)."""
    m = x.max(axis=dim, keepdims=True, finite=True)  # a constant: exact, the result does not depend on m
    return (x - m).exp().sum(axis=dim, keepdims=True).log() + m


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """exp((x - m) - log Σ exp(x - m)): no division, no overflow. The max m is subtracted before
    anything else, so the result keeps full precision even where |x| is huge (exp(x - logsumexp(x))
    would lose it to rounding in logsumexp ≈ m: a row of -1e9 would give 0.2499999990, not 1/4)."""
    shifted = x - x.max(axis=dim, keepdims=True)     # the max is a constant (see logsumexp)
    return (shifted - shifted.exp().sum(axis=dim, keepdims=True).log()).exp()


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
        raise TypeError(f"softmax_loss: target must hold integer class ids, got dtype {target.dtype} "
                        f"(class probabilities are not supported)")
    n_classes = logits.shape[1]
    if target.size and (target.min() < 0 or target.max() >= n_classes):
        raise IndexError(f"softmax_loss: target ids must lie in 0..{n_classes - 1}, "
                         f"got min {target.min()}, max {target.max()}")
    # z_y by lookup: the N·C logits as a table of one-number rows. (A one-hot multiply would make
    # -inf · 0 = nan wherever a row holds an infinite logit; torch gathers too.)
    flat = (logits if logits.is_contiguous() else logits.contiguous()).view(-1, 1)
    picked = embedding(flat, np.arange(len(target)) * n_classes + target).view(-1)   # (N,)
    return logsumexp(logits, dim=1).view(-1) - picked


def gelu(x: Tensor) -> Tensor:
    """tanh GELU 0.5x(1 + tanh u) written as x·sigmoid(2u), u = √(2/π)(x + 0.044715x³) (notes §9.1)."""
    u = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
    return x * (u * 2.0).sigmoid()


def sinusoidal_frequencies(d: int, base: float = 10000.0) -> np.ndarray:
    """(d/2,) angular frequencies ω_i = base^(-2i/d) of the sinusoidal encoding's (sin, cos) pairs."""
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


def check_sizes(owner: str, **sizes):
    """Each size=(value, least allowed) must be an int (not a bool) of at least that value."""
    for name, (value, least) in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise ValueError(f"{owner}: {name} must be an integer >= {least}, got {value!r}")


def check_pad_mask(pad_mask) -> np.ndarray:
    """pad_mask as a bool array; 0/1 numbers are refused, because conventions disagree on which is which."""
    pad_mask = np.asarray(pad_mask)
    if pad_mask.dtype != bool:
        raise TypeError(f"pad_mask must be a bool array with True at padded positions, got dtype "
                        f"{pad_mask.dtype}; HuggingFace's attention_mask is the opposite (1 = keep, "
                        f"0 = pad), so pass attention_mask == 0")
    return pad_mask


# ---- modules ---------------------------------------------------------------------------------
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
            elif isinstance(value, (list, tuple)) and value and all(isinstance(v, Module) for v in value):
                for i, v in enumerate(value):
                    yield f"{name}.{i}", v

    def named_modules(self, prefix: str = ""):
        yield prefix, self
        for name, child in self.named_children():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def named_parameters(self):
        """(name, Parameter) pairs; a parameter shared by two modules (tied weights) appears once."""
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
    def __init__(self, num_embeddings: int, embedding_dim: int):
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weights = Parameter(_init_rng.standard_normal((num_embeddings, embedding_dim)))

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
    """y = (x - μ) / √(σ² + eps) · weights + bias over the last dimension (biased σ², like torch)."""

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
            raise ValueError(f"LayerNorm({self.dim}): input's last dimension is {x.shape[-1]} (shape {x.shape})")
        centred = x - x.mean(axis=-1, keepdims=True)
        variance = (centred * centred).mean(axis=-1, keepdims=True)
        inv_std = ((variance + self.eps).log() * -0.5).exp()  # 1/√(σ² + eps) from exp and log
        return centred * inv_std * self.weights + self.bias


class MultiHeadAttention(Module):
    """softmax(q kᵀ/√Dh + mask) v in h heads, then out_projection (notes §2.2, §3)."""

    def __init__(self, n_embd: int, n_head: int, causal: bool = True, p_dropout: float = 0.1,
                 bias: bool = True):
        check_sizes("MultiHeadAttention", n_embd=(n_embd, 1), n_head=(n_head, 1))
        if n_embd % n_head:
            raise ValueError(f"MultiHeadAttention: n_embd={n_embd} is not divisible by n_head={n_head}")
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
        x = x.view(batch_size, seq_len, self.n_head, self.attn_hidden_dim)  # (B, S, D) -> (B, S, h, Dh)
        return x.permute(*dims)                                            # -> (B, h, S, Dh) by default, no copy

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
        kT = self._split_heads(self.k_projection(kv), (0, 2, 3, 1))       # (B, S, h, Dh) -> (B, h, Dh, S) at once
        v = self._split_heads(self.v_projection(kv))
        return q, kT, v

    def self_attention(self, q: Tensor, kT: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        """
        Args:
            q: (B, h, S_q, Dh), kT: (B, h, Dh, S_k), v: (B, h, S_k, Dh), mask: additive, broadcastable
        Returns:
            (B, S_q, D): heads concatenated, before out_projection
        """
        batch_size, n_head, seq_len, head_dim = q.shape
        scores = (q @ kT) * (1.0 / math.sqrt(head_dim))  # (B, h, S_q, S_k)
        if mask is not None:
            scores = scores + mask
        weights = softmax(scores, dim=-1)
        self.last_attention = weights
        out = self.dropout(weights) @ v                  # (B, h, S_q, Dh)
        out = out.permute(0, 2, 1, 3).contiguous()       # -> (B, S_q, h, Dh), copied once
        return out.view(batch_size, seq_len, n_head * head_dim)  # -> (B, S_q, D)

    def forward(self, x: Tensor, kv: Tensor | None = None, pad_mask=None) -> Tensor:
        """
        Args:
            x: (B, S, D); kv: (B, S_k, D) for cross-attention; pad_mask: (B, S_k), True at pads
        Returns:
            (B, S, D)
        """
        if x.ndim != 3 or x.shape[-1] != self.n_embd:
            raise ValueError(f"MultiHeadAttention: expected x of shape (B, S, {self.n_embd}), got {x.shape}")
        q, kT, v = self.project_to_query_key_value(x, kv)
        mask = None
        if self.causal:
            if kv is not None and kv.shape[1] != x.shape[1]:
                raise ValueError("MultiHeadAttention: a causal mask needs as many keys as queries; "
                                 "use causal=False for cross-attention")
            mask = self.create_causal_mask(x.shape[1])
        if pad_mask is not None:
            pad = self.create_pad_mask(pad_mask)
            if pad.shape[0] != x.shape[0] or pad.shape[-1] != kT.shape[-1]:
                raise ValueError(f"MultiHeadAttention: pad_mask must have shape (B, S_k) = "
                                 f"({x.shape[0]}, {kT.shape[-1]}), got {np.shape(pad_mask)}")
            mask = pad if mask is None else mask + pad
        return self.out_dropout(self.out_projection(self.self_attention(q, kT, v, mask)))


class FeedForward(Module):
    """linear_out(GELU(linear_in(x))), middle_dim = 4·n_embd by default (notes §5.1)."""

    def __init__(self, n_embd: int, middle_dim: int | None = None, p_dropout: float = 0.1, bias: bool = True):
        middle_dim = 4 * n_embd if middle_dim is None else middle_dim
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
        return self.dropout(self.linear_out(gelu(self.linear_in(x))))


class TransformerLayer(Module):
    """One layer; pre_ln=True (default, GPT-2/HW3) or False (the 2017 paper), notes §5.4.

    Pre-LN:  x = x + attention(ln_1(x));  x = x + ff(ln_2(x))
    Post-LN: x = ln_1(x + attention(x));  x = ln_2(x + ff(x))
    """

    def __init__(self, n_embd: int, n_head: int, p_dropout: float = 0.1, ln_eps: float = 1e-5,
                 bias: bool = True, causal: bool = True, pre_ln: bool = True, middle_dim: int | None = None):
        self.pre_ln = pre_ln
        self.ln_1 = LayerNorm(n_embd, eps=ln_eps)
        self.ln_2 = LayerNorm(n_embd, eps=ln_eps)
        self.attention = MultiHeadAttention(n_embd, n_head, causal=causal, p_dropout=p_dropout, bias=bias)
        self.ff = FeedForward(n_embd, middle_dim=middle_dim, p_dropout=p_dropout, bias=bias)

    def forward(self, x: Tensor, pad_mask=None) -> Tensor:
        """
        Args:
            x: (B, S, D); pad_mask: (B, S), True at padded positions
        Returns:
            (B, S, D)
        """
        if self.pre_ln:
            x = x + self.attention(self.ln_1(x), pad_mask=pad_mask)
            return x + self.ff(self.ln_2(x))
        x = self.ln_1(x + self.attention(x, pad_mask=pad_mask))
        return self.ln_2(x + self.ff(x))


class DecoderLM(Module):
    """GPT-2 / HW3 decoder-only LM (notes §6.3):
    token + position embeddings -> dropout -> n_layers layers -> ln -> lm_head.

    positions: "learned" (a table, GPT-2/HW3), "sinusoidal" (the 2017 paper), or "none".
    tie_weights: lm_head reuses token_embeddings (GPT-2, the paper; notes §4.1).
    The final LayerNorm `ln` exists for Pre-LN (GPT-2's ln_f); a Post-LN stack already ends in one.
    """

    def __init__(self, n_vocab: int, n_embd: int, n_head: int, n_positions: int, n_layers: int = 4,
                 p_dropout: float = 0.1, ln_eps: float = 1e-5, bias: bool = True, pre_ln: bool = True,
                 causal: bool = True, tie_weights: bool = False, positions: str = "learned",
                 middle_dim: int | None = None):
        if positions not in ("learned", "sinusoidal", "none"):
            raise ValueError(f"DecoderLM: positions must be 'learned', 'sinusoidal' or 'none', got {positions!r}")
        check_sizes("DecoderLM", n_vocab=(n_vocab, 1), n_layers=(n_layers, 0))
        self.n_vocab, self.n_embd, self.n_positions = n_vocab, n_embd, n_positions
        self.positions, self.tie_weights = positions, tie_weights
        self.token_embeddings = Embedding(n_vocab, n_embd)
        self.position_embeddings = Embedding(n_positions, n_embd) if positions == "learned" else None
        self.dropout = Dropout(p_dropout)
        self.layers = [TransformerLayer(n_embd, n_head, p_dropout, ln_eps, bias, causal, pre_ln, middle_dim)
                       for _ in range(n_layers)]
        self.ln = LayerNorm(n_embd, eps=ln_eps) if pre_ln else None
        self.lm_head = None if tie_weights else Linear(n_embd, n_vocab, bias=False)

    def embed(self, idx) -> Tensor:
        """(B, S) ids -> (B, S, D) token + position embeddings."""
        idx = np.asarray(idx)
        if idx.ndim != 2:
            raise ValueError(f"DecoderLM: expected token ids of shape (B, S), got {idx.shape}")
        seq_len = idx.shape[1]
        if self.positions == "learned" and seq_len > self.n_positions:  # only a table has a last row
            missing = (f"position {seq_len - 1}" if seq_len == self.n_positions + 1
                       else f"positions {self.n_positions}..{seq_len - 1}")
            raise ValueError(f"DecoderLM: sequence length {seq_len} exceeds n_positions={self.n_positions}: "
                             f"the learned position table has no row for {missing}; shorten the input "
                             f"or build the model with a larger n_positions")
        x = self.token_embeddings(idx)
        if self.positions == "learned":
            x = x + self.position_embeddings(np.arange(seq_len)[None, :])   # (1, S, D) broadcast over B
        elif self.positions == "sinusoidal":
            x = x + sinusoidal_positions(seq_len, self.n_embd)[None]
        return x

    def forward(self, idx, pad_mask=None) -> Tensor:
        """
        Args:
            idx: (B, S) token ids; pad_mask: (B, S), True at padded positions
        Returns:
            logits: (B, S, n_vocab)
        """
        x = self.dropout(self.embed(idx))
        for layer in self.layers:
            x = layer(x, pad_mask=pad_mask)
        if self.ln is not None:
            x = self.ln(x)
        if self.tie_weights:
            return x @ self.token_embeddings.weights.permute(1, 0)  # (B, S, D) @ (D, V) -> (B, S, V)
        return self.lm_head(x)


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
        raise ValueError(f"lm_loss: every target is ignore_index={ignore_index}, so there is no position "
                         f"to average over")
    losses = softmax_loss(logits.view(batch_size * seq_len, n_vocab), np.where(keep, targets, 0))
    if n_kept == targets.size:
        return losses.mean()
    return (losses * (keep / n_kept)).sum()   # ignored positions weigh 0: no loss, no gradient


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
    step counts updates from 1: at step 0 the formula's step^-0.5 divides by zero, so the first update
    uses peak / warmup, not 0. step may be an int or an integer numpy array (for plots).
    """
    steps = np.asarray(step)
    if not np.issubdtype(steps.dtype, np.integer):
        kind = f"an array of {steps.dtype}" if steps.ndim else f"a {type(step).__name__}"
        raise TypeError(f"noam_lr: step must be an integer (it counts updates, from 1), got {step!r}, {kind}")
    if np.any(steps < 1):
        raise ValueError(f"noam_lr: step must be an integer >= 1 (the number of the update about to be "
                         f"made, counting from 1), got {step!r}; step^-0.5 is undefined at 0")
    steps = steps.astype(np.float64)
    lr = d_model ** -0.5 * np.minimum(steps ** -0.5, steps * warmup ** -1.5)
    return float(lr) if lr.ndim == 0 else lr


__all__ = ["MASK_VALUE", "set_seed", "logsumexp", "softmax", "softmax_loss", "gelu", "sinusoidal_frequencies",
           "sinusoidal_positions", "Parameter", "Module", "Linear", "Embedding", "Dropout", "LayerNorm",
           "MultiHeadAttention", "FeedForward", "TransformerLayer", "DecoderLM", "lm_loss", "SGD", "Adam", "noam_lr",
           "Tensor", "no_grad"]
