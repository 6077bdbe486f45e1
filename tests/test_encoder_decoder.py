"""The paper's encoder-decoder (encoder_decoder.py, notes §1.1, §3.3, §6.1-§6.2, §7.1)
against PyTorch's own torch.nn.Transformer and against its torch_ref twin: outputs and every
parameter's gradient agree to <= 1e-12 in float64, Post-LN and Pre-LN, ReLU and tanh GELU, padded
sources and targets, S_src != S_tgt, S = 1 and h = 1.

The torch.nn reference (torch_ref.TorchNNEncoderDecoder) is nn.Transformer with custom_encoder /
custom_decoder built from nn.TransformerEncoder / nn.TransformerDecoder: with norm=None for Post-LN
(norm_first=False, the paper: every layer already ends in a LayerNorm; nn.Transformer's default
would add a final one after the encoder and the decoder) and with a final nn.LayerNorm for Pre-LN
(norm_first=True), which is what our encoder_ln / decoder_ln are. GELU is passed to torch.nn as the
callable F.gelu(x, approximate="tanh"), since torch.nn's "gelu" string is the erf form.

Fully padded source rows are kept out of the parity tests (torch.nn gives nan there in its fast
path); one test documents the difference instead.
"""
import inspect

import numpy as np
import pytest
import torch

from lecture06 import encoder_decoder, torch_ref, transformer
from twins import max_diff, randomize_layernorms
from gradcheck import PRIMITIVES, check_gradients, leaf
from lecture05.tensor import count_ops
from test_transformer import violations

TOL = 1e-12


