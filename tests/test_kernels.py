"""kernels.py: the fused primitives and the flash-attention core, the fused() switch, and
tensor.py's traffic counters that measure what they save.

Each fused primitive is checked against the composed path and against torch (values and every
gradient, float64, <= 1e-12), against central differences, with contiguous and permuted inputs,
masks, fully masked rows and block sizes that do not divide S; the counters against totals worked
out by hand."""
import contextlib
import math
from collections import Counter

import numpy as np
import pytest
import torch

from lecture06 import decoding, kernels
from lecture05 import tensor
from lecture06 import transformer
from lecture06.encoder_decoder import EncoderDecoder
from gradcheck import PRIMITIVES, check_gradients, leaf
from lecture05.tensor import Tensor, count_ops, count_traffic

TOL = 1e-12


def _grads(leaves):
    return [t.grad.copy() for t in leaves]


def _reset(leaves):
    for t in leaves:
        t.grad = None


def _torch(t: Tensor) -> torch.Tensor:
    return torch.tensor(t.data, requires_grad=True)


def _close(a, b):
    np.testing.assert_allclose(a, b, rtol=0, atol=TOL)


def _pad_mask(batch: int, n_keys: int, padded) -> np.ndarray:
    """(B, 1, 1, S_k) additive mask: MASK_VALUE at the
    first padded[b] keys of row b (left padding)."""
    mask = np.zeros((batch, 1, 1, n_keys))
    for b, n in enumerate(padded):
        mask[b, ..., :n] = tensor.MASK_VALUE
    return mask


def _causal(n: int) -> np.ndarray:
    return transformer.MultiHeadAttention.create_causal_mask(n).data      # (1, 1, S, S)


# ---- layer_norm ----------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["contiguous", "permuted"])
def test_layer_norm_matches_composed_and_torch(layout):
    x = leaf((2, 5, 6), layout, seed=1)
    norm = transformer.LayerNorm(6)
    norm.weights.data[:] = np.random.default_rng(2).standard_normal(6)
    norm.bias.data[:] = np.random.default_rng(3).standard_normal(6)
    leaves = [x, norm.weights, norm.bias]
    dy = np.random.default_rng(4).standard_normal((2, 5, 6))
    composed = norm(x)
    composed.backward(dy)
    expected = _grads(leaves)
    _reset(leaves)
    fused = kernels.layer_norm(x, norm.weights, norm.bias, norm.eps)
    fused.backward(dy)
    _close(fused.data, composed.data)
    for got, want in zip(_grads(leaves), expected):
        _close(got, want)
    xt, wt, bt = (_torch(t) for t in leaves)
    yt = torch.nn.functional.layer_norm(xt, (6,), wt, bt, norm.eps)
    yt.backward(torch.tensor(dy))
    _close(fused.data, yt.detach().numpy())
    for got, want in zip(_grads(leaves), (xt.grad, wt.grad, bt.grad)):
        _close(got, want.numpy())


def test_layer_norm_gradients_by_central_differences():
    x, weight, bias = leaf((3, 4), "permuted", seed=5), leaf((4,), seed=6), leaf((4,), seed=7)
    check_gradients(lambda: kernels.layer_norm(x, weight, bias), [x, weight, bias])


# ---- softmax with scale and mask -----------------------------------------------------------------
@pytest.mark.parametrize("layout", ["contiguous", "permuted"])
def test_softmax_with_scale_and_mask_matches_composed_and_torch(layout):
    """Causal plus left padding: rows 0-2 of batch entry 1 see only padded keys (fully masked)."""
    x = leaf((2, 3, 5, 5), layout, seed=8)
    mask = _causal(5) + _pad_mask(2, 5, [0, 3])
    scale = 1 / math.sqrt(7)
    dy = np.random.default_rng(9).standard_normal(x.shape)
    composed = transformer.softmax(x * scale + Tensor(mask))
    composed.backward(dy)
    expected = x.grad.copy()
    x.grad = None
    fused = kernels.softmax(x, scale, mask)
    fused.backward(dy)
    # the same arithmetic, so the same bits
    np.testing.assert_array_equal(fused.data, composed.data)
    _close(x.grad, expected)
    np.testing.assert_allclose(fused.data.sum(axis=-1), 1.0, rtol=0, atol=1e-15)
    assert np.all(np.isfinite(fused.data[1, :, :3]))  # fully masked rows: finite, no nan
    xt = _torch(x)
    yt = torch.softmax(xt * scale + torch.tensor(mask), dim=-1)
    yt.backward(torch.tensor(dy))
    _close(fused.data, yt.detach().numpy())
    _close(x.grad, xt.grad.numpy())


