"""Many city-language runs of one architecture trained as one stacked model: city_train.train's
arithmetic for every run at once, for about two thirds of a lone run's CPU time per run (04's model,
stacks of 5; bench_city.py measures it; DEVELOPING.md says where the time goes).

Scripts 04 and 05 count their training claims over many seeds (notes §5.4, §7.6), and each seed is
a run of the same model with other weights and other batches. A lone run of 04's 6-layer model
makes some 400 small torch calls per step, each on a (256, 64) or (256, 256) matrix, and pays each
call's fixed cost once per run. Here E runs share every call: each weight has a leading run
axis, (E, in, out), a Linear is one batched matmul (`torch.baddbmm`) over the E runs, and Adam
updates all of them in one fused call. Nothing mixes the runs: every op works on each run's slice
alone and the loss is the sum of the runs' own losses, so a run's bits are the same whichever runs
share its stack (tests/test_city_stack.py checks alone against inside a stack, and the stack
against torch_ref.DecoderLM in float64).

A layer is three blocks, each a torch.autograd.Function with its backward written out: attention
(qkv, the causal core over every run, row and head in one batch, out_projection), the feed-forward
block (linear_in, GELU, linear_out) and LayerNorm. Autograd then keeps 6 nodes a layer (the four
blocks, two residual adds) instead of 17, and each block saves only the tensors its backward reads.

    stack = StackedDecoderLM([city_train.build_model(seed=s) for s in (0, 1, 2)])
    logits = stack(idx)                              # idx (3, B, S): run e's batch in row e
    city_train.train_stack(model=dict(n_layers=6), training=dict(lr=6e-3), seeds=[0, 1, 2])

Where it differs from a lone torch_ref.DecoderLM in float32, only in rounding: q, k and v come from
one (in, 3·out) matmul, GELU's tanh form is computed as x·sigmoid(2u) (what tensor.py composes,
and about 3× cheaper, forward and backward, than torch's tanh form on an AVX2 CPU of ours),
LayerNorm's scale and shift follow its normalisation, and the causal mask adds -inf to the scores
above the diagonal (torch_ref adds -1e9: the masked weights are exactly 0 in both).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from city_lab import V

GELU_A = 0.044715                     # the tanh form's cubic coefficient
GELU_K = 2.0 * math.sqrt(2.0 / math.pi)   # 0.5·(1 + tanh(u)) = sigmoid(2u)


def _transposed(w):
    """(E, a, b) -> (E, b, a), a view: products that take an operand transposed read it in place."""
    return w.transpose(1, 2)


class _FeedForward(torch.autograd.Function):
    """linear_out(GELU(linear_in(x))) for every run: GELU's tanh form as h·sigmoid(k·(h + a·h³)),
    five elementwise calls forward and five back over the (E, N, 4D) hidden layer."""

    @staticmethod
    def forward(ctx, x, w_in, b_in, w_out, b_out):
        h = torch.baddbmm(b_in, x, w_in)                                    # (E, N, 4D)
        hh = h * h
        s = torch.addcmul(h, hh, h, value=GELU_A).mul_(GELU_K).sigmoid_()
        g = h * s                                                           # GELU(h)
        ctx.save_for_backward(x, w_in, w_out, hh, s, g)
        return torch.baddbmm(b_out, g, w_out)

    @staticmethod
    def backward(ctx, dy):
        x, w_in, w_out, hh, s, g = ctx.saved_tensors
        dw_out, db_out = torch.bmm(_transposed(g), dy), dy.sum(dim=1, keepdim=True)
        dg = torch.bmm(dy, _transposed(w_out))
        # d/dh h·s(u) = s + h·s·(1 − s)·du/dh = s + (g − g·s)·k·(1 + 3a·h²)
        du = hh.mul(3 * GELU_A * GELU_K).add_(GELU_K)
        dh = torch.addcmul(s, torch.addcmul(g, g, s, value=-1), du).mul_(dg)
        dw_in, db_in = torch.bmm(_transposed(x), dh), dh.sum(dim=1, keepdim=True)
        return torch.bmm(dh, _transposed(w_in)), dw_in, db_in, dw_out, db_out


class _Attention(torch.autograd.Function):
    """out_projection(causal attention(qkv(x))) for every run: q, k and v of every run, batch row
    and head are one batch of (S, D/h) matrices, so each product of the core is one torch.bmm;
    softmax's backward is torch's own kernel."""

    @staticmethod
    def forward(ctx, x, w_qkv, b_qkv, w_out, b_out, n_head: int, B: int, S: int):
        E, N, D = x.shape
        qkv = torch.baddbmm(b_qkv, x, w_qkv)                                # (E, N, 3D)
        # (E, B·S, 3D) -> (3, E·B·h, S, D/h): q, k and v, a (S, D/h) matrix per run, row, head
        heads = qkv.view(E * B, S, 3, n_head, D // n_head).permute(2, 0, 3, 1, 4)
        q, k, v = heads.reshape(3, E * B * n_head, S, D // n_head)
        mask = torch.full((S, S), -math.inf, dtype=x.dtype).triu_(1)       # causal: -inf above
        p = torch.baddbmm(mask, q, _transposed(k), alpha=1 / math.sqrt(D // n_head)).softmax(-1)
        # (E·B·h, S, D/h) -> (E, B·S, D): the heads side by side again
        joined = torch.bmm(p, v).view(E * B, n_head, S, -1).transpose(1, 2).reshape(E, N, D)
        ctx.save_for_backward(x, w_qkv, w_out, q, k, v, p, joined)
        ctx.shape = (n_head, B, S)
        return torch.baddbmm(b_out, joined, w_out)

    @staticmethod
    def backward(ctx, dy):
        x, w_qkv, w_out, q, k, v, p, joined = ctx.saved_tensors
        (n_head, B, S), (E, N, D) = ctx.shape, x.shape
        dw_out, db_out = torch.bmm(_transposed(joined), dy), dy.sum(dim=1, keepdim=True)
        # (E, B·S, D) -> (E·B·h, S, D/h)
        d_joined = torch.bmm(dy, _transposed(w_out)).view(E * B, S, n_head, -1).transpose(1, 2)
        d_out = d_joined.reshape(E * B * n_head, S, D // n_head)
        d_heads = torch.empty((3,) + q.shape, dtype=x.dtype)               # dq, dk, dv
        torch.bmm(_transposed(p), d_out, out=d_heads[2])
        d_scores = torch._softmax_backward_data(torch.bmm(d_out, _transposed(v)), p, -1, p.dtype)
        d_scores.mul_(1 / math.sqrt(D // n_head))
        torch.bmm(d_scores, k, out=d_heads[0])
        torch.bmm(_transposed(d_scores), q, out=d_heads[1])
        # (3, E·B·h, S, D/h) -> (E, B·S, 3D)
        d_qkv = d_heads.view(3, E * B, n_head, S, -1).permute(1, 3, 0, 2, 4).reshape(E, N, 3 * D)
        dw_qkv, db_qkv = torch.bmm(_transposed(x), d_qkv), d_qkv.sum(dim=1, keepdim=True)
        return (torch.bmm(d_qkv, _transposed(w_qkv)), dw_qkv, db_qkv, dw_out, db_out,
                None, None, None)


class _LayerNorm(torch.autograd.Function):
    """LayerNorm with each run's own scale and shift, (E, N, D) with (E, 1, D): torch's fused
    normalisation and its backward kernel, the scale and shift written out around them."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps: float = 1e-5):
        normed, mean, rstd = torch.native_layer_norm(x, x.shape[-1:], None, None, eps)
        ctx.save_for_backward(x, weight, normed, mean, rstd)
        return torch.addcmul(bias, normed, weight)

    @staticmethod
    def backward(ctx, dy):
        x, weight, normed, mean, rstd = ctx.saved_tensors
        d_weight = (dy * normed).sum(dim=1, keepdim=True)
        dx = torch.ops.aten.native_layer_norm_backward(dy * weight, x, x.shape[-1:], mean, rstd,
                                                       None, None, [True, False, False])[0]
        return dx, d_weight, dy.sum(dim=1, keepdim=True), None


