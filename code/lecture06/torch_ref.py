"""PyTorch twins of transformer.py's modules: same structure, same parameter names, float64
(notes §9.2).

`copy_from(our_module)` copies every parameter from a transformer.py module and links each Dropout
to its twin, so that in training mode the twin applies exactly the mask our side drew last. Run
our forward first, then the twin's: outputs and every parameter's gradient then agree to float64
rounding. Linear stores its weight (in, out) like HW3 (torch.nn.Linear stores (out, in)).

The same classes, cast with .float(), are the fast models of the city-language experiments
(city_lab.py) and the cost measurements of script 06.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# one mask convention, one encoding, the same checks
from lecture05.tensor import MASK_VALUE, check_token_ids
from lecture06 import transformer
from lecture06.transformer import check_pad_mask, check_sizes, sinusoidal_positions

DTYPE = torch.float64


class Linear(nn.Module):
    def __init__(self, in_size: int, out_size: int, bias: bool = True):
        super().__init__()
        bound = 1.0 / math.sqrt(in_size)
        self.weights = nn.Parameter(torch.empty(in_size, out_size, dtype=DTYPE)
                                    .uniform_(-bound, bound))
        self.bias = (nn.Parameter(torch.empty(out_size, dtype=DTYPE).uniform_(-bound, bound))
                     if bias else None)

    def forward(self, x):
        return F.linear(x, self.weights.t(), self.bias)  # x @ weights + bias in one fused call


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, std: float = 1.0):
        super().__init__()
        self.weights = nn.Parameter(torch.randn(num_embeddings, embedding_dim, dtype=DTYPE) * std)

    def forward(self, ids):
        # indexing would read a bool array as a row mask
        if getattr(ids, "dtype", None) in (torch.bool, np.dtype(bool)):
            raise TypeError("Embedding: ids are bool (a mask?); token ids must be integers")
        return self.weights[ids]


class Dropout(nn.Module):
    """Inverted dropout; once linked to our Dropout by copy_from, it reuses that one's last mask."""

    def __init__(self, p_dropout: float = 0.1):
        super().__init__()
        self.p_dropout = p_dropout
        self.twin = None

    def forward(self, x):
        if not self.training or self.p_dropout == 0.0:
            return x
        if self.twin is not None:
            return x * torch.as_tensor(self.twin.last_mask, dtype=x.dtype)
        return F.dropout(x, self.p_dropout, training=True)


class LayerNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weights = nn.Parameter(torch.ones(dim, dtype=DTYPE))
        self.bias = nn.Parameter(torch.zeros(dim, dtype=DTYPE))

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], self.weights, self.bias, self.eps)


class MultiHeadAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, causal: bool = True, p_dropout: float = 0.1,
                 bias: bool = True):
        super().__init__()
        check_sizes("MultiHeadAttention", n_embd=(n_embd, 1), n_head=(n_head, 1))
        if n_embd % n_head:
            raise ValueError(f"MultiHeadAttention: n_embd={n_embd} is not divisible by "
                             f"n_head={n_head}")
        self.n_embd, self.n_head, self.causal = n_embd, n_head, causal
        self.attn_hidden_dim = n_embd // n_head
        self.q_projection = Linear(n_embd, n_embd, bias)
        self.k_projection = Linear(n_embd, n_embd, bias)
        self.v_projection = Linear(n_embd, n_embd, bias)
        self.out_projection = Linear(n_embd, n_embd, bias)
        self.dropout = Dropout(p_dropout)
        self.out_dropout = Dropout(p_dropout)

    @staticmethod
    def create_causal_mask(seq_len: int, dtype=DTYPE, device=None):
        full = torch.full((1, 1, seq_len, seq_len), MASK_VALUE, dtype=dtype, device=device)
        return torch.triu(full, 1)

    def _split_heads(self, x, dims=(0, 2, 1, 3)):
        batch_size, seq_len, _ = x.shape
        return x.view(batch_size, seq_len, self.n_head, self.attn_hidden_dim).permute(*dims)

    def project_to_query_key_value(self, x, kv=None):
        kv = x if kv is None else kv
        q = self._split_heads(self.q_projection(x))
        kT = self._split_heads(self.k_projection(kv), (0, 2, 3, 1))
        v = self._split_heads(self.v_projection(kv))
        return q, kT, v

    def self_attention(self, q, kT, v, mask=None):
        batch_size, n_head, seq_len, head_dim = q.shape
        scores = (q @ kT) * (1.0 / math.sqrt(head_dim))
        if mask is not None:
            scores = scores + mask
        weights = torch.softmax(scores, dim=-1)
        out = self.dropout(weights) @ v
        return out.permute(0, 2, 1, 3).contiguous().view(batch_size, seq_len, n_head * head_dim)

    def forward(self, x, kv=None, pad_mask=None):
        q, kT, v = self.project_to_query_key_value(x, kv)
        mask = None
        if self.causal:
            mask = self.create_causal_mask(x.shape[1], x.dtype, x.device)
        if pad_mask is not None:
            if not torch.is_tensor(pad_mask) or pad_mask.dtype != torch.bool:
                n_keys = (x if kv is None else kv).shape[1]
                pad_mask = torch.as_tensor(check_pad_mask(pad_mask, x.shape[0], n_keys))
            pad = torch.where(pad_mask.to(x.device), MASK_VALUE, 0.0).to(x.dtype)[:, None, None, :]
            mask = pad if mask is None else mask + pad
        return self.out_dropout(self.out_projection(self.self_attention(q, kT, v, mask)))


