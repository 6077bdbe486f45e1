"""transformer.py: every-element gradient checks of every module, the GELU and 1/√x identities,
masks, dropout, position limits, errors, and that the
modules use nothing but tensor.py's primitives."""
import ast
import inspect
import math
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lecture05 import tensor
from lecture06 import transformer
from gradcheck import PRIMITIVES, check_gradients, leaf
from lecture05.tensor import Tensor, count_ops

B, S, D, H, V = 2, 3, 4, 2, 5                 # small: every element is perturbed twice


@pytest.fixture(autouse=True)
def _seed():
    transformer.set_seed(0)


def randomize_layernorms(module, seed=1):
    """LayerNorm starts at weights 1, bias 0; random values make their gradients a real test."""
    rng = np.random.default_rng(seed)
    for _, m in module.named_modules():
        if isinstance(m, transformer.LayerNorm):
            m.weights.data[...] = rng.uniform(0.5, 1.5, m.weights.shape)
            m.bias.data[...] = rng.uniform(-0.5, 0.5, m.bias.shape)
    return module


def check_module(module, f, inputs=()):
    """Gradient check of f() with respect to every parameter of module and every input leaf."""
    return check_gradients(f, module.parameters() + list(inputs))


# ---- gradient checks ---------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["contiguous", "permuted"])
@pytest.mark.parametrize("bias", [True, False])
def test_gradient_linear(layout, bias):
    lin, x = transformer.Linear(D, 3, bias=bias), leaf((B, S, D), layout)
    assert (lin.bias is None) == (not bias)
    check_module(lin, lambda: lin(x), [x])


def test_gradient_embedding():
    emb = transformer.Embedding(V, D)
    ids = np.array([[0, 3, 3], [4, 0, 3]])     # repeated ids: their gradients add up
    check_module(emb, lambda: emb(ids))


@pytest.mark.parametrize("layout", ["contiguous", "permuted"])
def test_gradient_layernorm(layout):
    ln, x = randomize_layernorms(transformer.LayerNorm(D)), leaf((B, S, D), layout)
    check_module(ln, lambda: ln(x), [x])


@pytest.mark.parametrize("layout", ["contiguous", "permuted"])
@pytest.mark.parametrize("causal", [True, False])
def test_gradient_attention(causal, layout):
    mha, x = (transformer.MultiHeadAttention(D, H, causal=causal, p_dropout=0.0),
              leaf((B, S, D), layout))
    check_module(mha, lambda: mha(x), [x])


def test_gradient_attention_pad_mask():
    mha, x = (transformer.MultiHeadAttention(D, H, causal=False, p_dropout=0.0),
              leaf((B, S, D), "permuted"))
    pad = np.array([[False, False, True], [False, True, True]])
    check_module(mha, lambda: mha(x, pad_mask=pad), [x])


def test_gradient_cross_attention():
    mha = transformer.MultiHeadAttention(D, H, causal=False, p_dropout=0.0)
    x, memory = leaf((B, S, D)), leaf((B, S + 2, D), "permuted", seed=1)   # 3 queries, 5 keys
    pad = np.array([[False] * 5, [False, False, False, True, True]])
    check_module(mha, lambda: mha(x, kv=memory, pad_mask=pad), [x, memory])


@pytest.mark.parametrize("layout", ["contiguous", "permuted"])
def test_gradient_feedforward(layout):
    ff, x = transformer.FeedForward(D, p_dropout=0.0), leaf((B, S, D), layout)
    check_module(ff, lambda: ff(x), [x])


@pytest.mark.parametrize("pre_ln", [True, False])
def test_gradient_transformer_layer(pre_ln):
    layer = randomize_layernorms(transformer.TransformerLayer(D, H, p_dropout=0.0, pre_ln=pre_ln))
    x = leaf((B, S, D), "permuted")
    pad = np.array([[False, False, False], [False, False, True]])
    check_module(layer, lambda: layer(x, pad_mask=pad), [x])


@pytest.mark.parametrize("positions,tie_weights,pre_ln,n_layers", [
    ("learned", False, True, 2), ("sinusoidal", False, True, 1), ("none", False, True, 1),
    ("learned", True, True, 1), ("learned", False, False, 1)])
def test_gradient_decoder_lm(positions, tie_weights, pre_ln, n_layers):
    # an FFN of middle size D, not 4D: 40% fewer elements to perturb, the same paths (the 4D FFN's
    # own check is test_gradient_feedforward)
    model = randomize_layernorms(transformer.DecoderLM(V, D, H, n_positions=S, n_layers=n_layers,
                                                       p_dropout=0.0, positions=positions,
                                                       tie_weights=tie_weights, pre_ln=pre_ln,
                                                       middle_dim=D))
    ids = np.array([[1, 4, 1], [0, 2, 3]])
    names = [n for n, _ in model.named_parameters()]
    assert ("lm_head.weights" in names) == (not tie_weights)
    assert ("position_embeddings.weights" in names) == (positions == "learned")
    check_module(model, lambda: model(ids))