@pytest.fixture(autouse=True)
def _seed():
    transformer.set_seed(0)
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """Tiny float64 models gain nothing from threads, and on a busy 2-core machine torch's thread
    pool spins (seconds per call); restored for the other test files."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def batch(n_vocab, b, s_src, s_tgt, seed=0):
    """Random ids and pad masks (True = pad, at the end of a row) with at least one real token per
    row; row 1 is padded in source and target whenever the lengths allow it."""
    rng = np.random.default_rng(seed)
    src, tgt = rng.integers(0, n_vocab, (b, s_src)), rng.integers(0, n_vocab, (b, s_tgt))
    src_pad, tgt_pad = np.zeros((b, s_src), bool), np.zeros((b, s_tgt), bool)
    if b > 1:
        src_pad[1, max(1, s_src - 2):] = True
        tgt_pad[1, max(1, s_tgt - 3):] = True
    if b > 2:
        src_pad[2, 1:] = True                       # one real source token
        tgt_pad[2, s_tgt // 2:] = True
    return src, tgt, src_pad, tgt_pad


def three_models(pre_ln, activation, n_vocab, d, h, n_layers, n_positions=16, p_dropout=0.0):
    kwargs = dict(n_vocab=n_vocab, n_embd=d, n_head=h, n_layers=n_layers, n_positions=n_positions,
                  pre_ln=pre_ln, activation=activation)
    ours = randomize_layernorms(encoder_decoder.EncoderDecoder(**kwargs, p_dropout=p_dropout))
    twin = torch_ref.copy_from(torch_ref.EncoderDecoder(**kwargs, p_dropout=p_dropout), ours)
    official = torch_ref.copy_to_torch_nn(torch_ref.TorchNNEncoderDecoder(**kwargs), ours)
    return ours, twin, official


def run_all(models, inputs, seed=5):
    """Forward all three with the same inputs, backpropagate the same random output gradient;
    returns outputs and {name: gradient} of each, in our names and layouts."""
    ours, twin, official = models
    out, twin_out, official_out = ours(*inputs), twin(*inputs), official(*inputs)
    grad = np.random.default_rng(seed).standard_normal(out.shape)
    out.backward(grad)
    twin_out.backward(torch.from_numpy(grad))
    official_out.backward(torch.from_numpy(grad))
    grads = {n: p.grad for n, p in ours.named_parameters()}
    return ((out.data, grads), (twin_out, torch_ref.gradients(twin)),
            (official_out, torch_ref.torch_nn_gradients(official, ours)))


def worst(a, b) -> tuple:
    (out_a, grads_a), (out_b, grads_b) = a, b
    assert list(grads_a) == list(grads_b)
    diffs = {"output": max_diff(out_a, out_b),
             **{n: max_diff(g, grads_b[n]) for n, g in grads_a.items()}}
    name = max(diffs, key=diffs.get)
    return name, diffs[name]


# ---- parity ------------------------------------------------------------------------------------
SHAPES = {  # (B, S_src, S_tgt, d, h, n_layers)
    "S_src<S_tgt": (3, 5, 7, 16, 4, 2),
    "S_src>S_tgt, h=1": (3, 6, 3, 12, 1, 2),
    "S=1": (2, 1, 1, 8, 2, 1),
    "S_src=1, h=1": (2, 1, 4, 8, 1, 1),
    "S_tgt=1": (3, 4, 1, 8, 2, 2),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("pre_ln", [False, True], ids=["post_ln", "pre_ln"])
def test_outputs_and_every_gradient_match_torch_nn_transformer_and_the_twin(pre_ln, activation,
                                                                           shape):
    b, s_src, s_tgt, d, h, n_layers = SHAPES[shape]
    n_vocab = 11
    models = three_models(pre_ln, activation, n_vocab, d, h, n_layers)
    ours, twin, official = run_all(models, batch(n_vocab, b, s_src, s_tgt))
    for pair, (a, c) in {"ours-torch.nn": (ours, official), "twin-torch.nn": (twin, official),
                         "ours-twin": (ours, twin)}.items():
        name, diff = worst(a, c)
        assert diff <= TOL, f"{pair}: {name} differs by {diff:.2e}"
    grads = ours[1]
    assert all(g is not None and np.isfinite(g).all() for g in grads.values())
    # big enough that every gradient is a real test (none is structurally 0)
    if shape == "S_src<S_tgt":
        assert all(np.abs(g).max() > 1e-6 for n, g in grads.items()
                   if not n.endswith("k_projection.bias"))


def test_paper_configuration_is_post_ln_relu_without_final_layernorms():
    model = encoder_decoder.EncoderDecoder(11, 8, 2, n_layers=2)
    names = [n for n, _ in model.named_parameters()]
    assert not any(n.startswith(("encoder_ln", "decoder_ln")) for n in names)
    assert all(not layer.pre_ln and layer.ff.activation == "relu"
               for layer in model.encoder_layers + model.decoder_layers)
    official = torch_ref.TorchNNEncoderDecoder(11, 8, 2, n_layers=2)
    assert official.transformer.encoder.norm is None and official.transformer.decoder.norm is None
    assert not official.transformer.encoder.layers[0].norm_first
    # what we did not use, and why
    default_nn = torch.nn.Transformer(8, 2, 2, 2, 32, batch_first=True)
    assert default_nn.encoder.norm is not None and default_nn.decoder.norm is not None
    pre = encoder_decoder.EncoderDecoder(11, 8, 2, n_layers=2, pre_ln=True)
    assert [n for n, _ in pre.named_parameters()][-2:] == ["decoder_ln.weights", "decoder_ln.bias"]
    official_pre = torch_ref.TorchNNEncoderDecoder(11, 8, 2, n_layers=2, pre_ln=True)
    assert isinstance(official_pre.transformer.encoder.norm, torch.nn.LayerNorm)
    assert official_pre.transformer.encoder.layers[0].norm_first


def test_twin_matches_in_training_mode_with_the_same_dropout_masks():
    kwargs = dict(n_vocab=11, n_embd=16, n_head=4, n_layers=2, n_positions=16, p_dropout=0.2,
                  pre_ln=False)
    ours = randomize_layernorms(encoder_decoder.EncoderDecoder(**kwargs)).train()
    twin = torch_ref.copy_from(torch_ref.EncoderDecoder(**kwargs), ours)
    assert twin.training
    src, tgt, src_pad, tgt_pad = batch(11, 3, 5, 6)
    out, twin_out = ours(src, tgt, src_pad, tgt_pad), twin(src, tgt, src_pad, tgt_pad)
    grad = np.random.default_rng(5).standard_normal(out.shape)
    out.backward(grad)
    twin_out.backward(torch.from_numpy(grad))
    name, diff = worst((out.data, {n: p.grad for n, p in ours.named_parameters()}),
                       (twin_out, torch_ref.gradients(twin)))
    assert diff <= TOL, f"{name}: {diff:.2e}"
    drops = [m for _, m in ours.named_modules() if isinstance(m, transformer.Dropout)]
    # embeddings, encoder and decoder layers
    assert len(drops) == 2 + 2 * 3 + 2 * 5
    assert all((m.last_mask == 0).any() for m in drops)           # dropout really was on everywhere
    ours.eval()
    np.testing.assert_array_equal(ours(src, tgt, src_pad, tgt_pad).data,
                                  ours(src, tgt, src_pad, tgt_pad).data)


def test_fully_padded_source_row_torch_nn_gives_nan_or_zero_attention_ours_stays_finite():
    """A source row that is all padding: no key is visible to its queries. Ours gives the row finite
    (uniform) attention weights (MASK_VALUE = -1e9, notes §2.3); torch.nn gives nan in its inference
    fast path (eval mode, no autograd) and, with autograd on, a zero attention output. Only that row
    differs: the other rows still agree to 1e-12 either way."""
    ours, _, official = three_models(False, "relu", 11, 8, 2, 1)
    src, tgt, src_pad, tgt_pad = batch(11, 2, 4, 3)
    src_pad[1] = True                                              # row 1: nothing but pads
    logits = ours(src, tgt, src_pad, tgt_pad).data
    assert np.isfinite(logits).all()
    with torch.no_grad():
        fast = official(src, tgt, src_pad, tgt_pad).numpy()        # eval mode: the fast path
    assert np.isnan(fast[1]).all() and np.isfinite(fast[0]).all()
    assert max_diff(logits[0], fast[0]) <= TOL
    slow = official(src, tgt, src_pad, tgt_pad).detach().numpy()  # autograd on: the composite path
    assert np.isfinite(slow).all() and max_diff(logits[0], slow[0]) <= TOL
    # a different convention, not rounding
    assert max_diff(logits[1], slow[1]) > 1e-3


# ---- teacher forcing and masks -------------------------------------------------------------------
@pytest.mark.parametrize("pre_ln", [False, True], ids=["post_ln", "pre_ln"])
def test_teacher_forcing_one_pass_equals_one_pass_per_prefix(pre_ln):
    """logits[:, t] of one forward over the whole target = the last position of a forward over the
    first t + 1 target tokens (notes §7.1): the causal mask makes each position see only its
    prefix."""
    model = encoder_decoder.EncoderDecoder(13, 16, 4, n_layers=2, n_positions=16, p_dropout=0.0,
                                           pre_ln=pre_ln)
    src, tgt, src_pad, _ = batch(13, 2, 5, 6)
    full = model(src, tgt, src_pad).data
    for t in range(tgt.shape[1]):
        prefix = model(src, tgt[:, :t + 1], src_pad).data
        assert max_diff(full[:, :t + 1], prefix) <= TOL


@pytest.mark.parametrize("j", [0, 2, 5])
def test_changing_a_target_token_leaves_every_earlier_prediction_bit_identical(j):
    model = encoder_decoder.EncoderDecoder(13, 16, 4, n_layers=2, n_positions=16, p_dropout=0.0)
    src, tgt, src_pad, tgt_pad = batch(13, 2, 5, 6)
    changed = tgt.copy()
    changed[:, j] = (changed[:, j] + 1) % 13
    a, b = model(src, tgt, src_pad).data, model(src, changed, src_pad).data
    # tgt[j] is input from position j + 1 on
    assert (a[:, :j + 1] == b[:, :j + 1]).all()
    assert j == 5 or (np.abs(a[:, j + 1:] - b[:, j + 1:]).max(axis=-1) > 0).all()


def test_changing_a_padded_source_token_changes_nothing():
    model = encoder_decoder.EncoderDecoder(13, 16, 4, n_layers=2, n_positions=16, p_dropout=0.0,
                                           pre_ln=True)
    src, tgt, src_pad, tgt_pad = batch(13, 3, 5, 4)
    changed = np.where(src_pad, (src + 3) % 13, src)
    assert (changed != src).any()
    a = model(src, tgt, src_pad, tgt_pad).data
    b = model(changed, tgt, src_pad, tgt_pad).data
    assert (a == b).all()                                          # bit-identical
    weights = model.decoder_layers[-1].cross_attention.last_attention.data   # (B, h, T, S)
    assert (weights[np.broadcast_to(src_pad[:, None, None, :], weights.shape)] == 0).all()


# ---- gradient checks (central differences on every element) --------------------------------------
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_gradient_feedforward_activations(activation):
    ff, x = (transformer.FeedForward(4, p_dropout=0.0, activation=activation),
             leaf((2, 3, 4), "permuted"))
    check_gradients(lambda: ff(x), ff.parameters() + [x])


@pytest.mark.parametrize("pre_ln", [False, True], ids=["post_ln", "pre_ln"])
def test_gradient_decoder_layer(pre_ln):
    """EncoderLayer is TransformerLayer with other defaults (checked in test_transformer); the
    decoder layer's three sub-layers and its cross-attention to memory are new wiring."""
    pad = np.array([[False, False, True], [False, False, False]])
    # a narrow FFN keeps the check quick
    dec = randomize_layernorms(encoder_decoder.DecoderLayer(4, 2, p_dropout=0.0, pre_ln=pre_ln,
                                                            middle_dim=6, activation="gelu"))
    y, memory = leaf((2, 2, 4), seed=1), leaf((2, 3, 4), "permuted", seed=2)
    check_gradients(lambda: dec(y, memory, src_pad_mask=pad), dec.parameters() + [y, memory])
    assert (isinstance(encoder_decoder.EncoderLayer(4, 2), transformer.TransformerLayer)
            and not encoder_decoder.EncoderLayer(4, 2).attention.causal)


