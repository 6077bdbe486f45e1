"""Script 09 on a machine without a GPU: every model column (03 part 7's launches by kind, the bytes
and FLOPs of the roofline, what each path keeps for backward, the FLOP shares, the norms' traffic,
the KV cache), the no-GPU run, and every measurement function on CPU tensors (torch.profiler's
operators, saved_tensors_hooks, the CPU clock, the ncu child and its CSV). The parts' GPU branches
run here too, on a CPU standing in for the device at small sizes: their unmarked lines must be the
no-GPU run's. What only a CUDA device can run is marked and skipped here; the GPU session runs it
first (DEVELOPING.md)."""
import argparse
import os
import re
import subprocess
import sys
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lecture05 import tensor
from lecture06 import costs, torch_ref, transformer
from conftest import load_script
from outputs import normalise, section

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
SMALL = dict(d=16, h=2, S=8)   # the stand-in for GPT-2 small's layer


@pytest.fixture(scope="module")
def m():
    return load_script("09_on_a_gpu")


@pytest.fixture
def fresh(m):
    """No device limits measured yet, nothing measured, GPT-2's counts recomputed: each test's
    parts run as a process's first."""
    m._limits.clear()
    m._measured.clear()
    m.model_rows.cache_clear()
    yield m
    m._limits.clear()
    m._measured.clear()
    m.model_rows.cache_clear()


@pytest.fixture
def stand_in(fresh, monkeypatch):
    """The CPU as the device, every part at small sizes: the GPU branches run as they would."""
    for key, value in SMALL.items():
        monkeypatch.setitem(costs.GPT2_LAYER, key, value)
    monkeypatch.setitem(fresh.TIME_SHARE_LAYER, "d", 32)
    monkeypatch.setattr(fresh, "SEQ_LENS", (8, 16))
    monkeypatch.setattr(fresh, "NORM_SIZE", dict(d=64, rows=32))
    monkeypatch.setattr(fresh, "DECODE", dict(n_head=8, head_dim=16, length=64))
    monkeypatch.setattr(fresh, "KV_HEADS", (8, 2, 1))
    monkeypatch.setattr(fresh, "FLUSH_BYTES", 1 << 16)
    monkeypatch.setattr(fresh, "ncu_path", lambda: None)
    return fresh


def args(quick=True, figures=None):
    return argparse.Namespace(quick=quick, seed=0, figures=figures)


def cpu_limits(m):
    return m.Limits(device="cpu", name="a CPU standing in", bandwidth=1e10, peak=1e11,
                    launch=1e-6)


# ---- the models ----------------------------------------------------------------------------------
def test_the_model_launches_are_03_part_7s_sorted_by_kind(fresh):
    model = fresh.model_launches()
    for row in fresh.model_rows():
        for direction in ("forward", "backward"):
            assert model[row["path"]][direction].total() == row[f"{direction}_moving"]
    assert model["composed"]["forward"] == Counter(matmul=8, reduction=6, copy=1, elementwise=45)
    assert model["composed"]["backward"] == Counter(matmul=8, reduction=5, elementwise=45)
    fused = Counter({"matmul": 8, "softmax": 1, "layer norm": 2, "gelu": 1, "elementwise": 8})
    assert model["fused"]["forward"] == fused + Counter(copy=1)
    assert model["fused"]["backward"] == fused
    flash = Counter({"matmul": 6, "attention core": 1, "layer norm": 2, "gelu": 1,
                     "elementwise": 8})
    assert model["fused + flash"]["forward"] == model["fused + flash"]["backward"] == flash


def test_the_roofline_model_is_03_part_7s_bytes_at_float32_and_its_flops(fresh, capsys):
    fresh.show_roofline(args())
    out = capsys.readouterr().out
    d, h, S = costs.GPT2_LAYER["d"], costs.GPT2_LAYER["h"], costs.GPT2_LAYER["S"]
    rows = {r["path"]: r for r in costs.fusion_counts_from_shapes(d, h, S)}
    for path, r in rows.items():
        moved = (r["forward_bytes"] + r["backward_bytes"]) // 2
        matmuls = 3 * (24 * S * d * d + 4 * S * S * d) + (2 * S * S * d if "flash" in path else 0)
        assert r["forward_flops"] + r["backward_flops"] == matmuls
        line = next(line for line in out.splitlines() if line.startswith(f"{path}  "))
        assert line.split()[-4:] == [str(r["forward_moving"] + r["backward_moving"]),
                                     f"{moved / 2 ** 20:,.0f}", f"{matmuls / 1e9:.2f}",
                                     f"{matmuls / moved:.1f}"]


