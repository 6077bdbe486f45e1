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

A layer is three blocks on plain torch autograd: attention (qkv, the causal core over every run,
row and head in one batch, out_projection), the feed-forward block (linear_in, GELU, linear_out)
and LayerNorm. (Their backward written out by hand saved about 3% of a stacked step: not kept.)

    stack = StackedDecoderLM([city_train.build_model(seed=s) for s in (0, 1, 2)])
    logits = stack(idx)                              # idx (3, B, S): run e's batch in row e
    city_train.train_stack(model=dict(n_layers=6), training=dict(lr=6e-3), seeds=[0, 1, 2])

Where it differs from a lone torch_ref.DecoderLM in float32, only in rounding: q, k and v come from
one (in, 3·out) matmul, GELU's tanh form is torch's own (F.gelu(approximate="tanh"); torch_ref
composes x·sigmoid(2u) as tensor.py does: under autograd, torch's one op saves 4% of a stacked step
on a Zen 3 CPU of ours against the five it replaces),
LayerNorm's scale and shift follow its normalisation, and the causal mask adds -inf to the scores
above the diagonal (torch_ref adds -1e9: the masked weights are exactly 0 in both).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lecture06.city_lab import V

def _transposed(w):
    """(E, a, b) -> (E, b, a), a view: products that take an operand transposed read it in place."""
    return w.transpose(1, 2)


def feed_forward(x, w_in, b_in, w_out, b_out):
    """linear_out(GELU(linear_in(x))) for every run, GELU in its tanh form."""
    h = torch.baddbmm(b_in, x, w_in)                                        # (E, N, 4D)
    return torch.baddbmm(b_out, F.gelu(h, approximate="tanh"), w_out)


def attention(x, w_qkv, b_qkv, w_out, b_out, n_head: int, B: int, S: int):
    """out_projection(causal attention(qkv(x))) for every run: q, k and v of every run, batch row
    and head are one batch of (S, D/h) matrices, so each product of the core is one torch.bmm."""
    E, N, D = x.shape
    qkv = torch.baddbmm(b_qkv, x, w_qkv)                                    # (E, N, 3D)
    # (E, B·S, 3D) -> (3, E·B·h, S, D/h): q, k and v, a (S, D/h) matrix per run, row, head
    heads = qkv.view(E * B, S, 3, n_head, D // n_head).permute(2, 0, 3, 1, 4)
    q, k, v = heads.reshape(3, E * B * n_head, S, D // n_head)
    mask = torch.full((S, S), -math.inf, dtype=x.dtype).triu_(1)           # causal: -inf above
    p = torch.baddbmm(mask, q, _transposed(k), alpha=1 / math.sqrt(D // n_head)).softmax(-1)
    # (E·B·h, S, D/h) -> (E, B·S, D): the heads side by side again
    joined = torch.bmm(p, v).view(E * B, n_head, S, -1).transpose(1, 2).reshape(E, N, D)
    return torch.baddbmm(b_out, joined, w_out)


def layer_norm(x, weight, bias, eps: float = 1e-5):
    """LayerNorm with each run's own scale and shift: (E, N, D) with (E, 1, D)."""
    return torch.addcmul(bias, F.layer_norm(x, x.shape[-1:], eps=eps), weight)


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
            x = layer_norm(x, p["ln.weights"], p["ln.bias"])
        return torch.bmm(x, p["lm_head.weights"])                       # (E, B·S, V)

    def _layer(self, x, i: int, B: int, S: int):
        p, L = self.params, f"layers.{i}."
        ln_1 = lambda y: layer_norm(y, p[L + "ln_1.weights"], p[L + "ln_1.bias"])
        ln_2 = lambda y: layer_norm(y, p[L + "ln_2.weights"], p[L + "ln_2.bias"])
        if self.pre_ln:
            x = x + self._attention(ln_1(x), L, B, S)
            return x + self._feed_forward(ln_2(x), L)
        x = ln_1(x + self._attention(x, L, B, S))
        return ln_2(x + self._feed_forward(x, L))

    def _attention(self, x, L: str, B: int, S: int):
        p = self.params
        return attention(x, p[L + "qkv.weights"], p[L + "qkv.bias"],
                         p[L + "attention.out_projection.weights"],
                         p[L + "attention.out_projection.bias"], self.n_head, B, S)

    def _feed_forward(self, x, L: str):
        p = self.params
        return feed_forward(x, p[L + "ff.linear_in.weights"], p[L + "ff.linear_in.bias"],
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