def test_gradient_losses():
    z = leaf((3, 5))
    z.data[0] *= 1000.0                        # a row of large logits: the max must be subtracted
    check_gradients(lambda: transformer.logsumexp(z, dim=1), [z])
    check_gradients(lambda: transformer.logsumexp(z, dim=0), [z])
    check_gradients(lambda: transformer.softmax(z, dim=-1), [z])
    check_gradients(lambda: transformer.softmax_loss(z, [2, 0, 4]), [z])
    logits = leaf((B, S, V), "permuted")
    check_gradients(lambda: transformer.lm_loss(logits.contiguous(), [[1, 2, 3], [0, 4, 4]]),
                    [logits])


def test_softmax_loss_values_and_gradient():
    z = tensor.tensor([[1000.0, 999.0, 998.0], [0.5, -1.0, 2.0]], requires_grad=True)
    y = np.array([0, 2])
    loss = transformer.softmax_loss(z, y)
    expected = (np.log(np.exp(z.data - z.data.max(1, keepdims=True)).sum(1)) + z.data.max(1)
                - z.data[[0, 1], y])
    np.testing.assert_allclose(loss.data, expected, rtol=1e-15)
    # logsumexp([1000, 999, 998]) (notes §9.1)
    assert abs((loss.data[0] + 1000.0) - 1000.407606) < 5e-7
    loss.sum().backward()
    p = np.exp(z.data - z.data.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(z.grad, p - np.eye(3)[y], rtol=0, atol=1e-15)


INF = np.inf
INFINITE_ROWS = np.array([[-INF, -INF, -INF], [INF, 1.0, 2.0], [INF, -INF, 0.0], [INF, INF, 1.0],
                          [-INF, 0.0, 1.0], [0.0, -INF, 1.0], [1000.0, 999.0, 998.0],
                          [1.0, 2.0, 3.0]])


def test_logsumexp_is_minus_inf_on_minus_inf_rows_and_plus_inf_on_rows_with_plus_inf_as_in_torch():
    ours = transformer.logsumexp(tensor.tensor(INFINITE_ROWS), dim=1).data[:, 0]
    theirs = torch.logsumexp(torch.from_numpy(INFINITE_ROWS), dim=1).numpy()
    assert not np.isnan(ours).any()
    np.testing.assert_array_equal(ours[:4], [-INF, INF, INF, INF])
    np.testing.assert_allclose(ours, theirs, rtol=1e-15, atol=0)     # infinities compared exactly
    np.testing.assert_allclose(transformer.logsumexp(tensor.tensor(INFINITE_ROWS.T), dim=0).data[0],
                               theirs, rtol=1e-15)


def test_softmax_loss_with_infinite_logits_is_logsumexp_minus_z_y_as_torch_computes_it():
    """F.cross_entropy agrees wherever it is defined: finite rows and rows holding -inf (a -inf
    logit off the target costs nothing; on the target, the loss is inf). A row holding +inf is nan
    in F.cross_entropy, whose log_softmax subtracts the inf max; ours gives logsumexp(z) - z_y
    there: +inf, or nan where z_y is +inf too."""
    y = np.array([0, 1, 0, 2, 2, 1, 0, 2])
    z = Tensor(INFINITE_ROWS.copy())
    with np.errstate(invalid="ignore"):
        loss = transformer.softmax_loss(z, y).data
        zt = torch.from_numpy(INFINITE_ROWS)
        definition = (torch.logsumexp(zt, dim=1) - zt[np.arange(8), y]).numpy()
    np.testing.assert_allclose(loss, definition, rtol=1e-15, atol=0, equal_nan=True)
    np.testing.assert_array_equal(np.isnan(loss),
                                  [True, False, True, False, False, False, False, False])
    no_plus_inf = ~(INFINITE_ROWS == INF).any(axis=1)
    official = F.cross_entropy(zt, torch.from_numpy(y), reduction="none").numpy()
    np.testing.assert_allclose(loss[no_plus_inf], official[no_plus_inf], rtol=0, atol=1e-12,
                               equal_nan=True)
    assert loss[5] == INF and np.isfinite(loss[4])  # -inf on the target; -inf elsewhere


def test_gradients_of_finite_rows_do_not_change_when_another_row_is_infinite():
    finite = np.random.default_rng(0).standard_normal((3, 4)) * 5
    y = np.array([1, 3, 0])
    alone, mixed = Tensor(finite.copy(), requires_grad=True), Tensor(
        np.vstack([finite, [[-INF, 0.0, INF, 1.0]]]), requires_grad=True)
    transformer.softmax_loss(alone, y).sum().backward()
    with np.errstate(invalid="ignore"):
        transformer.softmax_loss(mixed, np.append(y, 1)).sum().backward()
    np.testing.assert_array_equal(mixed.grad[:3], alone.grad)
    p = np.exp(finite - finite.max(1, keepdims=True))
    np.testing.assert_allclose(alone.grad, p / p.sum(1, keepdims=True) - np.eye(4)[y], rtol=0,
                               atol=1e-15)


def test_lm_loss_leaves_out_positions_whose_target_is_ignore_index_in_value_and_gradient():
    logits = leaf((B, S, V), seed=3)
    targets = np.array([[1, 2, -100], [0, -100, -100]])
    kept = targets != -100
    loss = transformer.lm_loss(logits, targets)
    loss.backward()
    per_position = transformer.softmax_loss(Tensor(logits.data.reshape(-1, V)),
                                            np.where(kept, targets, 0).reshape(-1))
    assert loss.item() == pytest.approx(per_position.data[kept.reshape(-1)].mean(), rel=1e-15)
    assert (logits.grad[~kept] == 0).all() and (np.abs(logits.grad[kept]).max(axis=-1) > 0).all()
    moved = Tensor(logits.data + np.where(kept, 0.0, 50.0)[..., None])       # padded logits changed
    assert transformer.lm_loss(moved, targets).item() == loss.item()  # bit-identical
    check_gradients(lambda: transformer.lm_loss(logits, targets, ignore_index=-100), [logits])
    # any id
    assert transformer.lm_loss(logits, np.where(kept, targets, 4),
                               ignore_index=4).item() == loss.item()
    with pytest.raises(ValueError, match="every target is ignore_index=-100"):
        transformer.lm_loss(logits, np.full((B, S), -100))


def test_padding_after_the_end_changes_neither_loss_nor_gradients_of_a_causal_model():
    model = transformer.DecoderLM(V, D, H, n_positions=5, n_layers=1, p_dropout=0.0)
    ids = np.array([[1, 2, 3, 0, 0], [4, 1, 0, 0, 0]])                       # 0 pads the end
    targets = np.array([[2, 3, 4, -100, -100], [1, 2, -100, -100, -100]])
    transformer.lm_loss(model(ids), targets).backward()
    padded = {n: p.grad for n, p in model.named_parameters()}
    model.zero_grad()
    # causal: nothing sees the pads
    transformer.lm_loss(model(ids[:, :3]), targets[:, :3]).backward()
    for name, p in model.named_parameters():
        np.testing.assert_allclose(p.grad, padded[name], rtol=1e-12, atol=1e-15, err_msg=name)
    assert (padded["position_embeddings.weights"][3:] == 0).all()


# ---- the two identities of notes §9.1 -----------------------------------------------------------
def test_gelu_is_x_sigmoid_2u():
    x = np.linspace(-6, 6, 2001)
    u = math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)
    ours = transformer.gelu(tensor.tensor(x)).data
    assert np.max(np.abs(ours - 0.5 * x * (1 + np.tanh(u)))) <= 1e-12
    theirs = F.gelu(torch.from_numpy(x), approximate="tanh").numpy()
    assert np.max(np.abs(ours - theirs)) <= 1e-12