def test_softmax_gradients_by_central_differences():
    x = leaf((2, 4, 3), "permuted", seed=10)
    mask = np.array([0.0, 0.0, tensor.MASK_VALUE])
    check_gradients(lambda: kernels.softmax(x, 0.5, mask), [x])


# ---- gelu ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["contiguous", "permuted"])
def test_gelu_matches_composed_and_torch(layout):
    x = leaf((4, 7), layout, seed=11)
    x.data[0, :3] = [-30.0, 12.0, 0.0]                   # far tails and 0
    dy = np.random.default_rng(12).standard_normal(x.shape)
    composed = transformer.gelu(x)
    composed.backward(dy)
    expected = x.grad.copy()
    x.grad = None
    fused = kernels.gelu(x)
    fused.backward(dy)
    _close(fused.data, composed.data)
    _close(x.grad, expected)
    xt = _torch(x)
    torch.nn.functional.gelu(xt, approximate="tanh").backward(torch.tensor(dy))
    _close(x.grad, xt.grad.numpy())


def test_gelu_gradients_by_central_differences():
    x = leaf((3, 5), seed=13)
    check_gradients(lambda: kernels.gelu(x), [x])


# ---- flash attention -----------------------------------------------------------------------------
def _qkv(B=2, h=3, S=7, Dh=4, seed=14):
    """q, kT, v as MultiHeadAttention makes them: permuted
    (non-contiguous) views of (B, S, h, Dh) arrays."""
    rng = np.random.default_rng(seed)
    q = Tensor(rng.standard_normal((B, S, h, Dh)), requires_grad=True)
    k = Tensor(rng.standard_normal((B, S, h, Dh)), requires_grad=True)
    v = Tensor(rng.standard_normal((B, S, h, Dh)), requires_grad=True)
    return [q, k, v], lambda: (q.permute(0, 2, 1, 3), k.permute(0, 2, 3, 1), v.permute(0, 2, 1, 3))


@pytest.mark.parametrize("block_size", [1, 3, 5, 7, 64])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_matches_composed_and_torch(block_size, causal):
    """Left padding of 4 keys in batch entry 1: under
    the causal mask its queries 0-3 see only pads."""
    leaves, views = _qkv()
    q, kT, v = views()
    pad = _pad_mask(2, 7, [0, 4])
    mask = _causal(7) + pad if causal else pad
    dout = np.random.default_rng(15).standard_normal((2, 3, 7, 4))
    composed = transformer.softmax((q @ kT) * (1.0 / math.sqrt(4)) + Tensor(mask)) @ v
    composed.backward(dout)
    expected = _grads(leaves)
    _reset(leaves)
    flash = kernels.flash_attention(*views(), pad, causal=causal, block_size=block_size)
    flash.backward(dout)
    _close(flash.data, composed.data)
    for got, want in zip(_grads(leaves), expected):
        _close(got, want)
    qt, kt, vt = (_torch(t) for t in leaves)
    out = torch.softmax(qt.permute(0, 2, 1, 3) @ kt.permute(0, 2, 3, 1) / 2.0 + torch.tensor(mask),
                        dim=-1) \
        @ vt.permute(0, 2, 1, 3)
    out.backward(torch.tensor(dout))
    _close(flash.data, out.detach().numpy())
    for got, want in zip(_grads(leaves), (qt.grad, kt.grad, vt.grad)):
        _close(got, want.numpy())