def test_gradient_encoder_decoder_shared_embedding_and_final_layernorms():
    """What the layer checks above do not cover: the one table used three times (source, target,
    output; its gradient is the sum of the three) behind the ·√d, and the final LayerNorms of
    Pre-LN."""
    model = randomize_layernorms(encoder_decoder.EncoderDecoder(5, 4, 2, n_layers=1, n_positions=4,
                                                                p_dropout=0.0, pre_ln=True,
                                                                activation="gelu"))
    src, tgt = np.array([[1, 4, 2], [0, 3, 3]]), np.array([[2, 2], [4, 1]])
    checked = [p for n, p in model.named_parameters()
               if not n.startswith(("encoder_layers", "decoder_layers"))]
    # table, encoder_ln (2), decoder_ln (2)
    assert len(checked) == 5
    check_gradients(lambda: model(src, tgt, np.array([[False] * 3, [False, False, True]])), checked)


# ---- structure -----------------------------------------------------------------------------------
def test_parameter_count_and_shared_embedding():
    v, d, n = 13, 8, 3
    attention, ff, ln = 4 * (d * d + d), (d * 4 * d + 4 * d) + (4 * d * d + d), 2 * d
    post = encoder_decoder.EncoderDecoder(v, d, 2, n_layers=n)
    assert (post.num_parameters()
            == v * d + n * (attention + ff + 2 * ln) + n * (2 * attention + ff + 3 * ln))
    pre = encoder_decoder.EncoderDecoder(v, d, 2, n_layers=n, pre_ln=True)
    # encoder_ln, decoder_ln
    assert pre.num_parameters() == post.num_parameters() + 2 * ln
    assert sum(p.data.shape == (v, d) for p in post.parameters()) == 1       # one table, three uses
    # N(0, 1/d) (§4.4)
    assert abs(post.token_embeddings.weights.data.std() * np.sqrt(d) - 1) < 0.25