def test_inverse_sqrt_from_exp_and_log():
    v = np.logspace(-10, 10, 201)
    ours = ((tensor.tensor(v).log() * -0.5).exp()).data   # as LayerNorm writes it
    assert np.max(np.abs(ours * np.sqrt(v) - 1.0)) <= 1e-12


def test_layernorm_matches_formula():
    x = np.random.default_rng(0).standard_normal((B, S, 6)) * 3 + 1
    ln = randomize_layernorms(transformer.LayerNorm(6, eps=1e-5))
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)    # biased variance
    expected = (x - mu) / np.sqrt(var + 1e-5) * ln.weights.data + ln.bias.data
    np.testing.assert_allclose(ln(tensor.tensor(x)).data, expected, rtol=0, atol=1e-13)


# ---- masks ---------------------------------------------------------------------------------------
def test_causal_mask_and_weights():
    mask = transformer.MultiHeadAttention.create_causal_mask(5).data[0, 0]
    assert ((mask[np.triu_indices(5, 1)] == tensor.MASK_VALUE).all()
            and (mask[np.tril_indices(5)] == 0).all())
    mha = transformer.MultiHeadAttention(D, H, causal=True, p_dropout=0.0)
    mha(leaf((B, 5, D)))
    w = mha.last_attention.data                                   # (B, h, S, S)
    assert w.shape == (B, H, 5, 5)
    assert (w[..., np.triu_indices(5, 1)[0], np.triu_indices(5, 1)[1]] == 0.0).all()   # exactly 0
    assert (w[..., np.tril_indices(5)[0], np.tril_indices(5)[1]] > 0).all()
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=0, atol=1e-15)


def test_self_attention_makes_the_causal_mask_itself():
    """causal=True (what forward passes) is HW3's call with create_causal_mask, bit for bit, with
    or without a pad mask added to it."""
    mha = transformer.MultiHeadAttention(D, H, causal=True, p_dropout=0.0)
    q, kT, v = mha.project_to_query_key_value(leaf((B, 5, D)))
    causal_mask = mha.create_causal_mask(5)
    pad = mha.create_pad_mask(np.array([[False] * 5, [True, True, False, False, False]]), B, 5)
    for mask in (None, pad):
        given = causal_mask if mask is None else causal_mask + mask
        made = mha.self_attention(q, kT, v, mask, causal=True).data
        assert (made == mha.self_attention(q, kT, v, given).data).all()
    with pytest.raises(ValueError, match="causal mask needs as many keys as queries"):
        mha.self_attention(q, Tensor(kT.data[..., :4]), Tensor(v.data[:, :, :4]), causal=True)