def test_flash_attention_against_torch_sdpa_with_a_general_mask():
    """A mask of any broadcastable shape, S_q != S_k, Dv != Dh, contiguous inputs."""
    rng = np.random.default_rng(16)
    q, kT, v = (Tensor(rng.standard_normal(s), requires_grad=True)
                for s in [(2, 5, 3), (2, 3, 6), (2, 6, 4)])
    mask = rng.standard_normal((5, 6))
    flash = kernels.flash_attention(q, kT, v, mask, block_size=4)
    dout = rng.standard_normal(flash.shape)
    flash.backward(dout)
    qt, kt, vt = (_torch(t) for t in (q, kT, v))
    out = torch.nn.functional.scaled_dot_product_attention(qt, kt.transpose(-2, -1), vt,
                                                           attn_mask=torch.tensor(mask))
    out.backward(torch.tensor(dout))
    _close(flash.data, out.detach().numpy())
    for got, want in zip((q.grad, kT.grad, v.grad), (qt.grad, kt.grad, vt.grad)):
        _close(got, want.numpy())


def test_flash_attention_gradients_by_central_differences():
    """Right padding (key 4): no fully masked row, whose
    s - 1e9 would round central differences away."""
    leaves, _ = _qkv(B=1, h=2, S=5, Dh=3, seed=17)
    pad = np.where(np.arange(5) == 4, tensor.MASK_VALUE, 0.0)

    def f():
        q, k, v = leaves
        return kernels.flash_attention(q.permute(0, 2, 1, 3), k.permute(0, 2, 3, 1),
                                      v.permute(0, 2, 1, 3), pad, causal=True, block_size=2)
    check_gradients(f, leaves)


def test_flash_attention_saves_no_scores_and_writes_heads_merged():
    _, views = _qkv()
    out = kernels.flash_attention(*views(), causal=True, block_size=3)
    # (B, S, h, Dh) in memory
    assert out.shape == (2, 3, 7, 4) and out.permute(0, 2, 1, 3).is_contiguous()
    assert all(a.shape[-2:] != (7, 7) for a in out._saved)
    # one convention, defined once (tensor.py) and imported by every file that masks
    assert kernels.MASK_VALUE is transformer.MASK_VALUE is decoding.MASK_VALUE is tensor.MASK_VALUE


def test_bad_input_gets_clear_errors():
    _, views = _qkv()
    q, kT, v = views()
    with pytest.raises(ValueError, match="block_size must be an integer >= 1, got 0"):
        kernels.flash_attention(q, kT, v, block_size=0)
    with pytest.raises(ValueError, match=r"expected q \(..., S_q, Dh\), kT \(..., Dh, S_k\)"):
        kernels.flash_attention(q, v, v)
    with pytest.raises(ValueError, match="causal=True needs as many keys as queries"):
        kernels.flash_attention(q, Tensor(kT.data[..., :5]), Tensor(v.data[..., :5, :]),
                                causal=True)
    with pytest.raises(ValueError, match="the mask requires a gradient"):
        kernels.softmax(q, 1.0, Tensor(np.zeros(4), requires_grad=True))
    with pytest.raises(ValueError, match=r"a mask of shape \(3,\) does not broadcast"):
        kernels.softmax(q, 1.0, np.zeros(3))
    with pytest.raises(ValueError,
                       match=r"weight \(3,\) and bias \(4,\) must both have shape \(4,\)"):
        kernels.layer_norm(q, Tensor(np.ones(3)), Tensor(np.zeros(4)))
    with pytest.raises(ValueError, match="fused: block_size must be an integer >= 1"):
        with kernels.fused(block_size=-2):
            pass


# ---- the switch ----------------------------------------------------------------------------------
def _lm_run(switch, pad_mask=None, n_layers=2, block_size=4):
    transformer.set_seed(0)
    model = transformer.DecoderLM(17, 12, 3, n_positions=9, n_layers=n_layers, p_dropout=0.0)
    ids = np.random.default_rng(18).integers(0, 17, (2, 9))
    with switch:
        with count_ops() as counts:
            logits = model(ids, pad_mask=pad_mask)
            loss = transformer.lm_loss(logits, ids)
            loss.backward()
    return logits.data, [p.grad for p in model.parameters()], counts


@pytest.mark.parametrize("padded", [False, True])
def test_decoder_lm_under_fused_and_flash_equals_composed(padded):
    """Left padding of 5 in row 1: its first 5 queries see only pads (fully masked rows)."""
    pad_mask = np.arange(9)[None, :] < np.array([[0], [5]]) if padded else None
    logits, grads, counts = _lm_run(contextlib.nullcontext(), pad_mask)
    assert set(counts) <= PRIMITIVES                                    # the default path composes
    for switch, fused_kinds in ((kernels.fused(), {"layer_norm", "softmax", "gelu"}),
                                (kernels.fused(flash=True, block_size=4),
                                 {"layer_norm", "gelu", "flash_attention"})):
        got_logits, got_grads, got_counts = _lm_run(switch, pad_mask)
        # no composed GELU left
        assert fused_kinds <= set(got_counts) and "sigmoid" not in got_counts
        _close(got_logits, logits)
        for got, want in zip(got_grads, grads):
            _close(got, want)


