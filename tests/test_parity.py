"""Parity, max abs difference <= 1e-12 in outputs and in every gradient (notes §9.2):
transformer.py (tensor.py) against torch_ref.py, and torch_ref.py against torch.nn (our Adam against
torch.optim.Adam: test_optim.py)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lecture06 import optim, torch_ref, transformer
from twins import max_diff, randomize_layernorms
from gradcheck import leaf
from lecture05.tensor import Tensor, no_grad

TOL = 1e-12
B, S, D, H, V = 3, 6, 16, 4, 11


@pytest.fixture(autouse=True)
def _seed():
    transformer.set_seed(0)
    torch.manual_seed(0)


def check_twins(ours, twin_class, ours_inputs, twin_kwargs=None, **call):
    """Run ours, then its twin (copy_from: same parameters, same dropout masks), backpropagate the
    same random output gradient through both; compare outputs, every parameter's and every input's
    gradient."""
    twin = torch_ref.copy_from(twin_class(**twin_kwargs), ours)
    out = ours(*ours_inputs, **call)
    twin_inputs = [torch.from_numpy(x.data.copy()).requires_grad_() if isinstance(x, Tensor) else x
                   for x in ours_inputs]
    twin_call = {k: (torch.from_numpy(v.data.copy()).requires_grad_() if isinstance(v, Tensor)
                     else v)
                 for k, v in call.items()}
    twin_out = twin(*twin_inputs, **twin_call)
    grad = np.random.default_rng(5).standard_normal(out.shape)
    out.backward(grad)
    twin_out.backward(torch.from_numpy(grad))
    diffs = {"output": max_diff(out.data, twin_out)}
    twin_grads = torch_ref.gradients(twin)
    ours_grads = {n: p.grad for n, p in ours.named_parameters()}
    assert list(ours_grads) == list(twin_grads)
    diffs.update({n: max_diff(g, twin_grads[n]) for n, g in ours_grads.items()})
    for k, (x, tx) in enumerate(zip(list(ours_inputs) + list(call.values()),
                                    twin_inputs + list(twin_call.values()))):
        if isinstance(x, Tensor):
            diffs[f"input {k}"] = max_diff(x.grad, tx.grad)
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] <= TOL, f"{worst}: {diffs[worst]:.2e}"
    assert all(g is not None and np.abs(g).max() > 0 for g in ours_grads.values())
    return diffs


# ---- transformer.py against torch_ref.py ---------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
def test_linear(bias):
    check_twins(transformer.Linear(D, 7, bias=bias), torch_ref.Linear,
                [leaf((B, S, D), "permuted")],
                dict(in_size=D, out_size=7, bias=bias))


def test_layernorm():
    check_twins(randomize_layernorms(transformer.LayerNorm(D)), torch_ref.LayerNorm,
                [leaf((B, S, D), "permuted")], dict(dim=D))


PAD = np.array([[False] * S, [False] * (S - 2) + [True] * 2, [False] + [True] * (S - 1)])


@pytest.mark.parametrize("causal,pad,p_dropout", [
    (True, False, 0.0), (False, False, 0.0), (True, True, 0.0), (False, True, 0.0),
    (True, True, 0.1)])
def test_attention(causal, pad, p_dropout):
    kwargs = dict(n_embd=D, n_head=H, causal=causal, p_dropout=p_dropout)
    call = {"pad_mask": PAD} if pad else {}
    check_twins(transformer.MultiHeadAttention(**kwargs), torch_ref.MultiHeadAttention,
                [leaf((B, S, D), "permuted")],
                kwargs, **call)


def test_cross_attention():
    kwargs = dict(n_embd=D, n_head=H, causal=False, p_dropout=0.1)
    memory_pad = np.zeros((B, S + 3), bool)
    memory_pad[1, -2:] = True
    check_twins(transformer.MultiHeadAttention(**kwargs), torch_ref.MultiHeadAttention,
                [leaf((B, S, D))], kwargs,
                kv=leaf((B, S + 3, D), seed=2), pad_mask=memory_pad)


def test_feedforward():
    kwargs = dict(n_embd=D, p_dropout=0.1)
    check_twins(transformer.FeedForward(**kwargs), torch_ref.FeedForward, [leaf((B, S, D))], kwargs)


@pytest.mark.parametrize("pre_ln", [True, False])
@pytest.mark.parametrize("p_dropout", [0.0, 0.1])
def test_transformer_layer(pre_ln, p_dropout):
    kwargs = dict(n_embd=D, n_head=H, p_dropout=p_dropout, pre_ln=pre_ln)
    check_twins(randomize_layernorms(transformer.TransformerLayer(**kwargs)),
                torch_ref.TransformerLayer, [leaf((B, S, D))],
                kwargs, pad_mask=PAD)


@pytest.mark.parametrize("tie_weights,positions,pre_ln", [
    (False, "learned", True), (True, "learned", True), (False, "sinusoidal", True),
    (True, "none", False)])
def test_decoder_lm_with_dropout(tie_weights, positions, pre_ln):
    kwargs = dict(n_vocab=V, n_embd=D, n_head=H, n_positions=S, n_layers=2, p_dropout=0.1,
                  tie_weights=tie_weights, positions=positions, pre_ln=pre_ln)
    model = randomize_layernorms(transformer.DecoderLM(**kwargs)).train()
    ids = np.random.default_rng(3).integers(0, V, (B, S))
    diffs = check_twins(model, torch_ref.DecoderLM, [ids], kwargs)
    assert len(diffs) == 1 + len(model.parameters())
    drops = [m for _, m in model.named_modules() if isinstance(m, transformer.Dropout)]
    # dropout really on
    assert len(drops) == 1 + 3 * 2 and all((m.last_mask == 0).any() for m in drops)


def test_a_length_0_sequence_gives_the_same_empty_logits_as_the_twin():
    kwargs = dict(n_vocab=V, n_embd=D, n_head=H, n_positions=S, n_layers=2, p_dropout=0.0)
    ours = transformer.DecoderLM(**kwargs)
    twin = torch_ref.copy_from(torch_ref.DecoderLM(**kwargs), ours)
    ids = np.zeros((B, 0), dtype=np.int64)
    assert ours(ids).shape == tuple(twin(ids).shape) == (B, 0, V)


def test_lm_loss_training_steps_match():
    """A few Adam steps on lm_loss with dropout: losses and parameters stay together.

    Except k_projection.bias: softmax ignores a shift shared by all keys, so its true gradient is 0
    and both sides compute rounding noise (~1e-18). Adam turns noise g into an update lr·g/eps, so
    there the two sides differ by up to lr/eps times that noise (~1e-12), and no more."""
    kwargs = dict(n_vocab=V, n_embd=D, n_head=H, n_positions=S, n_layers=2, p_dropout=0.1)
    ours = transformer.DecoderLM(**kwargs)
    twin = torch_ref.copy_from(torch_ref.DecoderLM(**kwargs), ours)
    opt, twin_opt = (optim.Adam(ours.parameters(), lr=1e-2),
                     torch.optim.Adam(twin.parameters(), lr=1e-2))
    rng = np.random.default_rng(4)
    for _ in range(3):
        ids = rng.integers(0, V, (B, S + 1))
        opt.zero_grad()
        loss = transformer.lm_loss(ours(ids[:, :-1]), ids[:, 1:])
        loss.backward()
        opt.step()
        twin_opt.zero_grad()
        logits = twin(ids[:, :-1])
        twin_loss = F.cross_entropy(logits.reshape(-1, V), torch.from_numpy(ids[:, 1:]).reshape(-1))
        twin_loss.backward()
        twin_opt.step()
        assert abs(loss.item() - twin_loss.item()) <= TOL
        k_bias_grads = [p.grad for n, p in ours.named_parameters()
                        if n.endswith("k_projection.bias")]
        assert max(np.abs(g).max() for g in k_bias_grads) <= 1e-15
    twin_params = dict(twin.named_parameters())
    diffs = {n: max_diff(p.data, twin_params[n]) for n, p in ours.named_parameters()}
    assert max(d for n, d in diffs.items() if not n.endswith("k_projection.bias")) <= TOL
    assert max(diffs.values()) <= 3 * 1e-2 * 1e-15 / 1e-8        # 3 steps of lr·|noise|/eps


def test_lm_loss_with_ignore_index_matches_cross_entropy_and_the_twin():
    """Padded positions (-100, F.cross_entropy's default)
    and another ignore_index: value and gradient."""
    logits = np.random.default_rng(6).standard_normal((B, S, V)) * 3
    targets = np.random.default_rng(7).integers(0, V, (B, S))
    targets[0, -2:] = targets[2, 1:] = -100
    for ignore_index, t in [(-100, targets),
                            (3, np.where(targets == -100, 3, np.where(targets == 3, 4, targets)))]:
        z = Tensor(logits.copy(), requires_grad=True)
        loss = transformer.lm_loss(z, t, ignore_index=ignore_index)
        loss.backward()
        tz = f64(logits).requires_grad_()
        official = F.cross_entropy(tz.reshape(-1, V), torch.from_numpy(t).reshape(-1),
                                   ignore_index=ignore_index)
        official.backward()
        assert abs(loss.item() - official.item()) <= TOL
        assert max_diff(z.grad, tz.grad) <= TOL
        assert (torch_ref.lm_loss(f64(logits), t, ignore_index=ignore_index).item()
                == official.item())
        assert (z.grad[t == ignore_index] == 0).all()


# ---- torch_ref.py against torch.nn ---------------------------------------------------------------
def f64(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)


def test_torch_ref_layernorm_vs_nn():
    ref = randomize_layernorms(transformer.LayerNorm(D, eps=1e-5))
    twin = torch_ref.copy_from(torch_ref.LayerNorm(D), ref)
    official = nn.LayerNorm(D, eps=1e-5, dtype=torch.float64)
    with torch.no_grad():
        official.weight.copy_(twin.weights)
        official.bias.copy_(twin.bias)
    x = torch.randn(B, S, D, dtype=torch.float64) * 2 + 1
    grad = torch.randn(B, S, D, dtype=torch.float64)
    twin(x).backward(grad)
    official(x).backward(grad)
    assert max_diff(twin(x), official(x)) <= TOL
    assert max_diff(twin.weights.grad, official.weight.grad) <= TOL
    assert max_diff(twin.bias.grad, official.bias.grad) <= TOL


def nn_attention_from(twin) -> nn.MultiheadAttention:
    """nn.MultiheadAttention with twin's weights: in_proj
    stacks q, k, v as (out, in), ours are (in, out)."""
    official = nn.MultiheadAttention(D, H, dropout=0.0, bias=True, batch_first=True,
                                     dtype=torch.float64)
    with torch.no_grad():
        official.in_proj_weight.copy_(torch.cat([twin.q_projection.weights.T,
                                                 twin.k_projection.weights.T,
                                                 twin.v_projection.weights.T]))
        official.in_proj_bias.copy_(torch.cat([twin.q_projection.bias, twin.k_projection.bias,
                                               twin.v_projection.bias]))
        official.out_proj.weight.copy_(twin.out_projection.weights.T)
        official.out_proj.bias.copy_(twin.out_projection.bias)
    return official


def assert_attention_grads_match(twin, official):
    """in_proj_weight's gradient split in three, transposed, is q/k/v_projection's gradient."""
    gq, gk, gv = official.in_proj_weight.grad.split(D)
    bq, bk, bv = official.in_proj_bias.grad.split(D)
    pairs = [(twin.q_projection.weights.grad, gq.T), (twin.k_projection.weights.grad, gk.T),
             (twin.v_projection.weights.grad, gv.T), (twin.q_projection.bias.grad, bq),
             (twin.k_projection.bias.grad, bk), (twin.v_projection.bias.grad, bv),
             (twin.out_projection.weights.grad, official.out_proj.weight.grad.T),
             (twin.out_projection.bias.grad, official.out_proj.bias.grad)]
    assert max(max_diff(a, b) for a, b in pairs) <= TOL


@pytest.mark.parametrize("mode", ["plain", "causal", "pad", "cross"])
def test_torch_ref_attention_vs_nn(mode):
    twin = torch_ref.MultiHeadAttention(D, H, causal=(mode == "causal"), p_dropout=0.0)
    official = nn_attention_from(twin)
    x = torch.randn(B, S, D, dtype=torch.float64, requires_grad=True)
    x_official = x.detach().clone().requires_grad_()
    kv = (torch.randn(B, S + 2, D, dtype=torch.float64, requires_grad=True) if mode == "cross"
          else None)
    kv_official = kv.detach().clone().requires_grad_() if kv is not None else None
    pad = torch.from_numpy(PAD) if mode == "pad" else None
    out = twin(x, kv=kv, pad_mask=pad)
    key = x_official if kv is None else kv_official
    # True: masked
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), 1) if mode == "causal" else None
    official_out, _ = official(x_official, key, key, key_padding_mask=pad, attn_mask=mask,
                               need_weights=False)
    assert max_diff(out, official_out) <= TOL
    grad = torch.randn(B, S, D, dtype=torch.float64)
    out.backward(grad)
    official_out.backward(grad)
    assert_attention_grads_match(twin, official)
    assert max_diff(x.grad, x_official.grad) <= TOL
    if kv is not None:
        assert max_diff(kv.grad, kv_official.grad) <= TOL


@pytest.mark.parametrize("norm_first", [True, False])
def test_torch_ref_layer_vs_nn_encoder_layer(norm_first):
    twin = randomize_layernorms(torch_ref.TransformerLayer(D, H, p_dropout=0.0, causal=False,
                                                           pre_ln=norm_first), seed=2)
    official = nn.TransformerEncoderLayer(D, H, dim_feedforward=4 * D, dropout=0.0,
                                          activation=lambda x: F.gelu(x, approximate="tanh"),
                                          batch_first=True, norm_first=norm_first,
                                          dtype=torch.float64)
    official.self_attn = nn_attention_from(twin.attention)
    with torch.no_grad():
        for mine, theirs in [(twin.ff.linear_in, official.linear1),
                             (twin.ff.linear_out, official.linear2)]:
            theirs.weight.copy_(mine.weights.T)
            theirs.bias.copy_(mine.bias)
        for mine, theirs in [(twin.ln_1, official.norm1), (twin.ln_2, official.norm2)]:
            theirs.weight.copy_(mine.weights)
            theirs.bias.copy_(mine.bias)
    x = torch.randn(B, S, D, dtype=torch.float64)
    pad = torch.from_numpy(PAD[:2])
    out = twin(x[:2], pad_mask=pad)
    official_out = official(x[:2], src_key_padding_mask=pad)
    assert max_diff(out, official_out) <= TOL
    grad = torch.randn(2, S, D, dtype=torch.float64)
    out.backward(grad)
    official_out.backward(grad)
    assert_attention_grads_match(twin.attention, official.self_attn)
    pairs = [(twin.ff.linear_in.weights.grad, official.linear1.weight.grad.T),
             (twin.ff.linear_in.bias.grad, official.linear1.bias.grad),
             (twin.ff.linear_out.weights.grad, official.linear2.weight.grad.T),
             (twin.ff.linear_out.bias.grad, official.linear2.bias.grad),
             (twin.ln_1.weights.grad, official.norm1.weight.grad),
             (twin.ln_1.bias.grad, official.norm1.bias.grad),
             (twin.ln_2.weights.grad, official.norm2.weight.grad),
             (twin.ln_2.bias.grad, official.norm2.bias.grad)]
    assert max(max_diff(a, b) for a, b in pairs) <= TOL


def test_softmax_loss_vs_cross_entropy():
    logits = np.random.default_rng(0).standard_normal((5, 7)) * 3
    logits[0] += 1000.0  # large logits: still exact after the max shift
    target = np.array([0, 6, 3, 3, 1])
    z = Tensor(logits.copy(), requires_grad=True)
    loss = transformer.softmax_loss(z, target)
    tz = f64(logits).requires_grad_()
    official = F.cross_entropy(tz, torch.from_numpy(target), reduction="none")
    assert max_diff(loss.data, official) <= TOL
    grad = np.random.default_rng(1).uniform(0.5, 1.5, 5)
    loss.backward(grad)
    official.backward(f64(grad))
    assert max_diff(z.grad, tz.grad) <= TOL


def zeros_for(module, shape):
    return (torch.zeros(shape, dtype=torch.float64) if module is torch_ref
            else Tensor(np.zeros(shape)))


@pytest.mark.parametrize("build,error,message", [
    (lambda m: m.DecoderLM(V, D, H, n_positions=S, n_layers=-1), ValueError,
     "n_layers must be an integer >= 0"),
    (lambda m: m.DecoderLM(0, D, H, n_positions=S), ValueError, "n_vocab must be an integer >= 1"),
    (lambda m: m.MultiHeadAttention(8, 0), ValueError, "n_head must be an integer >= 1"),
    (lambda m: m.MultiHeadAttention(6, 4), ValueError, "n_embd=6 is not divisible by n_head=4"),
    (lambda m: m.Embedding(V, D)(np.ones(V, dtype=bool)), TypeError, "token ids must be integers"),
    (lambda m: m.MultiHeadAttention(D, H, causal=False)(zeros_for(m, (1, 2, D)),
                                                        pad_mask=np.array([[1, 0]])),
     TypeError, "True at padded positions"),
    (lambda m: m.DecoderLM(V, D, H, n_positions=S, n_layers=1)(np.ones((1, 2))), TypeError,
     r"^DecoderLM: token ids must be integers, got dtype float64; pass ids.astype\(int\)$"),
    (lambda m: m.lm_loss(zeros_for(m, (1, 2, V)), np.ones((1, 2))), TypeError,
     r"^lm_loss: targets must be integers, got dtype float64; pass targets.astype\(int\)$"),
    (lambda m: m.MultiHeadAttention(D, H, causal=False)(zeros_for(m, (1, 2, D)),
                                                        pad_mask=np.zeros((1, 1, 2), bool)),
     ValueError, r"^pad_mask must have shape \(B, S_k\) = \(1, 2\), got \(1, 1, 2\)"),
], ids=["n_layers", "n_vocab", "n_head", "divisible", "bool ids", "int pad_mask", "float ids",
        "float targets", "3-D pad_mask"])
def test_torch_ref_refuses_the_same_bad_arguments_as_ours(build, error, message):
    for module in (transformer, torch_ref):
        with pytest.raises(error, match=message):
            build(module)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, TOL), (torch.float32, 1e-5)])
def test_float64_copy_computes_what_the_trained_torch_model_computes(dtype, tolerance):
    """A torch_ref.DecoderLM's weights copied into transformer.DecoderLM: the same logits, to
    float64 rounding from a float64 model, to float32 rounding from a float32 one."""
    original = torch_ref.DecoderLM(V, D, H, n_positions=S, n_layers=2, p_dropout=0.0).to(dtype)
    randomize_layernorms_of_twin(original)
    ours = torch_ref.float64_copy(original.state_dict(), n_head=H)
    assert not ours.training and ours.n_positions == S and len(ours.layers) == 2
    idx = np.random.default_rng(0).integers(0, V, (B, S))
    with torch.no_grad():
        theirs = original(torch.from_numpy(idx)).double()
    with no_grad():
        assert max_diff(ours(idx).data, theirs) <= tolerance


def randomize_layernorms_of_twin(model: nn.Module):
    """Every torch_ref.LayerNorm gets weights U(0.5, 1.5) and biases N(0, 0.3²): a copy that
    skipped them would then show."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch_ref.LayerNorm):
                module.weights.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.3)


def test_float64_copy_names_a_parameter_it_cannot_place():
    original = torch_ref.DecoderLM(V, D, H, n_positions=S, n_layers=1, p_dropout=0.0)
    renamed = dict(original.state_dict())
    renamed["lm_head.weight"] = renamed.pop("lm_head.weights")
    with pytest.raises(ValueError, match="parameter names differ"):
        torch_ref.float64_copy(renamed, n_head=H)
    post_ln = torch_ref.DecoderLM(V, D, H, n_positions=S, n_layers=1, p_dropout=0.0,
                                  pre_ln=False)
    with pytest.raises(ValueError, match="parameter names differ"):
        torch_ref.float64_copy(post_ln.state_dict(), n_head=H)