@pytest.mark.parametrize("j", [0, 2, 4])
def test_future_token_changes_nothing_before_it(j):
    model = transformer.DecoderLM(V + 3, D, H, n_positions=6, n_layers=2, p_dropout=0.0)
    ids = np.array([[1, 2, 3, 4, 5, 6], [7, 0, 1, 2, 3, 4]])
    changed = ids.copy()
    changed[:, j] = (changed[:, j] + 1) % (V + 3)
    a, b = model(ids).data, model(changed).data
    assert (a[:, :j] == b[:, :j]).all()                           # bit-identical before j
    assert (np.abs(a[:, j:] - b[:, j:]).max(axis=-1) > 0).all()   # every later position moves


def test_padded_token_changes_nothing_else():
    layer = transformer.TransformerLayer(D, H, p_dropout=0.0, causal=False)
    pad = np.array([[False, False, False, True, True], [False, True, True, True, True]])
    x = np.random.default_rng(0).standard_normal((B, 5, D))
    x2 = x.copy()
    x2[pad] = np.random.default_rng(1).standard_normal((pad.sum(), D)) * 10
    a, b = layer(Tensor(x), pad_mask=pad).data, layer(Tensor(x2), pad_mask=pad).data
    assert (a[~pad] == b[~pad]).all()                             # bit-identical at real tokens
    w = layer.attention.last_attention.data                       # (B, h, S, S)
    assert (w[0][..., 3:] == 0).all() and (w[1][..., 1:] == 0).all()


def test_fully_masked_row_has_no_nan():
    row = tensor.tensor(np.full((1, 4), tensor.MASK_VALUE))                # every entry masked
    # uniform, exactly
    np.testing.assert_array_equal(transformer.softmax(row).data, np.full((1, 4), 0.25))
    with np.errstate(invalid="ignore"):                           # what a real -inf would do
        inf_row = np.full(4, -np.inf)
        assert np.isnan(np.exp(inf_row - inf_row.max())).all()
    mha = transformer.MultiHeadAttention(D, H, causal=True, p_dropout=0.0)
    # query 0 (and all of batch 1) see only pads
    pad = np.array([[True, False, False], [True, True, True]])
    out = mha(leaf((B, S, D)), pad_mask=pad)
    w = mha.last_attention.data
    assert np.isfinite(out.data).all() and np.isfinite(w).all()
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=0, atol=1e-15)


# ---- dropout -------------------------------------------------------------------------------------
def test_dropout_eval_is_identity():
    drop, x = transformer.Dropout(0.5), leaf((3, 4))
    drop.eval()
    assert drop(x) is x
    model = transformer.DecoderLM(V, D, H, n_positions=S, n_layers=1, p_dropout=0.5).eval()
    assert all(not m.training for _, m in model.named_modules())
    ids = np.array([[1, 2, 3]])
    np.testing.assert_array_equal(model(ids).data, model(ids).data)


def test_dropout_train_mask_and_scaling():
    p, x = 0.1, Tensor(np.random.default_rng(0).uniform(1, 2, (200, 500)), requires_grad=True)
    drop = transformer.Dropout(p)
    y = drop(x)
    mask = drop.last_mask
    assert set(np.unique(mask)) == {0.0, 1 / (1 - p)}
    np.testing.assert_array_equal(y.data, x.data * mask)
    kept = (mask > 0).mean()
    assert abs(kept - (1 - p)) <= 4 * math.sqrt(p * (1 - p) / mask.size)
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, mask)  # the gradient is masked and scaled too
    given = np.ones_like(mask) * 2.0
    np.testing.assert_array_equal(drop(x, mask=given).data, x.data * 2.0)  # a supplied mask is used
    with pytest.raises(ValueError, match=r"p_dropout must be in \[0, 1\), got 1.0"):
        transformer.Dropout(1.0)


def test_printing_a_model_shows_its_tree_of_sub_modules_with_their_sizes_as_torch_does():
    model = transformer.DecoderLM(V, D, H, n_positions=S, n_layers=1, tie_weights=True)
    layer = """TransformerLayer(
  pre_ln=True
  (ln_1): LayerNorm(dim=4, eps=1e-05)
  (ln_2): LayerNorm(dim=4, eps=1e-05)
  (attention): MultiHeadAttention(
    n_embd=4, n_head=2, causal=True
    (q_projection): Linear(in_size=4, out_size=4)
    (k_projection): Linear(in_size=4, out_size=4)
    (v_projection): Linear(in_size=4, out_size=4)
    (out_projection): Linear(in_size=4, out_size=4)
    (dropout): Dropout(p_dropout=0.1)
    (out_dropout): Dropout(p_dropout=0.1)
  )
  (ff): FeedForward(
    activation='gelu'
    (linear_in): Linear(in_size=4, out_size=16)
    (linear_out): Linear(in_size=16, out_size=4)
    (dropout): Dropout(p_dropout=0.1)
  )
)"""
    assert repr(model.layers[0]) == layer
    assert repr(model) == (
        "DecoderLM(\n"
        "  n_vocab=5, n_embd=4, n_positions=3, positions='learned', tie_weights=True\n"
        "  (token_embeddings): Embedding(num_embeddings=5, embedding_dim=4)\n"
        "  (position_embeddings): Embedding(num_embeddings=3, embedding_dim=4)\n"
        "  (dropout): Dropout(p_dropout=0.1)\n"
        "  (layers.0): " + layer.replace("\n", "\n  ") + "\n"
        "  (ln): LayerNorm(dim=4, eps=1e-05)\n"
        ")")
    assert repr(transformer.Linear(D, V, bias=False)) == "Linear(in_size=4, out_size=5, bias=False)"