def test_the_switch_is_scoped_and_flash_refuses_attention_dropout():
    layer = transformer.TransformerLayer(8, 2, p_dropout=0.1)
    x = Tensor(np.random.default_rng(19).standard_normal((1, 4, 8)))
    with kernels.fused(flash=True):
        with pytest.raises(ValueError, match="cannot apply dropout 0.1 to them; call .eval()"):
            layer(x)
        layer.eval()
        with count_ops() as counts:
            layer(x)
        assert counts["flash_attention"] == 1 and layer.attention.last_attention is None
    with count_ops() as counts:
        layer(x)
    assert set(counts) <= PRIMITIVES and layer.attention.last_attention is not None


# ---- the counters --------------------------------------------------------------------------------
def test_traffic_of_single_launches_worked_out_by_hand():
    """float64, 8 bytes an element. Forward: inputs + output (+ per-row statistics); backward: the
    output's gradient + the saved arrays + one gradient per input that needs one.
    - matmul (2, 3) @ (3, 2), both need grads: fwd 8·(6 + 6 + 4) = 128 B, 2·4·3 = 24 FLOP;
      bwd g 32 + saved a, b 96 + written da, db 96 = 224 B, 48 FLOP.
    - view and permute of the (2, 2) result: 2 + 2 launches, 0 B.
    - softmax of (2, 3): fwd 48 + 48 = 96 B; bwd g 48 + y 48 + dx 48 = 144 B.
    - layer_norm of (2, 3) with weight, bias (3,): fwd 48 + 24 + 24 + y 48 + μ 16 + r 16 = 176 B;
      bwd g 48 + x 48 + weight 24 + μ 16 + r 16 + dx 48 + dweight 24 + dbias 24 = 248 B.
    - flash_attention, q (1, 4, 2), kT (1, 2, 4), v (1, 4, 2), 64 B each: fwd 192 + out 64 + m 32 +
      log l 32 = 320 B, 2·16·(2 + 2) = 128 FLOP; bwd g 64 + saved (q, kT, v, out 4·64, m, log l
      2·32) 320 + written 192 = 576 B, 2·16·(3·2 + 2·2) = 320 FLOP (q kᵀ recomputed: 64 of them).
    - the sum closing each graph: fwd in + 8; bwd g 8 + written in."""
    a, b = leaf((2, 3), seed=20), leaf((3, 2), seed=21)
    x, weight, bias = leaf((2, 3), seed=22), leaf((3,), seed=23), leaf((3,), seed=24)
    q, kT, v = leaf((1, 4, 2), seed=25), leaf((1, 2, 4), seed=26), leaf((1, 4, 2), seed=27)
    with count_traffic() as traffic, count_ops() as ops:
        (a @ b).view(4).view(2, 2).permute(1, 0).permute(1, 0).sum().backward()
        kernels.softmax(x).sum().backward()
        kernels.layer_norm(x, weight, bias).sum().backward()
        kernels.flash_attention(q, kT, v, block_size=3).sum().backward()
    forward = lambda kind: (traffic.launches["forward", kind],  # noqa: E731
                            traffic.bytes["forward", kind])
    backward = lambda kind: (traffic.launches["backward", kind],  # noqa: E731
                             traffic.bytes["backward", kind])
    assert forward("matmul") == (1, 128) and backward("matmul") == (1, 224)
    assert (forward("view") == (2, 0) == backward("view")
            and forward("permute") == (2, 0) == backward("permute"))
    assert forward("softmax") == (1, 96) and backward("softmax") == (1, 144)
    assert forward("layer_norm") == (1, 176) and backward("layer_norm") == (1, 248)
    assert forward("flash_attention") == (1, 320) and backward("flash_attention") == (1, 576)
    assert forward("sum") == (4, 8 * (4 + 6 + 6 + 8) + 4 * 8)
    assert backward("sum") == (4, 4 * 8 + 8 * (4 + 6 + 6 + 8))
    assert traffic.flops == Counter({("forward", "matmul"): 24, ("backward", "matmul"): 48,
                                     ("forward", "flash_attention"): 128,
                                     ("backward", "flash_attention"): 320})
    # count_ops: forward calls only
    assert traffic.total("launches", "forward") == 12 == sum(ops.values())
    assert traffic.total("launches", "backward") == 12


