"""HW3's Transformer modules, built only from lecture 5's tensor.py primitives (notes §9.1).

Not one line of backward is written here: every module is a composition of tensor.py's primitives
(add, sub, mul, exp, log, sigmoid, matmul, sum, max, view, permute, contiguous, embedding), so
autodiff differentiates all of it. torch_ref.py is the PyTorch twin with the same names.

The file in reading order, HW3's problems in the notes' order, each section under a ruler, with
the part of the notes (and of the paper, Vaswani et al. 2017) it follows:
- set_seed ........................... the two random generators
- logsumexp, softmax, gelu ........... §9.1 (max subtracted; tanh GELU as x·sigmoid(2u))
- sinusoidal_frequencies, _positions . §4.2
- softmax_loss, lm_loss .............. §9.1 HW3 Problem 1 (logsumexp(z) - z_y); next-token loss
- check_tensor, check_sizes, ... ..... the checks behind the error messages (ids: tensor.py)
- Parameter, Module .................. named parameters, train/eval, parameter counts, print()
- Linear, Embedding, Dropout ......... §4.1, §7.2 (inverted dropout; identity in eval mode)
- LayerNorm .......................... §5.3 (biased variance, eps inside the sqrt, like torch)
- MultiHeadAttention ................. §2.2-§2.3, §3.1-§3.3 (causal / pad masks, cross-attention)
- FeedForward ........................ §5.1 (tanh GELU as GPT-2 and HW3; ReLU as the paper)
- TransformerLayer ................... §5.4: Pre-LN by default (GPT-2, HW3), Post-LN: pre_ln=False
- DecoderLM .......................... §6.3 (GPT-2 / HW3: embeddings, dropout, N layers, LN, head)

Beyond HW3, each in a file of its own beside this one:
- encoder_decoder.py ... the paper's EncoderLayer, DecoderLayer, EncoderDecoder (§3.3, §6)
- decoding.py .......... the KV cache, generate's loop, sampling filters, beam search (§7.6,
                         exercise 11); DecoderLM.generate and forward's `cache=` lead there
- optim.py ............. SGD, Adam, the paper's learning rate noam_lr (§7.5)
- kernels.py ........... beyond the notes (03 part 7, 06 part 6): inside `with kernels.fused():`
                         gelu, LayerNorm and the attention core take one labelled branch each
                         into fused primitives (backward derived by hand) and a flash core

Masks, written down once: an additive mask holds 0 where a query may look and MASK_VALUE (-1e9,
tensor.py's, so that kernels.py's flash core and decoding.py's cache add the same) where it may
not. In float64, exp(-1e9 - m) is exactly 0, and a fully masked row still gets finite weights
summing to 1 instead of nan (a real -inf would give nan; notes §2.3). They are uniform only if its
scores are equal: float64 keeps s - 1e9 apart for different s (float32 would round them together).
MultiHeadAttention makes its causal mask in one place, self_attention (a KV cache's mask:
decoding.KVCache.causal_mask).
"""

from __future__ import annotations

import inspect
import math
import textwrap

import numpy as np