# ---- positions -----------------------------------------------------------------------------------
def test_sequence_longer_than_n_positions():
    model = transformer.DecoderLM(V, D, H, n_positions=8, n_layers=1)
    with pytest.raises(ValueError, match=r"sequence length 9 exceeds n_positions=8"):
        model(np.zeros((1, 9), dtype=int))
    assert model(np.zeros((1, 8), dtype=int)).shape == (1, 8, V)
    for positions in ("sinusoidal", "none"):  # computed, or none at all
        model = transformer.DecoderLM(V, D, H, n_positions=8, n_layers=1, positions=positions)
        assert model(np.zeros((1, 12), dtype=int)).shape == (1, 12, V)


def test_sinusoidal_positions_formula():
    pe = transformer.sinusoidal_positions(50, 8)
    t, i = 37, 2
    assert pe[t, 2 * i] == math.sin(t / 10000 ** (2 * i / 8))
    assert abs(pe[t, 2 * i + 1] - math.cos(t / 10000 ** (2 * i / 8))) <= 1e-15
    assert np.abs(pe).max() <= 1.0


# ---- structure: parameter counting, names, and nothing but primitives ----------------------------
def test_parameter_count():
    d, v, n_pos, layers = 8, 11, 7, 3
    per_layer = 2 * 2 * d + 4 * (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)
    model = transformer.DecoderLM(v, d, 2, n_positions=n_pos, n_layers=layers)
    assert model.num_parameters() == v * d + n_pos * d + layers * per_layer + 2 * d + d * v
    tied = transformer.DecoderLM(v, d, 2, n_positions=n_pos, n_layers=layers, tie_weights=True)
    assert model.num_parameters() - tied.num_parameters() == d * v
    assert len(model.layers) == layers and all(isinstance(m, transformer.TransformerLayer)
                                               for m in model.layers)
    assert [n for n, _ in model.named_parameters()][:3] == [
        "token_embeddings.weights", "position_embeddings.weights", "layers.0.ln_1.weights"]


def test_only_primitives_in_forward_and_backward():
    """Every op a DecoderLM's forward and backward run is one of the 14 primitives; every node of
    its graph was made by one, and the graph's leaves are the model's parameters or constants."""
    model = transformer.DecoderLM(V, D, H, n_positions=S, n_layers=2, p_dropout=0.1,
                                  tie_weights=True)
    with count_ops() as counts:
        loss = transformer.lm_loss(model(np.array([[1, 2, 3], [4, 0, 1]])), [[2, 3, 4], [0, 1, 2]])
        graph = tensor.graph(loss)
        loss.backward()
    assert set(counts) <= PRIMITIVES
    made = [n for n in graph if n._parents]
    assert {n._op for n in made} <= PRIMITIVES - {"max"}  # max is a constant: never in the graph
    leaves = [n for n in graph if not n._parents]
    assert {id(p) for p in model.parameters()} <= {id(n) for n in leaves}
    assert all(isinstance(n, transformer.Parameter) or not n.requires_grad for n in leaves)
    assert all(p.grad is not None for p in model.parameters())


def lecture_imports(module) -> tuple[set, set]:
    """The modules of lecture 5 and 6 that `module`'s file imports, by their names in the packages
    (`from lecture06 import kernels`, `from lecture05.tensor import Tensor`): (at its top, inside
    its functions), read from the source with ast (nothing is run)."""
    top, inside = set(), set()
    tree = ast.parse(inspect.getsource(module))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module in ("lecture05", "lecture06"):
            modules = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            modules = [node.module or ""]
        else:
            continue
        names = {name.split(".")[1] for name in modules
                 if name.split(".")[0] in ("lecture05", "lecture06") and "." in name}
        (top if node in tree.body else inside).update(names)
    return top, inside