def test_saved_bytes_counts_each_buffer_once_and_leaves_parameters_out():
    """x (2, 3): exp saves its output e (48 B); e·e saves e twice (the same buffer); log saves its
    input e·e (48 B); mul by the parameter w saves w (left out) and its input (the log, 48 B); a 0-d
    constant is left out. Total 3 · 48 = 144 B."""
    x, w = leaf((2, 3), seed=28), transformer.Parameter(np.ones(3))
    e = x.exp()
    out = ((e * e).log() * w * 2.0).sum()
    assert tensor.saved_bytes(out, exclude=[w]) == 144


@pytest.mark.parametrize("path,calls",
                         [("composed", (68, 67)), ("fused", (29, 29)), ("fused + flash", (27, 27))])
def test_layer_launches_and_saved_elements(path, calls):
    """A Pre-LN layer, B = 1: the notes' 68 forward calls composed (the closing sum not counted);
    saved elements exactly as 06 part 6 prints them (fused: 16·S·d + h·S² + 4·S, flash: 16·S·d +
    2·h·S + 4·S)."""
    S, d, h = 6, 12, 3
    transformer.set_seed(0)
    layer = transformer.TransformerLayer(d, h, p_dropout=0.0)
    x = Tensor(np.random.default_rng(29).standard_normal((1, S, d)), requires_grad=True)
    switch = {"composed": contextlib.nullcontext(), "fused": kernels.fused(),
              "fused + flash": kernels.fused(flash=True, block_size=4)}[path]
    with switch, count_traffic() as traffic:
        out = layer(x)
        saved = tensor.saved_bytes(out, exclude=layer.parameters()) // 8
        out.sum().backward()
    assert (traffic.total("launches", "forward") - 1,
            traffic.total("launches", "backward") - 1) == calls
    if path == "fused":
        assert saved == 16 * S * d + h * S * S + 4 * S
    if path == "fused + flash":
        assert saved == 16 * S * d + 2 * h * S + 4 * S


def test_cached_generation_under_flash_equals_composed():
    """The KV cache passes its own (1, 1, n, capacity) mask: the flash core takes it as mask=."""
    transformer.set_seed(1)
    model = transformer.DecoderLM(13, 8, 2, n_positions=12, n_layers=2, p_dropout=0.0).eval()
    prompt = np.array([[1, 2, 3], [4, 5, 6]])
    composed = model.generate(prompt, 5)
    with kernels.fused(flash=True, block_size=3):
        flash = model.generate(prompt, 5)
    np.testing.assert_array_equal(flash.tokens, composed.tokens)
    _close(flash.logits, composed.logits)


def test_encoder_decoder_with_cross_attention_and_padding_under_flash_equals_composed():
    """Padded source and target; cross-attention (S_q !=
    S_k, no causal mask) goes through the core too."""
    transformer.set_seed(2)
    model = EncoderDecoder(n_vocab=11, n_embd=8, n_head=2, n_layers=1, n_positions=10,
                           p_dropout=0.0)
    rng = np.random.default_rng(30)
    src, tgt = rng.integers(3, 11, (2, 6)), rng.integers(3, 11, (2, 4))
    src_pad = np.zeros((2, 6), bool)
    src_pad[1, 3:] = True
    tgt_pad = np.zeros((2, 4), bool)
    tgt_pad[1, 2:] = True
    results = []
    for switch in (contextlib.nullcontext(), kernels.fused(flash=True, block_size=4)):
        model.zero_grad()
        with switch:
            logits = model(src, tgt, src_pad, tgt_pad)
            logits.sum().backward()
        results.append((logits.data, [p.grad for p in model.parameters()]))
    (composed, composed_grads), (flash, flash_grads) = results
    _close(flash, composed)
    for got, want in zip(flash_grads, composed_grads):
        _close(got, want)