def test_what_a_path_keeps_grows_with_the_batch_and_torch_keeps_what_the_model_says(m):
    d, h, S = SMALL["d"], SMALL["h"], SMALL["S"]
    one, two = costs.fusion_counts(d, h, S, B=1), costs.fusion_counts(d, h, S, B=2)
    assert [r["saved"] * 2 for r in one] == [r["saved"] for r in two]   # every array has B
    flash = costs.flash_saved_floats(S, d, h)["torch SDPA"]
    for B, rows in ((1, one), (2, two)):
        layer, x, mask, _ = m.path_setup(d, h, S, B, "cpu")
        expected = {"composed": rows[0]["saved"] // 8,                 # tensor.py's, to the tensor
                    "fused": B * costs.exact_saved_floats(S, d, h), "fused + flash": B * flash}
        assert rows[1]["saved"] // 8 == expected["fused"]
        for path, elements in expected.items():
            kept = m.kept_for_backward(lambda: m.layer_forward(layer, x, path, mask),
                                       layer.parameters(), "cpu", inputs=(x,))
            assert (kept["elements"], kept["bytes"], kept["allocator"]) == (
                elements, 4 * elements, None), (path, B)


def test_the_memory_model_scales_03_part_7_by_the_batch(fresh):
    d, h, S = costs.GPT2_LAYER["d"], costs.GPT2_LAYER["h"], costs.GPT2_LAYER["S"]
    one, eight = fresh.model_kept(1), fresh.model_kept(8)
    assert [r["tensor_py"] for r in one] == [45_629_440, 16 * S * d + h * S * S + 4 * S,
                                             16 * S * d + 2 * h * S + 4 * S]
    assert [r["torch"] for r in one] == [45_629_440, 16 * S * d + h * S * S + 4 * S,
                                         16 * S * d + h * S + 4 * S]
    assert [(8 * a["tensor_py"], 8 * a["torch"]) for a in one] == [
        (b["tensor_py"], b["torch"]) for b in eight]


def test_the_time_share_model_is_s_over_6d_plus_s(m):
    d = m.TIME_SHARE_LAYER["d"]
    for S in m.SEQ_LENS:
        assert Fraction(m.flop_share(S)).limit_denominator(10 ** 6) == Fraction(S, 6 * d + S)


def test_the_norms_traffic_is_their_formulas_and_extrapolates_exactly(m):
    d, n = 24, 7
    model = m.norm_model(d, n)
    layer_norm = dict(forward_launches=1, backward_launches=1,
                      forward_bytes=8 * (2 * n * d + 2 * d + 2 * n),   # x, w, b in; y, μ, 1/σ out
                      # dy, x, w, μ, 1/σ in; dx, dw, db out
                      backward_bytes=8 * (3 * n * d + 3 * d + 2 * n))
    assert model["LayerNorm, fused"] == layer_norm
    assert model["RMSNorm, fused"] == dict(layer_norm,
                                           forward_bytes=8 * (2 * n * d + d + n),
                                           backward_bytes=8 * (3 * n * d + 2 * d + n))
    from lecture06 import llama
    direct = m.norm_traffic(llama.RMSNorm(d), n, d, fused=False)
    assert model["RMSNorm, composed"] == direct
    assert direct["forward_launches"] == direct["backward_launches"] == 9


def test_the_cache_model_is_llamas_formula(fresh, capsys):
    fresh.show_decoding(args(), None)
    rows = [line.split() for line in capsys.readouterr().out.splitlines()
            if re.match(r"\d+ ", line)]
    assert rows == [["64", "1,024", "1×"], ["8", "128", "8×"], ["1", "16", "64×"]]