def test_the_house_has_no_arrow_back_up_and_no_circle():
    """tensor <- kernels <- transformer <- encoder_decoder; decoding and kernels build on tensor
    alone. transformer.py reaches decoding.py only inside the two methods that hand work to it
    (new_cache, generate), at call time."""
    from lecture06 import decoding, encoder_decoder, kernels, optim
    imports = {m.__name__.split(".")[-1]: lecture_imports(m)
               for m in (tensor, kernels, optim, decoding, transformer, encoder_decoder)}
    assert imports["tensor"] == (set(), set())
    assert imports["optim"] == (set(), set())
    assert imports["kernels"] == ({"tensor"}, set())
    assert imports["decoding"] == ({"tensor"}, set())
    assert imports["transformer"] == ({"tensor", "kernels"}, {"decoding"})
    assert imports["encoder_decoder"] == ({"tensor", "decoding", "transformer"}, set())
    lazy = [node for node in ast.walk(ast.parse(inspect.getsource(transformer.DecoderLM)))
            if isinstance(node, ast.ImportFrom)]
    assert [f"{node.module}.{alias.name}" for node in lazy for alias in node.names] == [
        "lecture06.decoding", "lecture06.decoding"]


def violations(source: str) -> list:
    """Places in source that define a backward, or touch `.data`/`.grad`/`._backward` outside the
    optimizers, zero_grad and the parameter count (the
    only code allowed to handle arrays directly)."""
    allowed = {"SGD", "Adam", "num_parameters", "zero_grad"}
    found = []

    def walk(node, owner):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.ClassDef)):
                if child.name in ("backward", "_backward"):
                    found.append(f"defines {child.name} (line {child.lineno})")
                # inside an allowed scope, stay
                walk(child, owner if owner in allowed else child.name)
                continue
            if isinstance(child, ast.Attribute) and child.attr in ("data", "grad", "_backward") \
                    and owner not in allowed:
                found.append(f".{child.attr} in {owner} (line {child.lineno})")
            walk(child, owner)
    walk(ast.parse(source), None)
    return found


def test_no_handwritten_backward_or_array_arithmetic():
    assert violations(inspect.getsource(transformer)) == []
    bad = "class Gelu:\n    def forward(self, x):\n        return Tensor(np.tanh(x.data))\n" \
          "    def backward(self, g):\n        pass\n"
    assert violations(bad) == [".data in forward (line 3)", "defines backward (line 4)"]


# ---- bad input -----------------------------------------------------------------------------------
def test_errors():
    with pytest.raises(ValueError, match="n_embd=6 is not divisible by n_head=4"):
        transformer.MultiHeadAttention(6, 4)
    with pytest.raises(ValueError, match=r"Linear\(4, 3\): input's last dimension is 5"):
        transformer.Linear(4, 3)(leaf((2, 5)))
    with pytest.raises(ValueError, match=r"LayerNorm\(4\): input's last dimension is 3"):
        transformer.LayerNorm(4)(leaf((2, 3)))
    with pytest.raises(ValueError, match=r"expected x of shape \(B, S, 4\), got \(3, 4\)"):
        transformer.MultiHeadAttention(4, 2)(leaf((3, 4)))
    with pytest.raises(ValueError, match="causal mask needs as many keys as queries"):
        transformer.MultiHeadAttention(4, 2, causal=True)(leaf((1, 3, 4)), kv=leaf((1, 5, 4)))
    with pytest.raises(ValueError,
                       match=r"pad_mask must have shape \(B, S_k\) = \(1, 3\), got \(1, 4\)"):
        transformer.MultiHeadAttention(4, 2, causal=False)(leaf((1, 3, 4)),
                                                           pad_mask=np.zeros((1, 4), bool))
    with pytest.raises(ValueError,
                       match=r"expected logits \(N, C\) and target \(N,\), "
                             r"got \(3, 5\) and \(2,\)"):
        transformer.softmax_loss(leaf((3, 5)), [0, 1])
    with pytest.raises(IndexError, match=r"target ids must lie in 0..4"):
        transformer.softmax_loss(leaf((2, 5)), [0, 5])
    with pytest.raises(ValueError, match="positions must be 'learned', 'sinusoidal' or 'none'"):
        transformer.DecoderLM(V, D, H, n_positions=S, positions="rotary")
    with pytest.raises(ValueError, match=r"token ids of shape \(B, S\), got \(3,\)"):
        transformer.DecoderLM(V, D, H, n_positions=S)(np.array([1, 2, 3]))
    with pytest.raises(IndexError, match="out of range for a table with 5 rows"):
        transformer.DecoderLM(V, D, H, n_positions=S)(np.array([[1, 5]]))
    with pytest.raises(ValueError, match="d must be even"):
        transformer.sinusoidal_positions(4, 5)


def test_decoder_lm_refuses_a_negative_layer_count_and_an_empty_vocabulary():
    with pytest.raises(ValueError, match=r"DecoderLM: n_layers must be an integer >= 0, got -1"):
        transformer.DecoderLM(V, D, H, n_positions=S, n_layers=-1)
    with pytest.raises(ValueError, match=r"DecoderLM: n_vocab must be an integer >= 1, got 0"):
        transformer.DecoderLM(0, D, H, n_positions=S)
    with pytest.raises(ValueError, match=r"DecoderLM: n_layers must be an integer >= 0, got 2.0"):
        transformer.DecoderLM(V, D, H, n_positions=S, n_layers=2.0)
    bigram = transformer.DecoderLM(V, D, H, n_positions=S, n_layers=0)  # no layers: allowed
    assert bigram(np.array([[1, 2]])).shape == (1, 2, V)