class StackedDecoderLM:
    """E torch_ref.DecoderLM of one shape (learned positions, no dropout, no tied head) as stacked
    tensors: `params[name]` is (E, ...) for each of the model's parameters, q, k and v's weights
    joined into one `qkv` (E, D, 3D) per layer."""

    def __init__(self, models: list):
        first = models[0]
        self.n_layers, self.n_head = len(first.layers), first.layers[0].attention.n_head
        self.pre_ln = first.ln is not None
        if first.lm_head is None or first.position_embeddings is None:
            raise ValueError("StackedDecoderLM stacks DecoderLMs with learned positions "
                             "and an lm_head")
        states = [m.state_dict() for m in models]
        self.params = {name: torch.stack([s[name] for s in states]).detach().clone()
                       for name in self._own_names(states[0])}
        for i in range(self.n_layers):
            attention = f"layers.{i}.attention."
            for part in ("weights", "bias"):
                self.params[f"layers.{i}.qkv.{part}"] = torch.stack([
                    torch.cat([s[f"{attention}{p}_projection.{part}"] for p in "qkv"], dim=-1)
                    for s in states])
        for name, tensor in self.params.items():
            if name.endswith(".bias") or name.split(".")[-2].startswith("ln"):
                # (E, out) -> (E, 1, out): broadcast over the rows
                tensor = tensor.reshape(len(models), 1, -1).clone()
            self.params[name] = tensor.requires_grad_(True)

    @staticmethod
    def _own_names(state: dict) -> list:
        return [name for name in state
                if not any(f"{p}_projection" in name for p in "qkv")]

    @property
    def size(self) -> int:
        return self.params["token_embeddings.weights"].shape[0]

    def parameters(self) -> list:
        return list(self.params.values())

    def __call__(self, idx):
        """
        Args:
            idx: (E, B, S) token ids, run e's batch in row e
        Returns:
            logits: (E, B·S, V)
        """
        p, (E, B, S) = self.params, idx.shape
        D = p["token_embeddings.weights"].shape[-1]
        offsets = torch.arange(E).view(E, 1, 1) * V                    # run e's rows of the tables
        x = F.embedding(idx + offsets, p["token_embeddings.weights"].view(E * V, D))  # (E, B, S, D)
        x = (x + p["position_embeddings.weights"][:, None, :S]).view(E, B * S, D)     # (E, B·S, D)
        for i in range(self.n_layers):
            x = self._layer(x, i, B, S)
        if self.pre_ln:
            x = _LayerNorm.apply(x, p["ln.weights"], p["ln.bias"])
        return torch.bmm(x, p["lm_head.weights"])                       # (E, B·S, V)

    def _layer(self, x, i: int, B: int, S: int):
        p, L = self.params, f"layers.{i}."
        ln_1 = lambda y: _LayerNorm.apply(y, p[L + "ln_1.weights"], p[L + "ln_1.bias"])
        ln_2 = lambda y: _LayerNorm.apply(y, p[L + "ln_2.weights"], p[L + "ln_2.bias"])
        if self.pre_ln:
            x = x + self._attention(ln_1(x), L, B, S)
            return x + self._feed_forward(ln_2(x), L)
        x = ln_1(x + self._attention(x, L, B, S))
        return ln_2(x + self._feed_forward(x, L))

    def _attention(self, x, L: str, B: int, S: int):
        p = self.params
        return _Attention.apply(x, p[L + "qkv.weights"], p[L + "qkv.bias"],
                                p[L + "attention.out_projection.weights"],
                                p[L + "attention.out_projection.bias"], self.n_head, B, S)

    def _feed_forward(self, x, L: str):
        p = self.params
        return _FeedForward.apply(x, p[L + "ff.linear_in.weights"], p[L + "ff.linear_in.bias"],
                                  p[L + "ff.linear_out.weights"], p[L + "ff.linear_out.bias"])

    def state_dicts(self) -> list:
        """Each run's parameters under torch_ref.DecoderLM's names and shapes (copies)."""
        out = []
        for e in range(self.size):
            state = {}
            for name, tensor in self.params.items():
                value = tensor[e].detach().clone()
                if ".qkv." in name:
                    layer, part = name.split(".qkv.")
                    for p, piece in zip("qkv", value.chunk(3, dim=-1)):
                        state[f"{layer}.attention.{p}_projection.{part}"] = piece.reshape(-1)\
                            if part == "bias" else piece.contiguous()
                else:
                    state[name] = value.reshape(-1) if value.shape[0] == 1 else value
            out.append(state)
        return out


def losses(logits, targets):
    """Each run's mean cross-entropy: (E, N, V) logits, (E, N) targets -> (E,)."""
    E, N, _ = logits.shape
    return F.cross_entropy(logits.reshape(E * N, V), targets.reshape(E * N),
                           reduction="none").view(E, N).mean(dim=1)