class FeedForward(nn.Module):
    def __init__(self, n_embd: int, middle_dim: int | None = None, p_dropout: float = 0.1,
                 bias: bool = True, activation: str = "gelu"):
        super().__init__()
        middle_dim = 4 * n_embd if middle_dim is None else middle_dim
        self.activation = activation
        self.linear_in = Linear(n_embd, middle_dim, bias)
        self.linear_out = Linear(middle_dim, n_embd, bias)
        self.dropout = Dropout(p_dropout)

    def forward(self, x):
        hidden = self.linear_in(x)
        hidden = F.gelu(hidden, approximate="tanh") if self.activation == "gelu" else F.relu(hidden)
        return self.dropout(self.linear_out(hidden))


class TransformerLayer(nn.Module):
    def __init__(self, n_embd: int, n_head: int, p_dropout: float = 0.1, ln_eps: float = 1e-5,
                 bias: bool = True, causal: bool = True, pre_ln: bool = True,
                 middle_dim: int | None = None, activation: str = "gelu"):
        super().__init__()
        self.pre_ln = pre_ln
        self.ln_1 = LayerNorm(n_embd, eps=ln_eps)
        self.ln_2 = LayerNorm(n_embd, eps=ln_eps)
        self.attention = MultiHeadAttention(n_embd, n_head, causal=causal, p_dropout=p_dropout,
                                            bias=bias)
        self.ff = FeedForward(n_embd, middle_dim=middle_dim, p_dropout=p_dropout, bias=bias,
                              activation=activation)

    def forward(self, x, pad_mask=None):
        if self.pre_ln:
            x = x + self.attention(self.ln_1(x), pad_mask=pad_mask)
            return x + self.ff(self.ln_2(x))
        x = self.ln_1(x + self.attention(x, pad_mask=pad_mask))
        return self.ln_2(x + self.ff(x))