def test_existing_defaults_are_unchanged():
    assert transformer.FeedForward(8).activation == "gelu"
    assert transformer.TransformerLayer(8, 2).ff.activation == "gelu"
    assert transformer.DecoderLM(5, 8, 2, n_positions=4).layers[0].ff.activation == "gelu"


def test_only_primitives_in_encoder_decoder_forward_and_backward():
    model = encoder_decoder.EncoderDecoder(7, 8, 2, n_layers=1, n_positions=8, p_dropout=0.1,
                                           activation="relu")
    with count_ops() as counts:
        logits = model(np.array([[1, 2, 3], [4, 0, 1]]), np.array([[2, 3], [0, 1]]))
        loss = transformer.lm_loss(logits, [[2, 3], [0, 1]])
        loss.backward()
    assert set(counts) <= PRIMITIVES and counts["relu"] == 2      # one ReLU per FFN
    assert all(p.grad is not None for p in model.parameters())


def test_no_handwritten_backward_check_covers_the_new_classes():
    """test_transformer's AST check, run over this file: its classes pass it, and a `.data`
    slipped into one of them would be caught."""
    source = inspect.getsource(encoder_decoder)
    for cls in (encoder_decoder.EncoderLayer, encoder_decoder.DecoderLayer,
                encoder_decoder.EncoderDecoder):
        assert f"class {cls.__name__}(" in source
        assert violations(inspect.getsource(cls)) == []
    assert violations(source) == []
    planted = source.replace("        if self.pre_ln:\n            y = y + self.attention(",
                             "        _ = y.data\n"
                             "        if self.pre_ln:\n            y = y + self.attention(")
    assert planted != source
    assert len(violations(planted)) == 1 and ".data in forward" in violations(planted)[0]