def test_korthikantis_groups_add_up_to_the_formula(m):
    s, b, h, a = 128, 1, 64, 4
    groups = m.kept_by_group({t["term"]: [t["elements"], t["their_bytes"]]
                              for t in costs.korthikanti_terms(s, b, h, a)})
    activations, masks = 16 * s * b * h + 2 * a * s * s * b, 2 * s * b * h + a * s * s * b
    assert groups == {"activations": [activations, 2 * activations],   # 2 bytes each, 1 a mask
                      "dropout masks": [masks, masks], costs.LAYER_NORM_STATISTICS: [0, 0]}
    assert sum(nbytes for _, nbytes in groups.values()) == costs.korthikanti_bytes(s, b, h, a)


# ---- the torch paths and what measures them, on CPU tensors --------------------------------------
def test_the_three_torch_paths_compute_torch_refs_layer_and_its_gradients(m):
    layer, x, mask, gradient = m.path_setup(16, 2, 8, 2, "cpu")
    expected = layer(x)
    expected.backward(gradient)
    expected_grad = x.grad.clone()
    for path in costs.FUSION_PATHS:
        x.grad = None
        out = m.layer_forward(layer, x, path, mask)
        out.backward(gradient)
        assert torch.allclose(out, expected, atol=1e-5), path
        assert torch.allclose(x.grad, expected_grad, atol=1e-5), path
    with pytest.raises(ValueError, match="unknown path 'flash'; choose one of composed, fused, "
                                         r"fused \+ flash"):
        m.layer_forward(layer, x, "flash", mask)


def test_on_the_cpu_the_profiler_counts_the_operators_the_notes_explanation_names(m):
    """torch's side of part 1's explanation, on CPU operators: forward, the same exp, log and
    sigmoid as tensor.py and one mean per mean; backward, two matmuls per matmul, a sum per
    Linear's bias and adds where gradients meet; the fused path's scale and mask, two more."""
    d, h, S = SMALL["d"], SMALL["h"], SMALL["S"]
    transformer.set_seed(0)
    ours = transformer.TransformerLayer(d, h, p_dropout=0.0)
    with tensor.count_ops() as primitives:
        ours(tensor.Tensor(np.ones((1, S, d)), requires_grad=True))
    counted = {}
    for path in costs.FUSION_PATHS:
        layer, x, mask, gradient = m.path_setup(d, h, S, 1, "cpu")
        counted[path] = m.path_kernels(layer, x, path, mask, gradient, "cpu")
    composed = counted["composed"]["forward"]
    assert [composed[f"aten::{op}"] for op in ("exp", "log", "sigmoid")] == [
        primitives[op] for op in ("exp", "log", "sigmoid")] == [4, 3, 1]
    assert composed["aten::mean"] == 4 and composed["aten::matmul"] == 8
    for path, matmuls in (("composed", 8), ("fused", 8), ("fused + flash", 6)):
        backward = m.by_kind(counted[path]["backward"], m.kernel_kind)
        assert backward["matmul"] == 2 * matmuls, path
    fused = counted["fused"]
    assert fused["backward"]["aten::sum"] == 6                 # q, k, v, out, FFN in and out
    assert fused["backward"]["aten::add"] + fused["backward"]["aten::add_"] >= 2
    assert (fused["forward"]["aten::mul"], fused["forward"]["aten::add"]) == (1, 6 + 1 + 2)


@pytest.mark.parametrize("name, kind", [
    ("sm90_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_warpgroupsize1x1x1", "matmul"),
    ("nvjet_tst_128x64_64x8_2x1_v_bz_coopA_NNT", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(T1::Params)", "matmul"),
    ("void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false>", "matmul"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel)",
     "attention core"),
    ("void (anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, Epilogue>",
     "softmax"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>",
     "layer norm"),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>",
     "layer norm"),
    ("void cuComputeGradInput<float, float, float, true>(T1 const*, T1 const*, int, int)",
     "layer norm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>",
     "gelu"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, MeanOps<float>>>",
     "reduction"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "fill"),
    ("Memset (Device)", "fill"),
    ("void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda>", "copy"),
    ("Memcpy DtoD (Device -> Device)", "copy"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
     "elementwise"),
    ("aten::bmm", "matmul"), ("aten::native_layer_norm_backward", "layer norm"),
    ("aten::sum", "reduction"), ("aten::mul", "elementwise")])