class DecoderLM(nn.Module):
    def __init__(self, n_vocab: int, n_embd: int, n_head: int, n_positions: int, n_layers: int = 4,
                 p_dropout: float = 0.1, ln_eps: float = 1e-5, bias: bool = True,
                 pre_ln: bool = True, causal: bool = True, tie_weights: bool = False,
                 positions: str = "learned", middle_dim: int | None = None):
        super().__init__()
        check_sizes("DecoderLM", n_vocab=(n_vocab, 1), n_layers=(n_layers, 0))
        self.n_embd, self.n_positions = n_embd, n_positions
        self.positions, self.tie_weights = positions, tie_weights
        self.token_embeddings = Embedding(n_vocab, n_embd)
        self.position_embeddings = (Embedding(n_positions, n_embd) if positions == "learned"
                                    else None)
        self.dropout = Dropout(p_dropout)
        self.layers = nn.ModuleList(TransformerLayer(n_embd, n_head, p_dropout=p_dropout,
                                                     ln_eps=ln_eps, bias=bias, causal=causal,
                                                     pre_ln=pre_ln, middle_dim=middle_dim)
                                    for _ in range(n_layers))
        self.ln = LayerNorm(n_embd, eps=ln_eps) if pre_ln else None
        self.lm_head = None if tie_weights else Linear(n_embd, n_vocab, bias=False)

    def embed(self, idx):
        seq_len = idx.shape[1]
        # only a table has a last row
        if self.positions == "learned" and seq_len > self.n_positions:
            raise ValueError(f"DecoderLM: sequence length {seq_len} exceeds "
                             f"n_positions={self.n_positions}")
        x = self.token_embeddings(idx)
        if self.positions == "learned":
            x = x + self.position_embeddings(torch.arange(seq_len, device=idx.device))[None]
        elif self.positions == "sinusoidal":
            encoding = torch.from_numpy(sinusoidal_positions(seq_len, self.n_embd))
            x = x + encoding.to(x.dtype).to(x.device)[None]
        return x

    def forward(self, idx, pad_mask=None):
        idx = idx if torch.is_tensor(idx) else torch.as_tensor(check_token_ids("DecoderLM", idx))
        x = self.dropout(self.embed(idx))
        for layer in self.layers:
            x = layer(x, pad_mask=pad_mask)
        if self.ln is not None:
            x = self.ln(x)
        if self.tie_weights:
            return x @ self.token_embeddings.weights.T
        return self.lm_head(x)


def lm_loss(logits, targets, ignore_index: int = -100):
    """transformer.lm_loss's twin: F.cross_entropy over (B, S, V) logits, leaving out
    ignore_index."""
    if not torch.is_tensor(targets):
        targets = torch.as_tensor(check_token_ids("lm_loss", targets, "targets", "targets"))
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                           targets.reshape(-1).to(logits.device), ignore_index=ignore_index)


class EncoderLayer(TransformerLayer):
    def __init__(self, n_embd: int, n_head: int, p_dropout: float = 0.1, ln_eps: float = 1e-5,
                 bias: bool = True, pre_ln: bool = False, middle_dim: int | None = None,
                 activation: str = "relu"):
        super().__init__(n_embd, n_head, p_dropout=p_dropout, ln_eps=ln_eps, bias=bias,
                         causal=False, pre_ln=pre_ln, middle_dim=middle_dim,
                         activation=activation)


class DecoderLayer(nn.Module):
    def __init__(self, n_embd: int, n_head: int, p_dropout: float = 0.1, ln_eps: float = 1e-5,
                 bias: bool = True, pre_ln: bool = False, middle_dim: int | None = None,
                 activation: str = "relu"):
        super().__init__()
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

    def forward(self, y, memory, src_pad_mask=None, tgt_pad_mask=None):
        if self.pre_ln:
            y = y + self.attention(self.ln_1(y), pad_mask=tgt_pad_mask)
            y = y + self.cross_attention(self.ln_2(y), kv=memory, pad_mask=src_pad_mask)
            return y + self.ff(self.ln_3(y))
        y = self.ln_1(y + self.attention(y, pad_mask=tgt_pad_mask))
        y = self.ln_2(y + self.cross_attention(y, kv=memory, pad_mask=src_pad_mask))
        return self.ln_3(y + self.ff(y))


def _shift_right(tgt, tgt_pad_mask, bos_id: int):
    """[bos, y_0, ..., y_{T-2}] and its pad mask (position 0, the bos, is never a pad)."""
    tgt_in = torch.cat([torch.full_like(tgt[:, :1], bos_id), tgt[:, :-1]], dim=1)
    if tgt_pad_mask is None:
        return tgt_in, None
    return tgt_in, torch.cat([torch.zeros_like(tgt_pad_mask[:, :1]), tgt_pad_mask[:, :-1]], dim=1)


def _as_ids(ids):
    return ids if torch.is_tensor(ids) else torch.as_tensor(check_token_ids("EncoderDecoder", ids))