from lecture05.tensor import MASK_VALUE, Tensor, check_token_ids, embedding   # MASK_VALUE: "Masks"
from lecture06 import kernels


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
    if kernels.fusing():   # beyond the notes: one launch each way (kernels.py)
        return kernels.gelu(x)
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
    check_tensor("softmax_loss", logits, "logits")
    target = check_token_ids("softmax_loss", target, "target class ids", "target")
    if logits.ndim != 2 or target.shape != logits.shape[:1]:
        raise ValueError(f"softmax_loss: expected logits (N, C) and target (N,), "
                         f"got {logits.shape} and {target.shape}")
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
    check_tensor("lm_loss", logits, "logits")
    targets = check_token_ids("lm_loss", targets, "targets", "targets")
    if logits.ndim != 3 or targets.shape != logits.shape[:2]:
        hint = "; for (N, C) logits use softmax_loss" if logits.ndim == 2 else ""
        raise ValueError(f"lm_loss: expected logits (B, S, V) and targets (B, S), got "
                         f"{logits.shape} and {targets.shape}{hint}")
    batch_size, seq_len, n_vocab = logits.shape
    targets = targets.reshape(-1)                                  # (B, S) -> (B·S,)
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
def check_tensor(owner: str, x, what: str = "input"):
    """Modules compute on tensor.py Tensors; a numpy array would fail deep inside, at the first
    method numpy lacks or the first `@` with a Parameter."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{owner}: {what} must be a tensor.py Tensor, got "
                        f"{type(x).__module__}.{type(x).__name__}; wrap it with "
                        f"tensor.tensor(x) (requires_grad=True if you want its gradient)")


def check_sizes(owner: str, **sizes):
    """Each size=(value, least allowed) must be an int (not a bool) of at least that value."""
    for name, (value, least) in sizes.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
            raise ValueError(f"{owner}: {name} must be an integer >= {least}, got {value!r}")


def check_pad_mask(pad_mask, batch_size: int, n_keys: int) -> np.ndarray:
    """pad_mask as a (B, S_k) bool array, True at padded keys. Another shape is refused here, not
    in a permute after numpy broadcast it ((B, 1, S_k), HF's (B, 1, 1, S_k)); so are 0/1 numbers,
    because conventions disagree on which is which."""
    pad_mask = np.asarray(pad_mask)
    if pad_mask.shape != (batch_size, n_keys):
        if pad_mask.ndim == 4:
            fix = ("that is HuggingFace's broadcast layout; ours is (B, S_k) bool, True at padded "
                   "keys: from its 2-D attention_mask (1 = keep) pass attention_mask == 0")
        else:
            fix = "a row per sequence, True at its padded keys: the attention broadcasts it itself"
        raise ValueError(f"pad_mask must have shape (B, S_k) = ({batch_size}, {n_keys}), got "
                         f"{pad_mask.shape}; {fix}")
    if pad_mask.dtype != bool:
        raise TypeError(f"pad_mask must be a bool array with True at padded positions, got dtype "
                        f"{pad_mask.dtype}; HuggingFace's attention_mask is the opposite "
                        f"(1 = keep, 0 = pad), so pass attention_mask == 0")
    return pad_mask


def check_positions(owner: str, length: int, n_positions: int, asked: str, fix: str,
                    table: str = "the learned position table"):
    """The one guard for a sequence longer than a model's n_positions position rows; asked: what
    was asked for ("sequence length 9"), fix: how to ask for less."""
    if length > n_positions:
        missing = (f"position {n_positions}" if length == n_positions + 1
                   else f"positions {n_positions}..{length - 1}")
        raise ValueError(f"{owner}: {asked} exceeds n_positions={n_positions}: {table} has no row "
                         f"for {missing}; {fix} or build the model with a larger n_positions")


# ---- Module: parameters, sub-modules, train/eval -------------------------------------------------
class Parameter(Tensor):
    def __init__(self, data):
        super().__init__(np.array(data, dtype=np.float64), requires_grad=True)


PLAIN_SETTINGS = (bool, int, float, str, type(None))   # the attributes a module's repr shows


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

    def __repr__(self) -> str:
        """As torch prints a module: the constructor's arguments it keeps as attributes (sizes and
        switches; a switch kept as None, bias, prints False), then its sub-modules, indented."""
        arguments = inspect.signature(type(self).__init__).parameters
        off = {name for name, argument in arguments.items() if argument.default is True}
        settings = ", ".join(f"{name}={False if value is None and name in off else value!r}"
                             for name, value in vars(self).items()
                             if name in arguments and isinstance(value, PLAIN_SETTINGS))
        children = [f"({name}): {child!r}" for name, child in self.named_children()]
        if not children:
            return f"{type(self).__name__}({settings})"
        lines = "\n".join(([settings] if settings else []) + children)
        return f"{type(self).__name__}(\n{textwrap.indent(lines, '  ')}\n)"


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
        check_tensor(f"Linear({self.in_size}, {self.out_size})", x)
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
        return embedding(self.weights, check_token_ids("Embedding", ids))


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
        check_tensor(f"LayerNorm({self.dim})", x)
        if x.shape[-1] != self.dim:
            raise ValueError(f"LayerNorm({self.dim}): input's last dimension is {x.shape[-1]} "
                             f"(shape {x.shape})")
        if kernels.fusing():   # beyond the notes: one launch each way (kernels.py)
            return kernels.layer_norm(x, self.weights, self.bias, self.eps)
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
    def create_pad_mask(pad_mask, batch_size: int, n_keys: int) -> Tensor:
        """(B, S_k) with True at padded keys -> additive (B, 1, 1, S_k): no query sees a pad."""
        pad_mask = check_pad_mask(pad_mask, batch_size, n_keys)
        return Tensor(np.where(pad_mask, MASK_VALUE, 0.0)[:, None, None, :])

    def split_heads(self, x: Tensor, dims=(0, 2, 1, 3)) -> Tensor:
        """(B, S, D) -> (B, S, h, Dh), then permuted by dims: (B, h, S, Dh) by default."""
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
        q = self.split_heads(self.q_projection(x))
        # (B, S, h, Dh) -> (B, h, Dh, S) at once
        kT = self.split_heads(self.k_projection(kv), (0, 2, 3, 1))
        v = self.split_heads(self.v_projection(kv))
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
        if kernels.flashing():   # beyond the notes: the whole core in one launch (kernels.py)
            p_dropout = self.dropout.p_dropout if self.training else 0.0
            out = kernels.flash_core(q, kT, v, mask, causal, p_dropout)   # (B, h, S_q, Dh)
            self.last_attention = None                  # it never forms the weights
        else:
            if causal:
                causal_mask = self.create_causal_mask(seq_len)
                mask = causal_mask if mask is None else causal_mask + mask
            if kernels.fusing():   # beyond the notes: scale, mask, softmax in one launch
                weights = kernels.softmax(q @ kT, 1.0 / math.sqrt(head_dim), mask)
            else:
                scores = (q @ kT) * (1.0 / math.sqrt(head_dim))     # (B, h, S_q, S_k)
                if mask is not None:
                    scores = scores + mask
                weights = softmax(scores, dim=-1)
            self.last_attention = weights
            out = self.dropout(weights) @ v                       # (B, h, S_q, Dh)
        out = out.permute(0, 2, 1, 3).contiguous()       # -> (B, S_q, h, Dh), copied once
        return out.view(batch_size, seq_len, n_head * head_dim)  # -> (B, S_q, D)

    def forward(self, x: Tensor, kv: Tensor | None = None, pad_mask=None, cache=None) -> Tensor:
        """
        Args:
            x: (B, S, D); kv: (B, S_k, D) for cross-attention; pad_mask: (B, S_k), True at pads
            cache: decoding only, a decoding.KVCache; x then holds just the new positions
        Returns:
            (B, S, D)
        """
        check_tensor("MultiHeadAttention", x, "x")
        if x.ndim != 3 or x.shape[-1] != self.n_embd:
            raise ValueError(f"MultiHeadAttention: expected x of shape (B, S, {self.n_embd}), "
                             f"got {x.shape}")
        if cache is not None:   # decoding: keys and values kept from earlier steps (decoding.py)
            heads = cache.attend(self, x, kv, pad_mask)
        else:
            q, kT, v = self.project_to_query_key_value(x, kv)
            mask = (None if pad_mask is None
                    else self.create_pad_mask(pad_mask, x.shape[0], kT.shape[-1]))
            heads = self.self_attention(q, kT, v, mask, causal=self.causal)
        return self.out_dropout(self.out_projection(heads))


# ---- feed-forward, the layer, the decoder-only LM (§5.1, §5.4, §6.3) -----------------------------
ACTIVATIONS = ("gelu", "relu")


class FeedForward(Module):
    """linear_out(act(linear_in(x))), middle_dim = 4·n_embd by default (notes §5.1).

    activation: "gelu" (tanh GELU: GPT-2, HW3; the default) or "relu" (the 2017 paper, torch's).
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

    def forward(self, x: Tensor, pad_mask=None, cache=None) -> Tensor:
        """
        Args:
            x: (B, S, D); pad_mask: (B, S), True at padded positions; cache: decoding only, a
                decoding.KVCache
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
        idx = check_token_ids("DecoderLM", idx)
        if idx.ndim != 2:
            raise ValueError(f"DecoderLM: expected token ids of shape (B, S), got {idx.shape}")
        seq_len = start + idx.shape[1]      # with a cache, the positions before start count too
        self.check_length("DecoderLM", seq_len, f"sequence length {seq_len}", "shorten the input")
        x = self.token_embeddings(idx)
        if self.positions == "learned":
            # (1, S, D), broadcast over B
            x = x + self.position_embeddings(np.arange(start, seq_len)[None, :])
        elif self.positions == "sinusoidal":
            # (S, D) -> (1, S, D)
            x = x + sinusoidal_positions(seq_len, self.n_embd)[start:][None]
        return x

    def check_length(self, owner: str, length: int, asked: str, fix: str):
        """check_positions for this model: only a learned table has a last row."""
        if self.positions == "learned":
            check_positions(owner, length, self.n_positions, asked, fix)

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
        self.check_length("DecoderLM", capacity, f"a KV cache of {capacity} positions",
                          f"ask for at most {self.n_positions}")
        from lecture06 import decoding   # here: the lesson needs no decoding, decoding no model
        return [decoding.KVCache(capacity) for _ in self.layers]

    def generate(self, prompt, max_new_tokens: int, **options):
        """Continue every prompt row by up to max_new_tokens tokens, one per step (exercise 11).
        decoding.generate does it and lists the options: sampling with temperature, top-k and
        top-p, beam search, the KV cache.

        Args:
            prompt: (B, P) token ids, P >= 1 (rows of equal length: no padding)
            max_new_tokens: >= 0; with learned positions P + max_new_tokens must fit in n_positions
        Returns:
            decoding.Generation: tokens (B, T), lengths (B,), logits (B, T, n_vocab), n_forward,
            positions_computed, scores (B,); num_beams > 1: finished
        """
        from lecture06 import decoding   # here: the lesson needs no decoding, decoding no model
        return decoding.generate(self, prompt, max_new_tokens, **options)