def test_a_kernel_is_sorted_by_its_name(m, name, kind):
    assert m.kernel_kind(name) == kind


def test_timed_runs_the_warm_up_then_each_counted_call_after_its_flush(m):
    calls = []
    seconds = m.timed(lambda: calls.append("call"), "cpu", repeats=3, warmup=2,
                      before=lambda: calls.append("flush"))
    assert calls == ["call", "call"] + ["flush", "call"] * 3
    assert len(seconds) == 3 and all(0 <= s < 1 for s in seconds)


def test_the_device_rates_are_bytes_flops_and_ops_over_the_median_time(m, monkeypatch):
    monkeypatch.setattr(m, "timed", lambda fn, device, repeats: [2.0, 0.5, 4.0][:repeats])
    assert m.copy_bandwidth("cpu", 4096, 3) == 2 * 4096 / 2.0
    assert m.matmul_peak("cpu", 8, 3) == 2 * 8 ** 3 / 2.0
    assert m.launch_seconds("cpu", 10, 3) == 2.0 / 10


def test_the_device_rates_run_on_the_cpu(m):
    assert m.copy_bandwidth("cpu", 1 << 16, 3) > 0
    assert m.matmul_peak("cpu", 32, 3) > 0
    assert 0 < m.launch_seconds("cpu", 20, 3) < 1e-2


def test_the_core_is_timed_inside_the_layer_and_the_method_given_back(m):
    layer = torch_ref.TransformerLayer(32, 4, p_dropout=0.1).float().train()
    r = m.core_time_share(layer, torch.randn(2, 16, 32), "cpu", repeats=3)
    assert 0 < r["core"] < r["layer"] and 0 < r["share"] < 1
    assert "self_attention" not in vars(layer.attention)


def test_a_norm_measured_on_the_cpu(m):
    r = m.norm_measured("LayerNorm, fused", 16, 32, torch.float32, "cpu", repeats=3)
    assert (r["forward_kernels"], r["backward_kernels"]) == (1, 1)   # layer_norm, its backward
    assert 0 < r["forward"] and 0 < r["training"]
    x, w = torch.randn(4, 8), torch.rand(8) + 0.5
    assert torch.allclose(m.norm_forward("RMSNorm, composed", x, w, None),
                          m.norm_forward("RMSNorm, fused", x, w, None), atol=1e-6)
    with pytest.raises(ValueError, match="unknown norm 'rms'; choose one of LayerNorm, fused, "):
        m.norm_forward("rms", x, w, None)


@pytest.mark.parametrize("n_kv", [8, 2, 1])
def test_a_decoding_step_reads_each_kv_head_for_its_group_as_sdpa_with_gqa(m, n_kv):
    generator = torch.Generator().manual_seed(n_kv)
    q = torch.randn(2, 8, 1, 16, generator=generator)
    k, v = (torch.randn(2, n_kv, 32, 16, generator=generator) for _ in range(2))
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert torch.allclose(m.decode_attention(q, k, v), expected, atol=1e-6)
    assert m.decode_seconds(n_kv, 32, 8, 16, "cpu", 3, 1 << 12) > 0


def test_torchs_dropout_on_a_gpu_keeps_1_byte_masks_which_korthikanti_count(monkeypatch):
    """On CPU F.dropout multiplies by a mask of its input's dtype; a GPU runs native_dropout,
    which keeps a bool mask. Run here through native_dropout, the measurement names every storage
    and finds the formula's bytes but for the LayerNorms' statistics."""
    monkeypatch.setattr(F, "dropout",
                        lambda x, p, training: torch.native_dropout(x, p, training)[0])
    s, h, a = 32, 16, 2
    r = costs.saved_by_term(s, h, a, 0.1, torch.bfloat16, "cpu")
    assert r["unnamed"] == []
    terms = {t["term"]: t for t in costs.korthikanti_terms(s, 1, h, a)}
    for term, (elements, nbytes) in r["by_term"].items():
        if term != costs.LAYER_NORM_STATISTICS:
            assert (elements, nbytes) == (terms[term]["elements"], terms[term]["their_bytes"])
    assert r["by_term"][costs.LAYER_NORM_STATISTICS] == [4 * s, 2 * 4 * s]