def test_multi_head_attention_with_zero_heads_says_so_instead_of_dividing_by_zero():
    with pytest.raises(ValueError,
                       match=r"MultiHeadAttention: n_head must be an integer >= 1, got 0"):
        transformer.MultiHeadAttention(8, 0)
    with pytest.raises(ValueError,
                       match=r"MultiHeadAttention: n_embd must be an integer >= 1, got 0"):
        transformer.MultiHeadAttention(0, 2)


def test_bool_token_ids_are_refused_by_embedding_and_decoder_lm():
    ids = np.array([[True, False, True]])
    with pytest.raises(TypeError, match=r"^Embedding: token ids must be integers, got dtype bool "
                                        r"\(a mask\?\); pass integer ids$"):
        transformer.Embedding(V, D)(ids)
    with pytest.raises(TypeError, match=r"^DecoderLM: token ids must be integers, got dtype bool"):
        transformer.DecoderLM(V, D, H, n_positions=S)(ids)


@pytest.mark.parametrize("ids", [np.array([[1.0, 2.0]]), np.array([[1.7, 2.0]]), [[1.0, 2]]],
                         ids=["whole floats", "1.7", "a list with a float"])
def test_float_token_ids_are_refused_whole_or_not_naming_the_dtype_and_astype_int(ids):
    """As torch's nn.Embedding: 1.0 is refused as 1.7 is, with the same message."""
    model = transformer.DecoderLM(V, D, H, n_positions=S, n_layers=1)
    with pytest.raises(TypeError, match=r"^DecoderLM: token ids must be integers, got dtype "
                                        r"float64; pass ids.astype\(int\)$"):
        model(ids)
    with pytest.raises(TypeError, match=r"^Embedding: token ids must be integers, got dtype "
                                        r"float64; pass ids.astype\(int\)$"):
        transformer.Embedding(V, D)(ids)
    assert model(np.asarray(ids).astype(int)).shape == (1, 2, V)


def test_string_token_ids_say_to_look_tokens_up_in_the_vocabulary_first():
    with pytest.raises(TypeError, match=r"^DecoderLM: token ids must be integers, got strings "
                                        r"\(dtype <U3\); look each token up in the vocabulary "
                                        r"first$"):
        transformer.DecoderLM(V, D, H, n_positions=S, n_layers=1)([["the", "cat"]])


def test_lm_loss_with_float_targets_names_lm_loss_and_its_targets():
    with pytest.raises(TypeError, match=r"^lm_loss: targets must be integers, got dtype float64; "
                                        r"pass targets.astype\(int\)$"):
        transformer.lm_loss(leaf((B, S, V)), np.zeros((B, S)))


@pytest.mark.parametrize("mask",
                         [np.array([[1, 1, 0], [1, 0, 0]]), [[0, 0, 1], [0, 1, 1]],
                          np.zeros((2, 3))])
def test_a_pad_mask_of_numbers_is_refused_with_a_message_that_says_which_convention_we_use(mask):
    """HuggingFace's attention_mask is 1 = keep; ours is
    True = pad. Numbers are ambiguous, so refused."""
    expected = r"pad_mask must be a bool array with True at padded positions.*attention_mask == 0"
    with pytest.raises(TypeError, match=expected):
        transformer.MultiHeadAttention(D, H, causal=False)(leaf((2, S, D)), pad_mask=mask)
    with pytest.raises(TypeError, match=expected):
        transformer.DecoderLM(V, D, H, n_positions=S, n_layers=1)(np.zeros((2, S), dtype=int),
                                                                  pad_mask=mask)
    bools = [[False, False, True], [False, True, True]]  # a list of bools is fine
    assert transformer.MultiHeadAttention(D, H, causal=False)(leaf((2, S, D)),
                                                              pad_mask=bools).shape == (2, S, D)


def test_a_pad_mask_of_another_shape_than_b_s_is_refused_naming_both_shapes():
    """(B, 1, S) and HuggingFace's (B, 1, 1, S) used to pass and fail later, in a permute."""
    model = transformer.DecoderLM(V, D, H, n_positions=S, n_layers=1)
    ids = np.zeros((B, S), int)
    expected = {(B, 1, S): r"a row per sequence, True at its padded keys: the attention "
                           r"broadcasts it itself$",
                (B, 1, 1, S): r"that is HuggingFace's broadcast layout; ours is \(B, S_k\) bool, "
                              r"True at padded keys: from its 2-D attention_mask \(1 = keep\) "
                              r"pass attention_mask == 0$",
                (B, S + 1): r"a row per sequence, True at its padded keys: the attention "
                            r"broadcasts it itself$"}
    for shape, fix in expected.items():
        shown = str(shape).replace("(", r"\(").replace(")", r"\)")
        with pytest.raises(ValueError, match=rf"^pad_mask must have shape \(B, S_k\) = \(2, 3\), "
                                             rf"got {shown}; {fix}"):
            model(ids, pad_mask=np.ones(shape, bool))
    assert model(ids, pad_mask=np.zeros((B, S), bool)).shape == (B, S, V)