def _as_mask(mask):
    return None if mask is None else torch.as_tensor(np.asarray(mask), dtype=torch.bool)


class EncoderDecoder(nn.Module):
    def __init__(self, n_vocab: int, n_embd: int, n_head: int, n_layers: int = 6,
                 n_positions: int = 1024, p_dropout: float = 0.1, ln_eps: float = 1e-5,
                 bias: bool = True, pre_ln: bool = False, middle_dim: int | None = None,
                 activation: str = "relu", bos_id: int = 1):
        super().__init__()
        self.n_embd, self.bos_id = n_embd, bos_id
        self.register_buffer("position_encoding",
                             torch.from_numpy(sinusoidal_positions(n_positions, n_embd)),
                             persistent=False)
        self.token_embeddings = Embedding(n_vocab, n_embd, std=n_embd ** -0.5)
        self.encoder_dropout = Dropout(p_dropout)
        self.decoder_dropout = Dropout(p_dropout)
        layer_options = dict(p_dropout=p_dropout, ln_eps=ln_eps, bias=bias, pre_ln=pre_ln,
                             middle_dim=middle_dim, activation=activation)
        self.encoder_layers = nn.ModuleList(EncoderLayer(n_embd, n_head, **layer_options)
                                            for _ in range(n_layers))
        self.encoder_ln = LayerNorm(n_embd, eps=ln_eps) if pre_ln else None
        self.decoder_layers = nn.ModuleList(DecoderLayer(n_embd, n_head, **layer_options)
                                            for _ in range(n_layers))
        self.decoder_ln = LayerNorm(n_embd, eps=ln_eps) if pre_ln else None

    def embed(self, ids):
        x = self.token_embeddings(ids) * math.sqrt(self.n_embd)
        return x + self.position_encoding[:ids.shape[1]].to(x.dtype)

    def encode(self, src, src_pad_mask=None):
        x = self.encoder_dropout(self.embed(_as_ids(src)))
        for layer in self.encoder_layers:
            x = layer(x, pad_mask=src_pad_mask)
        return self.encoder_ln(x) if self.encoder_ln is not None else x

    def decode(self, tgt_in, memory, src_pad_mask=None, tgt_in_pad_mask=None):
        y = self.decoder_dropout(self.embed(_as_ids(tgt_in)))
        for layer in self.decoder_layers:
            y = layer(y, memory, src_pad_mask=src_pad_mask, tgt_pad_mask=tgt_in_pad_mask)
        if self.decoder_ln is not None:
            y = self.decoder_ln(y)
        return y @ self.token_embeddings.weights.T

    def forward(self, src, tgt, src_pad_mask=None, tgt_pad_mask=None):
        src_pad_mask, tgt_pad_mask = _as_mask(src_pad_mask), _as_mask(tgt_pad_mask)
        tgt_in, tgt_in_pad_mask = _shift_right(_as_ids(tgt), tgt_pad_mask, self.bos_id)
        return self.decode(tgt_in, self.encode(src, src_pad_mask), src_pad_mask, tgt_in_pad_mask)