def test_float_source_or_target_ids_are_refused_naming_which_and_astype_int():
    model = encoder_decoder.EncoderDecoder(11, 8, 2, n_layers=1, n_positions=6)
    src, tgt = np.zeros((2, 4), int), np.zeros((2, 3), int)
    floats = {"source": (src + 1.0, tgt), "target": (src, tgt + 1.0)}
    for which, (source, target) in floats.items():
        with pytest.raises(TypeError, match=rf"^EncoderDecoder: {which} token ids must be "
                                            rf"integers, got dtype float64; pass "
                                            rf"ids.astype\(int\)$"):
            model(source, target)


# ---- bad input -----------------------------------------------------------------------------------
def test_errors():
    model = encoder_decoder.EncoderDecoder(11, 8, 2, n_layers=1, n_positions=6)
    src, tgt = np.zeros((2, 4), int), np.zeros((2, 3), int)
    with pytest.raises(ValueError, match=r"^EncoderDecoder: target length 7 exceeds "
                                         r"n_positions=6: the precomputed sinusoidal table has no "
                                         r"row for position 6; shorten the target or build the "
                                         r"model with a larger n_positions$"):
        model(src, np.zeros((2, 7), int))
    with pytest.raises(ValueError, match=r"source length 9 exceeds n_positions=6"):
        model(np.zeros((2, 9), int), tgt)
    with pytest.raises(ValueError, match=r"source and target batch sizes differ \(2 vs 3\); pass "
                                         r"one target row per source row"):
        model(src, np.zeros((3, 3), int))
    with pytest.raises(ValueError, match=r"src_pad_mask must have the shape of the source ids "
                                         r"\(2, 4\) \(True at padded positions\), got \(2, 3\)"):
        model(src, tgt, src_pad_mask=np.zeros((2, 3), bool))
    with pytest.raises(ValueError, match=r"tgt_pad_mask must have the shape of the target ids "
                                         r"\(2, 3\)"):
        model(src, tgt, tgt_pad_mask=np.zeros((3,), bool))
    with pytest.raises(ValueError, match=r"expected target token ids of shape \(B, S\) with S >= "
                                         r"1, got \(2, 0\)"):
        model(src, np.zeros((2, 0), int))
    with pytest.raises(ValueError, match="activation must be 'gelu' or 'relu', got 'swish'"):
        encoder_decoder.EncoderDecoder(11, 8, 2, activation="swish")
    with pytest.raises(ValueError, match=r"bos_id=11 is not a token id \(0..10\)"):
        encoder_decoder.EncoderDecoder(11, 8, 2, bos_id=11)