def test_softmax_loss_with_float_targets_says_targets_must_be_integer_class_ids():
    with pytest.raises(TypeError,
                       match=r"^softmax_loss: target class ids must be integers, got dtype "
                             r"float64; pass target.astype\(int\)$"):
        transformer.softmax_loss(leaf((2, 5)), np.array([0.0, 3.0]))
    with pytest.raises(TypeError, match="got dtype bool"):
        transformer.softmax_loss(leaf((2, 5)), np.array([True, False]))
    assert transformer.softmax_loss(leaf((0, 5)), []).shape == (0,)  # [] is float64, but empty


def test_token_ids_given_as_a_tensor_are_refused_with_the_numpy_call_that_gives_ids():
    ids = Tensor(np.array([[1, 2, 0]]))
    fix = r"must be integers in a numpy array \(or nested lists\), got a Tensor of shape "
    with pytest.raises(TypeError, match=rf"DecoderLM: token ids {fix}\(1, 3\); pass "
                                        r"ids.numpy\(\).astype\(int\)$"):
        transformer.DecoderLM(V, D, H, n_positions=S, n_layers=1)(ids)
    with pytest.raises(TypeError, match=rf"softmax_loss: target class ids {fix}\(2,\)"):
        transformer.softmax_loss(leaf((2, V)), Tensor(np.array([0, 1])))
    with pytest.raises(TypeError, match=rf"lm_loss: targets {fix}\(1, 3\)"):
        transformer.lm_loss(leaf((1, S, V)), ids)


def test_lm_loss_names_the_shapes_it_expects_and_points_2d_logits_at_softmax_loss():
    with pytest.raises(ValueError, match=r"^lm_loss: expected logits \(B, S, V\) and targets "
                                         r"\(B, S\), got \(3, 5\) and \(3,\); for \(N, C\) "
                                         r"logits use softmax_loss$"):
        transformer.lm_loss(leaf((S, V)), np.zeros(S, int))
    with pytest.raises(ValueError, match=r"^lm_loss: expected logits \(B, S, V\) and targets "
                                         r"\(B, S\), got \(2, 3, 5\) and \(2, 4\)$"):
        transformer.lm_loss(leaf((B, S, V)), np.zeros((B, S + 1), int))
    with pytest.raises(ValueError, match=r"got \(2, 3, 5\) and \(6,\)$"):   # flat: not (B, S)
        transformer.lm_loss(leaf((B, S, V)), np.zeros(B * S, int))


@pytest.mark.parametrize("pre_ln", [True, False])
def test_a_numpy_array_given_to_a_module_says_to_wrap_it_with_tensor_tensor(pre_ln):
    x = np.zeros((B, S, D))
    wrap = (r" must be a tensor.py Tensor, got numpy.ndarray; wrap it with tensor.tensor\(x\) "
            r"\(requires_grad=True if you want its gradient\)$")
    modules = {r"Linear\(4, 4\): input": transformer.Linear(D, D),
               r"LayerNorm\(4\): input": transformer.LayerNorm(D),
               "MultiHeadAttention: x": transformer.MultiHeadAttention(D, H),
               r"Linear\(4, 16\): input": transformer.FeedForward(D),
               # the layer's first sub-module speaks: ln_1 (Pre-LN) or the attention (Post-LN)
               (r"LayerNorm\(4\): input" if pre_ln else "MultiHeadAttention: x"):
                   transformer.TransformerLayer(D, H, pre_ln=pre_ln)}
    for who, module in modules.items():
        with pytest.raises(TypeError, match=who + wrap):
            module(x)
        assert module(tensor.tensor(x)).shape[:2] == (B, S)        # wrapped, it computes
    with pytest.raises(TypeError, match="lm_loss: logits" + wrap):
        transformer.lm_loss(np.zeros((B, S, V)), np.zeros((B, S), int))
    with pytest.raises(TypeError, match="softmax_loss: logits" + wrap):
        transformer.softmax_loss(np.zeros((B, V)), np.zeros(B, int))


def test_a_length_0_sequence_gives_empty_logits_as_torch_does():
    model = transformer.DecoderLM(V, D, H, n_positions=S, n_layers=1).eval()
    logits = model(np.zeros((2, 0), dtype=np.int64))
    assert logits.shape == (2, 0, V)
    logits.sum().backward()  # nothing to learn: zero gradients
    assert all((p.grad == 0).all() for p in model.parameters())
    np.testing.assert_array_equal(
        transformer.logsumexp(tensor.tensor(np.zeros((3, 0))), dim=1).data[:, 0],
        torch.logsumexp(torch.zeros(3, 0, dtype=torch.float64), dim=1).numpy())
    assert transformer.softmax(tensor.tensor(np.zeros((3, 0)))).shape == (3, 0)
    with pytest.raises(ValueError, match="no position to average over"):
        transformer.lm_loss(logits, np.zeros((2, 0), dtype=np.int64))  # F.cross_entropy: nan