class TorchNNEncoderDecoder(nn.Module):
    """PyTorch's own Transformer (torch.nn.Transformer) inside the same embedding and output layer
    as EncoderDecoder: the independent reference for it. Float64, no dropout.

    Which final LayerNorms: torch.nn.Transformer builds one after the encoder and one after the
    decoder even when norm_first=False, which the paper's Post-LN model does not have (each of its
    layers already ends in a LayerNorm). So the encoder and decoder are built here as
    nn.TransformerEncoder and nn.TransformerDecoder and handed to nn.Transformer as
    custom_encoder/custom_decoder, with norm=None for Post-LN (norm_first=False, the paper) and
    norm=nn.LayerNorm for Pre-LN (norm_first=True), as EncoderDecoder's encoder_ln/decoder_ln.
    Biases on (torch's bias=False would drop LayerNorm biases too).

    activation: "relu" (torch.nn's default, the paper) or "gelu", passed as the callable
    F.gelu(x, approximate="tanh"): torch.nn's own "gelu" string is the erf form, not GPT-2's tanh
    form.
    """

    def __init__(self, n_vocab: int, n_embd: int, n_head: int, n_layers: int = 6,
                 n_positions: int = 1024, ln_eps: float = 1e-5, pre_ln: bool = False,
                 middle_dim: int | None = None, activation: str = "relu", bos_id: int = 1):
        super().__init__()
        self.n_embd, self.bos_id = n_embd, bos_id
        middle_dim = 4 * n_embd if middle_dim is None else middle_dim
        act = "relu" if activation == "relu" else (lambda x: F.gelu(x, approximate="tanh"))
        common = dict(d_model=n_embd, nhead=n_head, dim_feedforward=middle_dim, dropout=0.0,
                      activation=act, layer_norm_eps=ln_eps, batch_first=True, norm_first=pre_ln,
                      dtype=DTYPE)
        final_norm = ((lambda: nn.LayerNorm(n_embd, eps=ln_eps, dtype=DTYPE)) if pre_ln
                      else (lambda: None))
        encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(**common), n_layers,
                                        norm=final_norm(), enable_nested_tensor=False)
        decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(**common), n_layers,
                                        norm=final_norm())
        self.embedding = nn.Embedding(n_vocab, n_embd, dtype=DTYPE)
        self.transformer = nn.Transformer(n_embd, n_head, custom_encoder=encoder,
                                          custom_decoder=decoder, batch_first=True, dtype=DTYPE)
        self.register_buffer("position_encoding",
                             torch.from_numpy(sinusoidal_positions(n_positions, n_embd)),
                             persistent=False)

    def embed(self, ids):
        return self.embedding(ids) * math.sqrt(self.n_embd) + self.position_encoding[:ids.shape[1]]

    def forward(self, src, tgt, src_pad_mask=None, tgt_pad_mask=None):
        src_pad_mask, tgt_pad_mask = _as_mask(src_pad_mask), _as_mask(tgt_pad_mask)
        tgt_in, tgt_in_pad_mask = _shift_right(_as_ids(tgt), tgt_pad_mask, self.bos_id)
        # True: hidden
        causal = torch.triu(torch.ones(tgt_in.shape[1], tgt_in.shape[1], dtype=torch.bool), 1)
        out = self.transformer(self.embed(_as_ids(src)), self.embed(tgt_in), tgt_mask=causal,
                               src_key_padding_mask=src_pad_mask,
                               tgt_key_padding_mask=tgt_in_pad_mask,
                               memory_key_padding_mask=src_pad_mask, tgt_is_causal=True)
        return out @ self.embedding.weight.T


_QKV = ("q_projection", "k_projection", "v_projection")


def _torch_nn_location(reference: TorchNNEncoderDecoder, name: str):
    """Where EncoderDecoder's parameter `name` lives in the reference:
    (torch parameter, rows of it or None, whether ours is its transpose)."""
    parts = name.split(".")
    kind = "weight" if parts[-1] == "weights" else "bias"
    transposed = kind == "weight"     # Linear: ours (in, out), torch (out, in)
    if name == "token_embeddings.weights":
        return reference.embedding.weight, None, False
    if parts[0] in ("encoder_ln", "decoder_ln"):
        stack = (reference.transformer.encoder if parts[0] == "encoder_ln"
                 else reference.transformer.decoder)
        return getattr(stack.norm, kind), None, False
    stack = (reference.transformer.encoder if parts[0] == "encoder_layers"
             else reference.transformer.decoder)
    layer, sub = stack.layers[int(parts[1])], parts[2]
    if sub.startswith("ln_"):
        return getattr(getattr(layer, "norm" + sub[-1]), kind), None, False
    if sub == "ff":
        linear = layer.linear1 if parts[3] == "linear_in" else layer.linear2
        return getattr(linear, kind), None, transposed
    attention = layer.self_attn if sub == "attention" else layer.multihead_attn
    if parts[3] == "out_projection":
        return getattr(attention.out_proj, kind), None, transposed
    d = attention.embed_dim
    i = _QKV.index(parts[3])          # in_proj stacks q, k, v
    return getattr(attention, "in_proj_" + kind), slice(i * d, (i + 1) * d), transposed