# ---- Nsight Compute: its CSV, its child, and a stand-in for it -----------------------------------
NCU_HEADER = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
              "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
NCU_ROWS = [["0", "kernel_a", "dram__bytes_read.sum", "byte", "1,048,576"],
            ["0", "kernel_a", "dram__bytes_write.sum", "Kbyte", "2.5"],
            ["1", "kernel_b", "dram__bytes_read.sum", "byte", "512"],
            ["1", "kernel_b", "dram__bytes_write.sum", "byte", "0"]]
# ncu --csv's details page: its own lines, then a quoted row per kernel and metric
NCU_CSV = "\n".join(
    ["==PROF== Connected to process 4242 (python)", ",".join(f'"{h}"' for h in NCU_HEADER)]
    + [",".join(f'"{cell}"' for cell in [kernel_id, "4242", "python", "127.0.0.1", name, "1", "7",
                                          "Command line profiler metrics", *metric])
       for kernel_id, name, *metric in NCU_ROWS]
    + ["==PROF== Disconnected from process 4242"])


def test_ncus_csv_page_gives_the_bytes_read_and_written_over_every_kernel(m):
    assert m.ncu_dram_bytes(NCU_CSV) == dict(read=1_048_576 + 512, write=2_500, kernels=2)
    assert m.ncu_dram_bytes("==ERROR== ERR_NVGPUCTRPERM") == dict(read=0, write=0, kernels=0)


def test_the_child_ncu_measures_runs_one_path_on_the_cpu(m):
    done = subprocess.run(m.child_command("fused + flash", "cpu", 16, 2, 8), capture_output=True,
                          text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, ""), done.stderr


# ncu's stand-in checks its flags and the child's form (the child itself runs in the test above)
STAND_IN_NCU = """#!{python}
import sys
flags, child = sys.argv[1:8], sys.argv[8:]
assert flags == ["--csv", "--print-units", "base", "--profile-from-start", "off", "--metrics",
                 "dram__bytes_read.sum,dram__bytes_write.sum"], flags
assert child[:2] == [{python!r}, "-c"] and child[3].endswith("09_on_a_gpu.py"), child
assert child[5:] == ["cpu", "16", "2", "8"], child
print(open({csv!r}).read())
"""


def test_part_2_reads_each_paths_bytes_from_a_stand_in_ncu(stand_in, monkeypatch, tmp_path,
                                                          capsys):
    (tmp_path / "ncu.csv").write_text(NCU_CSV)
    ncu = tmp_path / "ncu"
    ncu.write_text(STAND_IN_NCU.format(python=sys.executable, csv=str(tmp_path / "ncu.csv")))
    ncu.chmod(0o755)
    monkeypatch.setattr(stand_in, "ncu_path", lambda: str(ncu))
    rows = stand_in.model_rows()
    stand_in.print_dram_bytes(args(quick=False), rows, cpu_limits(stand_in))
    lines = capsys.readouterr().out.splitlines()
    assert all(line.startswith("⚙ ") for line in lines)
    moved = 1_048_576 + 512 + 2_500
    for r in rows:
        line = next(line for line in lines if line.startswith(f"⚙ {r['path']}  "))
        assert line.split()[-5:] == ["2", "1", "0", "1", f"{moved / stand_in.float32_bytes(r):.2f}"]
    assert stand_in._measured["bytes"] == {path: moved for path in costs.FUSION_PATHS}