def copy_to_torch_nn(reference: TorchNNEncoderDecoder, ours) -> TorchNNEncoderDecoder:
    """Copy every parameter of our EncoderDecoder into the torch.nn reference; every one of the
    reference's numbers is written exactly once (checked)."""
    written = 0
    with torch.no_grad():
        for name, p in ours.named_parameters():
            target, rows, transposed = _torch_nn_location(reference, name)
            value = torch.from_numpy(p.data.T if transposed else p.data)
            region = target if rows is None else target[rows]
            if tuple(region.shape) != tuple(value.shape):
                raise ValueError(f"copy_to_torch_nn: {name} has shape {tuple(value.shape)}, its "
                                 f"place in the reference {tuple(region.shape)}")
            region.copy_(value)
            written += value.numel()
    total = sum(p.numel() for p in reference.parameters())
    if written != total:
        raise ValueError(f"copy_to_torch_nn: wrote {written} of the reference's {total} numbers")
    return reference.train(False)


def torch_nn_gradients(reference: TorchNNEncoderDecoder, ours) -> dict:
    """Our parameter name -> the reference's gradient for it, in our layout, as a numpy array."""
    result = {}
    for name, _ in ours.named_parameters():
        source, rows, transposed = _torch_nn_location(reference, name)
        g = source.grad if rows is None else source.grad[rows]
        result[name] = (g.T if transposed else g).detach().numpy()
    return result


def copy_from(twin: nn.Module, ours) -> nn.Module:
    """Copy every parameter of our transformer.py module into its torch twin and link the dropouts.

    Both sides walk their parameters in definition order under the same names, so a mismatch in
    structure is reported by name rather than silently misaligned.
    """
    ours_params = dict(ours.named_parameters())
    twin_params = dict(twin.named_parameters())
    if list(ours_params) != list(twin_params):
        raise ValueError(f"copy_from: parameter names differ:\n ours: {list(ours_params)}\n "
                         f"twin: {list(twin_params)}")
    with torch.no_grad():
        for name, p in twin_params.items():
            source = ours_params[name].data
            if tuple(p.shape) != source.shape:
                raise ValueError(f"copy_from: {name} has shape {tuple(p.shape)} here and "
                                 f"{source.shape} in ours")
            p.copy_(torch.from_numpy(source))
    ours_dropouts = {name: m for name, m in ours.named_modules() if type(m).__name__ == "Dropout"}
    for name, module in twin.named_modules():
        if isinstance(module, Dropout):
            module.twin = ours_dropouts[name]
    twin.train(ours.training)
    return twin


def gradients(module: nn.Module) -> dict:
    """name -> gradient as a numpy array (zeros where a parameter got none)."""
    return {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().numpy()
            for n, p in module.named_parameters()}


def float64_copy(state_dict: dict, n_head: int) -> transformer.DecoderLM:
    """transformer.DecoderLM (float64, tensor.py) in eval mode holding the weights of a trained
    DecoderLM of this module (a state dict, float32 or float64): both name their parameters alike,
    so each tensor is copied by name, its shape checked. The sizes are read from the weights; the
    number of heads is not in them, so it is given."""
    n_vocab, n_embd = state_dict["token_embeddings.weights"].shape
    n_layers = len({k.split(".")[1] for k in state_dict if k.startswith("layers.")})
    ours = transformer.DecoderLM(n_vocab, n_embd, n_head,
                                 n_positions=state_dict["position_embeddings.weights"].shape[0],
                                 n_layers=n_layers, p_dropout=0.0)
    names = [n for n, _ in ours.named_parameters()]
    if sorted(names) != sorted(state_dict):
        raise ValueError(f"float64_copy: parameter names differ:\n ours:  {names}\n torch: "
                         f"{list(state_dict)}")
    for name, p in ours.named_parameters():
        value = state_dict[name].detach().double().numpy()
        if value.shape != p.data.shape:
            raise ValueError(f"float64_copy: {name} is {value.shape} in torch, {p.data.shape} here")
        p.data[...] = value
    return ours.eval()