# ---- the parts, without a GPU and on a CPU standing in for one -----------------------------------
def test_without_a_cuda_device_the_script_prints_its_models_and_one_line():
    script = os.path.join(os.path.dirname(__file__), "..", "code", "lecture06", "09_on_a_gpu.py")
    done = subprocess.run([sys.executable, script, "--no-figures"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    said = [line for line in lines if "no CUDA device" in line]
    assert len(said) == 1 and said[0].startswith("⚙ no CUDA device (torch ")
    assert "until a GPU run is committed, figures/09_output.txt is such a run" in said[0]
    assert [line for line in lines if line.startswith(("⚙", "⏱"))] == said
    assert [line[:6] for line in lines if line.startswith("Part ")] == [
        f"Part {n}" for n in range(1, 6)]


def test_the_parts_measured_on_a_stand_in_print_the_no_gpu_runs_unmarked_lines(stand_in,
                                                                               monkeypatch,
                                                                               tmp_path, capsys):
    """Every line a GPU adds is marked: with a device (the CPU standing in, at small sizes) and
    without one, the unmarked lines are the same, the figure's line too."""
    printed, measured = {}, {}
    for device in ("a CPU standing in", None):
        stand_in._limits.clear()
        stand_in._measured.clear()
        if device is None:
            monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        else:
            stand_in._limits["device"] = cpu_limits(stand_in)
        for show in stand_in.PARTS.values():
            show(args(figures=str(tmp_path / str(device))))
        printed[device] = capsys.readouterr().out.replace(str(tmp_path / str(device)), "DIR")
        measured[device] = set(stand_in._measured)
        assert (tmp_path / str(device) / "09_gpu_paths.png").exists()
    with_device, alone = printed["a CPU standing in"], printed[None]
    assert normalise(with_device) == normalise(alone)
    for part in stand_in.PARTS:   # each part measured something
        assert any(line.startswith(("⚙", "⏱")) for line in section(with_device, part)[2:]), part
    assert [line for line in alone.splitlines() if line.startswith(("⚙", "⏱"))] == [
        line for line in alone.splitlines() if "no CUDA device" in line]
    # part 3's figure draws what parts 1 and 3 measured (and part 2's bytes where ncu ran)
    assert measured == {"a CPU standing in": {"launches", "kept"}, None: set()}


# ---- on a CUDA device only (the GPU session runs these first) ------------------------------------
@CUDA
def test_on_a_gpu_the_limits_are_measured_and_float32_matmuls_use_no_tf32(fresh, capsys):
    limits = fresh.device_limits(args())
    assert limits.device == "cuda" and torch.get_float32_matmul_precision() == "highest"
    assert limits.bandwidth > 1e11 and limits.peak > 1e12 and 0 < limits.launch < 1e-3
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("⚙ GPU: ") and out[1].startswith("⏱ measured here")


@CUDA
def test_on_a_gpu_the_profiler_counts_kernels_and_the_allocator_agrees_with_the_hooks(m):
    d, h, S = SMALL["d"], SMALL["h"], SMALL["S"]
    layer, x, mask, gradient = m.path_setup(d, h, S, 1, "cuda")
    kernels = m.path_kernels(layer, x, "fused", mask, gradient, "cuda")
    forward = m.by_kind(kernels["forward"], m.kernel_kind)
    assert forward["matmul"] >= 8 and forward["layer norm"] >= 2 and forward["softmax"] >= 1
    kept = m.kept_for_backward(lambda: m.layer_forward(layer, x, "fused", mask),
                               layer.parameters(), "cuda", inputs=(x,))
    assert kept["elements"] == costs.exact_saved_floats(S, d, h)
    # each storage a block of the allocator's, rounded up to 512 bytes (and split only past 512)
    assert 0 <= kept["allocator"] - kept["bytes"] < 32 * 1024


@CUDA
def test_on_a_gpu_torchs_dropout_keeps_1_byte_masks():
    s, h, a = 32, 16, 2
    r = costs.saved_by_term(s, h, a, 0.1, torch.bfloat16, "cuda")
    masks = [term for _, term, _, _, size in costs.KORTHIKANTI_TERMS if size == 1]
    assert r["unnamed"] == [] and all(r["by_term"][t][0] == r["by_term"][t][1] for t in masks)


@CUDA
def test_on_a_gpu_the_ncu_child_runs(m):
    done = subprocess.run(m.child_command("fused + flash", "cuda", 16, 2, 8), capture_output=True,
                          text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, ""), done.stderr
