"""Script 09 · The cost model on a GPU: launches, bytes, memory and time, measured beside the model.

Part 1 · §8.4 Launches: GPT-2 small's Pre-LN layer (d = 768, h = 12, S = 1024, B = 1, float32,
    TF32 off), composed vs fused vs fused + flash, forward and backward: CUDA kernels counted by
    torch.profiler beside 03 part 7's launches
Part 2 · §8.3-§8.4 Bytes and the roofline: the same layer's DRAM bytes (Nsight Compute) and time
    (CUDA events) per path, against bytes ÷ bandwidth, FLOPs ÷ peak and launches × one launch
Part 3 · §8.3, §13 Memory kept for backward per path at B = 1 and B = 8, beside 03 part 7 and 06
    parts 4 and 6; Korthikanti et al. in bfloat16 with torch's dropout, as 06 part 7
Part 4 · §8.3 The attention core's share of a layer's time (d = 256, h = 4, dropout 0.1) at
    S = 128 … 8192 and B = 1, 8, beside its FLOP share
Part 5 · §14 on a GPU: fused RMSNorm against fused LayerNorm and a composed RMSNorm (d = 4096,
    32,768 rows, float32 and bfloat16); a decoding step's attention over 32,768 cached positions
    with 64 query heads and 64 / 8 / 1 KV heads

Serves §8.3-§8.4 (what 03 part 7 and 06 parts 4-6 count and time on a CPU, measured on a CUDA
device with torch's own tools: torch.profiler's kernels, Nsight Compute's DRAM bytes, CUDA events,
saved_tensors_hooks and the CUDA allocator), §13 (Korthikanti et al.'s 1-byte dropout masks, which
torch's fused dropout keeps on a GPU) and §14 (RMSNorm's saving, grouped-query attention's smaller
cache). Every model column comes from the project's models (costs.py, tensor.py's counters) and
prints alike with and without a GPU; what the device decides is marked ⚙ and every time ⏱. Without
a CUDA device the script prints the models and one line saying so.

    python code/lecture06/09_on_a_gpu.py [--part N] [--seed S] [--quick] [--no-figures]
"""
from __future__ import annotations

import sys

try:   # first: one BLAS thread before numpy loads
    from lecture06 import common
except ModuleNotFoundError as missing:   # the course's package is not installed in this Python
    sys.exit(f"{missing} in {sys.executable}: run `make venv`, then .venv/bin/python {sys.argv[0]}")

import contextlib
import csv
import dataclasses
import functools
import math
import os
import shutil
import statistics
import subprocess
import time
from collections import Counter

import numpy as np
import torch
import torch.nn.functional as F
from tabulate import tabulate
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from lecture05 import tensor
from lecture05.tensor import MASK_VALUE, Tensor
from lecture06 import costs, kernels, llama, torch_ref, transformer

GIB, MIB = 2 ** 30, 2 ** 20
NO_GPU = ("no CUDA device (torch {torch}): the measured columns need one, so this run prints the "
          "models alone; until a GPU run is committed, figures/09_output.txt is such a run "
          "(DEVELOPING.md: how to make one)")


# ---- the device: its clock, and what it does per second (measured by the first part that runs) ---
class DeviceClock:
    """Marks on the device's own clock: on a GPU, CUDA events recorded in its queue (so an
    interval is what the GPU took, its waits for the CPU's launches included), read once it has
    finished; on the CPU, perf_counter."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start, end) -> float:
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1e3   # elapsed_time is in milliseconds
        return end - start


def timed(fn, device, repeats: int, warmup: int = 2, before=None) -> list[float]:
    """Seconds of each of `repeats` calls of fn(), after `warmup` uncounted ones, on the device's
    clock. before(): run ahead of each counted call, untimed (a cache flush)."""
    for _ in range(warmup):
        fn()
    clock, intervals = DeviceClock(device), []
    for _ in range(repeats):
        if before is not None:
            before()
        start = clock.mark()
        fn()
        intervals.append((start, clock.mark()))
    return [clock.seconds(start, end) for start, end in intervals]


def copy_bandwidth(device, n_bytes: int, repeats: int) -> float:
    """Bytes per second of a device-to-device copy of n_bytes (each read once and written once),
    the median of `repeats`."""
    source = torch.ones(n_bytes // 4, device=device)
    target = torch.empty_like(source)
    return 2 * source.nbytes / statistics.median(timed(lambda: target.copy_(source), device,
                                                       repeats))


def matmul_peak(device, n: int, repeats: int) -> float:
    """float32 FLOPs per second of an n × n by n × n matmul (2·n³ FLOPs), the median of
    `repeats`: the peak the roofline uses, at the matmul precision set (no TF32 on a GPU here)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    return 2 * n ** 3 / statistics.median(timed(lambda: a @ b, device, repeats))


def launch_seconds(device, ops: int, repeats: int) -> float:
    """Seconds per op when `ops` ops that move almost nothing run back to back: multiplies of one
    element under autograd, what an eager forward pays per kernel before a byte moves."""
    one = torch.ones(1, device=device, requires_grad=True)

    def chain():
        x = one
        for _ in range(ops):
            x = x * 1.0
    return statistics.median(timed(chain, device, repeats)) / ops


@dataclasses.dataclass(frozen=True)
class Limits:
    """The device the parts measure on, and what it does per second, as measured here."""
    device: str        # "cuda" (the tests pass "cpu", to run every measurement at small sizes)
    name: str
    bandwidth: float   # bytes per second (a device copy)
    peak: float        # float32 FLOPs per second (a matmul, no TF32)
    launch: float      # seconds per eager op that moves almost nothing


_limits = {}   # the device's limits, measured by the first part that runs in this process


def device_limits(args) -> Limits | None:
    """The CUDA device's limits, measured and printed once, by the first part that runs; None (and
    the one line saying so) without a CUDA device: then every part prints its models alone."""
    if "device" not in _limits:
        _limits["device"] = describe_device(args.quick)
    return _limits["device"]


def describe_device(quick: bool) -> Limits | None:
    if not torch.cuda.is_available():
        common.kernel_note(NO_GPU.format(torch=torch.__version__))
        return None
    torch.set_float32_matmul_precision("highest")   # TF32 off: float32 matmuls in float32
    props = torch.cuda.get_device_properties(0)
    common.kernel_note(f"GPU: {props.name}, {props.multi_processor_count} SMs, "
                       f"{props.total_memory / GIB:.0f} GiB; torch {torch.__version__}, CUDA "
                       f"{torch.version.cuda}; float32 matmuls without TF32")
    repeats = 5 if quick else 10
    limits = Limits(device="cuda", name=props.name, bandwidth=copy_bandwidth("cuda", GIB, repeats),
                    peak=matmul_peak("cuda", 8192, repeats),
                    launch=launch_seconds("cuda", 200, repeats))
    common.timing(f"measured here (medians of {repeats}): bandwidth "
                  f"{limits.bandwidth / 1e12:.2f} TB/s (a 1 GiB device copy), float32 peak "
                  f"{limits.peak / 1e12:.1f} TFLOP/s (8192² matmuls), "
                  f"{1e6 * limits.launch:.1f} µs per eager op on one element (200 in a row)")
    return limits


def repeats_of(args) -> int:
    """How many times a measurement is timed (its median is printed)."""
    return 5 if args.quick else 20


def measured_table(rows, headers, mark=common.kernel_note):
    """A table whose every line, header and rule too, is marked (⚙, or ⏱ with common.timing): it
    prints only where a GPU measured it, so no unmarked line may come with it."""
    mark(tabulate(rows, headers=headers, disable_numparse=True))


# ---- GPT-2 small's layer along three paths, in torch (parts 1-3) ---------------------------------
def composed_layer_norm(x, weight, bias, eps: float):
    """transformer.LayerNorm's primitives in torch: mean, centring, variance, 1/√ from log and exp,
    scale and shift, each its own kernel (F.layer_norm is one)."""
    centred = x - x.mean(-1, keepdim=True)
    variance = (centred * centred).mean(-1, keepdim=True)
    inv_std = ((variance + eps).log() * -0.5).exp()
    return centred * inv_std * weight + bias


def composed_softmax(x):
    """transformer.softmax in torch: exp((x - m) - log Σ exp(x - m)), the max m a constant."""
    shifted = x - x.detach().amax(-1, keepdim=True)
    return (shifted - shifted.exp().sum(-1, keepdim=True).log()).exp()


def composed_gelu(x):
    """transformer.gelu in torch: x·sigmoid(2u), u = √(2/π)(x + 0.044715x³)."""
    u = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
    return x * (u * 2.0).sigmoid()


def linear(module, x):
    """x @ W + b: two launches, as tensor.py's Linear makes them in every path (F.linear would fuse
    the bias into the matmul, a fusion 03 part 7 does not count)."""
    return x @ module.weights + module.bias


def attention_block(mha, x, path: str, mask):
    """torch_ref's attention along path: the core composed, with torch.softmax, or SDPA."""
    batch_size, seq_len, d = x.shape
    h, head_dim = mha.n_head, mha.attn_hidden_dim
    # (B, S, D) -> (B, S, h, Dh) -> (B, h, S, Dh); kᵀ as (B, h, Dh, S), no copy
    q = linear(mha.q_projection, x).view(batch_size, seq_len, h, head_dim).permute(0, 2, 1, 3)
    kT = linear(mha.k_projection, x).view(batch_size, seq_len, h, head_dim).permute(0, 2, 3, 1)
    v = linear(mha.v_projection, x).view(batch_size, seq_len, h, head_dim).permute(0, 2, 1, 3)
    if path == "fused + flash":
        out = F.scaled_dot_product_attention(q, kT.transpose(-2, -1), v, is_causal=True)
    else:
        scores = (q @ kT) * (1.0 / math.sqrt(head_dim)) + mask           # (B, h, S, S)
        weights = composed_softmax(scores) if path == "composed" else torch.softmax(scores, -1)
        out = weights @ v                                                 # (B, h, S, Dh)
    # (B, h, S, Dh) -> (B, S, h, Dh) -> (B, S, D): a copy unless the core wrote the heads merged
    out = out.permute(0, 2, 1, 3).contiguous().view(batch_size, seq_len, d)
    return linear(mha.out_projection, out)


def layer_forward(layer, x, path: str, mask):
    """One Pre-LN layer (torch_ref's weights, no dropout) along path: "composed" builds LayerNorm,
    softmax and GELU from elementwise ops and reductions as tensor.py does; "fused" uses
    F.layer_norm, torch.softmax and F.gelu; "fused + flash" also scaled_dot_product_attention."""
    if path not in costs.FUSION_PATHS:
        raise ValueError(f"unknown path {path!r}; choose one of {', '.join(costs.FUSION_PATHS)}")

    def norm(ln, x):
        if path == "composed":
            return composed_layer_norm(x, ln.weights, ln.bias, ln.eps)
        return F.layer_norm(x, x.shape[-1:], ln.weights, ln.bias, ln.eps)

    x = x + attention_block(layer.attention, norm(layer.ln_1, x), path, mask)
    hidden = linear(layer.ff.linear_in, norm(layer.ln_2, x))
    hidden = composed_gelu(hidden) if path == "composed" else F.gelu(hidden, approximate="tanh")
    return x + linear(layer.ff.linear_out, hidden)


def path_setup(d: int, h: int, S: int, B: int, device, seed: int = 0) -> tuple:
    """torch_ref's layer (float32, dropout 0) on device, an input (B, S, d) that needs a gradient,
    the causal mask (a constant, as tensor.py's) and the gradient that seeds backward."""
    torch.manual_seed(seed)
    layer = torch_ref.TransformerLayer(d, h, p_dropout=0.0).to(device, torch.float32)
    x = torch.randn(B, S, d, device=device, requires_grad=True)
    mask = torch.triu(torch.full((1, 1, S, S), MASK_VALUE, device=device), 1)   # (1, 1, S, S)
    return layer, x, mask, torch.ones(B, S, d, device=device)


def step(layer, x, path: str, mask, gradient):
    """One forward and backward along path; the gradients are let go, so that every step is a
    first one (torch hands a first gradient over rather than adding it to a zero)."""
    layer_forward(layer, x, path, mask).backward(gradient)
    layer.zero_grad(set_to_none=True)
    x.grad = None


def gpt2_sizes() -> tuple[int, int, int]:
    """d, h, S of GPT-2 small's layer at its full context, 03 part 7's."""
    return costs.GPT2_LAYER["d"], costs.GPT2_LAYER["h"], costs.GPT2_LAYER["S"]


@functools.cache
def model_rows() -> tuple:
    """03 part 7's counts of GPT-2 small's layer, one row per path (computed once)."""
    return tuple(costs.fusion_counts_from_shapes(*gpt2_sizes()))


# ---- Part 1 · §8.4 launches ----------------------------------------------------------------------
# The kinds a launch is sorted into, and tensor.py's primitives among them (the rest: elementwise)
KINDS = ("matmul", "attention core", "softmax", "layer norm", "gelu", "reduction", "copy", "fill",
         "elementwise")
PRIMITIVE_KINDS = {"matmul": "matmul", "flash_attention": "attention core", "softmax": "softmax",
                   "layer_norm": "layer norm", "gelu": "gelu", "sum": "reduction",
                   "max": "reduction", "contiguous": "copy"}
# A kernel's kind by what its name holds, first match: CUDA kernels (cuBLAS's gemm, nvjet and xmma
# kernels, PyTorch's reduce_kernel, FillFunctor, direct_copy, cunn_SoftMax, layer_norm kernels)
# and, on the CPU, aten operators
NAME_KINDS = (("fill", ("memset", "fill", "zero_")), ("copy", ("memcpy", "copy")),
              ("attention core", ("attention", "fmha", "flash")), ("softmax", ("softmax",)),
              ("layer norm", ("layer_norm", "layernorm", "rowwisemoments", "gammabeta",
                              "computeinternalgradients", "computegradientfusedparams",
                              "cucompute", "rms_norm", "rmsnorm")),
              ("gelu", ("gelu",)),
              ("matmul", ("gemm", "gemv", "cutlass", "xmma", "nvjet", "cublas", "splitk",
                          "aten::mm", "aten::bmm", "aten::addmm", "aten::matmul")),
              ("reduction", ("reduce", "aten::sum", "aten::mean", "aten::amax")))
# aten operators that only describe memory (on the CPU, where kernels_run counts operators)
NO_WORK = {"aten::view", "aten::as_strided", "aten::resolve_conj", "aten::resolve_neg",
           "aten::empty", "aten::empty_strided", "aten::_unsafe_view", "aten::_reshape_alias",
           "aten::detach", "aten::resize_", "aten::t", "aten::transpose", "aten::expand",
           "aten::permute", "aten::alias", "aten::lift_fresh", "aten::result_type",
           "aten::unsqueeze", "aten::squeeze", "aten::reshape", "aten::slice", "aten::select",
           "aten::to", "aten::empty_like", "aten::ones_like", "aten::zeros_like"}


def kernel_kind(name: str) -> str:
    """The kind of a CUDA kernel (or, on the CPU, an aten operator) by its name."""
    lowered = name.lower()
    return next((kind for kind, parts in NAME_KINDS if any(p in lowered for p in parts)),
                "elementwise")


def kernels_run(fn, device) -> Counter:
    """What fn() runs, by name, as torch.profiler records it: on a CUDA device every kernel,
    memset and memcpy (its device events); on the CPU, which launches none, the aten operators
    called from Python and autograd that do work, so that tests can run it."""
    cuda = torch.device(device).type == "cuda"
    with profile(activities=[ProfilerActivity.CPU]
                 + ([ProfilerActivity.CUDA] if cuda else [])) as recorded:
        fn()
        if cuda:
            torch.cuda.synchronize()
    if cuda:
        return Counter(e.name for e in recorded.events() if e.device_type == DeviceType.CUDA)
    return Counter(e.name for e in recorded.events() if _does_work(e))


def _does_work(event) -> bool:
    """An aten operator that Python or autograd called (no aten operator above it), other than one
    that only describes memory."""
    parent = event.cpu_parent
    return (event.name.startswith("aten::") and event.name not in NO_WORK
            and (parent is None or not parent.name.startswith("aten::")))


def path_kernels(layer, x, path: str, mask, gradient, device) -> dict:
    """The kernels of one forward, then one backward along path (after a warm-up step), by
    name."""
    step(layer, x, path, mask, gradient)   # warm-up: cuBLAS's handle and workspace, the allocator
    outputs = []
    forward = kernels_run(lambda: outputs.append(layer_forward(layer, x, path, mask)), device)
    backward = kernels_run(lambda: outputs[0].backward(gradient), device)
    layer.zero_grad(set_to_none=True)
    x.grad = None
    return dict(forward=forward, backward=backward)


def by_kind(names: Counter, kind_of) -> Counter:
    """{name: launches} -> {kind: launches}."""
    kinds = Counter()
    for name, n in names.items():
        kinds[kind_of(name)] += n
    return kinds


def launch_rows(counted: dict) -> list[list]:
    """One row per path and direction: launches in all, then by kind. counted: {path: {direction:
    Counter by kind}}."""
    return [[path, direction, str(kinds.total()), *(str(kinds[k]) for k in KINDS)]
            for path, directions in counted.items() for direction, kinds in directions.items()]


def model_launches() -> dict:
    """03 part 7's launches that move memory, by kind: {path: {direction: Counter}}."""
    return {r["path"]: {direction: by_kind(r[f"{direction}_by_primitive"],
                                           lambda op: PRIMITIVE_KINDS.get(op, "elementwise"))
                        for direction in ("forward", "backward")} for r in model_rows()}


def show_launches(args):
    common.header(1, __doc__, "d = 768, h = 12, S = 1024, B = 1")
    limits = device_limits(args)
    model = model_launches()
    common.note("Model: 03 part 7's launches, tensor.py's primitive calls that move memory (at "
                "float64, which changes no count), sorted into the kinds a kernel's\nname is: a "
                "primitive that is no matmul, fused kernel, sum, max nor contiguous() counts as "
                "elementwise.")
    headers = ["path", "direction", "launches", *KINDS]
    common.table(launch_rows(model), headers=headers, disable_numparse=True)
    if limits is not None:
        print_measured_launches(model, headers, limits)
    common.note("Where torch's kernels and the model part (torch's paths are written as tensor.py "
                "composes each path, every Linear as x @ W + b):\ntorch's mean is one reduction "
                "where tensor.py's is a sum and a multiply; torch.softmax takes no scale nor mask, "
                "so the fused\npath adds two elementwise kernels forward; a matmul's backward is "
                "two kernels, one per input that needs a gradient, where tensor.py\ncharges one "
                "closure; torch sums each bias's gradient in a reduction of its own and adds two "
                "gradients that meet on one tensor (the\nresidual stream, the input q, k and v "
                "read) in a kernel, which tensor.py does inside the closure that hands them on; "
                "and cuBLAS\nmay split one matmul into more than one kernel.")


def print_measured_launches(model: dict, headers: list, limits: Limits):
    """⚙ torch.profiler's kernels per path and direction on this GPU, and their difference from
    the model."""
    d, h, S = gpt2_sizes()
    layer, x, mask, gradient = path_setup(d, h, S, 1, limits.device)
    measured = {path: {direction: by_kind(names, kernel_kind) for direction, names
                       in path_kernels(layer, x, path, mask, gradient, limits.device).items()}
                for path in costs.FUSION_PATHS}
    totals = {path: sum(k.total() for k in m.values()) for path, m in measured.items()}
    if not any(totals.values()):
        common.kernel_note("torch.profiler recorded no CUDA kernel here (is CUPTI installed?)")
        return
    _measured["launches"] = totals
    common.kernel_note("measured on this GPU: every kernel, memset and memcpy torch.profiler "
                       "records in one forward, then one backward, after a warm-up step")
    measured_table(launch_rows(measured), headers)
    for path in costs.FUSION_PATHS:
        more = {direction: measured[path][direction].total() - model[path][direction].total()
                for direction in ("forward", "backward")}
        common.kernel_note(f"{path:13}: {more['forward']:+d} kernels forward and "
                           f"{more['backward']:+d} backward against the model")


_measured = {}   # what parts 1-3 measured on a GPU in this process, for part 3's figure


# ---- Part 2 · §8.3-§8.4 bytes and the roofline ---------------------------------------------------
def show_roofline(args):
    common.header(2, __doc__)
    limits = device_limits(args)
    rows = model_rows()
    common.table([[r["path"], str(r["forward_moving"] + r["backward_moving"]),
                   f"{float32_bytes(r) / MIB:,.0f}", f"{flops(r) / 1e9:.2f}",
                   f"{flops(r) / float32_bytes(r):.1f}"] for r in rows],
                 headers=["path", "launches (fwd + bwd)", "MiB moved (float32)", "GFLOP",
                          "FLOP per byte"], disable_numparse=True)
    common.note("Model: 03 part 7's counts, its bytes at float32 (half its float64 bytes): each "
                "launch reads its inputs and writes its outputs once, and nothing\nstays in a "
                "cache from one launch to the next; FLOPs: matmuls only. Each path's limits: bytes "
                "÷ bandwidth, FLOPs ÷ peak and launches × one\nlaunch's time, and the largest is "
                "the limit its time is held to. Nsight Compute flushes the caches before each "
                "kernel it measures\n(its default), so each kernel reads from DRAM as the model "
                "assumes.")
    if limits is None:
        return
    print_dram_bytes(args, rows, limits)
    print_path_times(args, rows, limits)


def float32_bytes(row: dict) -> int:
    return (row["forward_bytes"] + row["backward_bytes"]) // 2   # tensor.py's float64 ÷ 2


def flops(row: dict) -> int:
    return row["forward_flops"] + row["backward_flops"]


def print_path_times(args, rows: tuple, limits: Limits):
    """⏱ each path's forward + backward time against its three limits."""
    repeats = repeats_of(args)
    layer, x, mask, gradient = path_setup(*gpt2_sizes(), 1, limits.device)
    table = []
    for r in rows:
        seconds = statistics.median(timed(
            lambda: step(layer, x, r["path"], mask, gradient), limits.device, repeats))
        bounds = {"bytes": float32_bytes(r) / limits.bandwidth, "FLOPs": flops(r) / limits.peak,
                  "launches": (r["forward_moving"] + r["backward_moving"]) * limits.launch}
        limit = max(bounds, key=bounds.get)
        table.append([r["path"], f"{1e3 * seconds:.2f}",
                      *(f"{1e3 * bound:.2f}" for bound in bounds.values()), limit,
                      f"{seconds / bounds[limit]:.2f}"])
    measured_table(table, ["path", f"ms (median of {repeats})", "bytes ÷ bandwidth",
                           "FLOPs ÷ peak", "launches × one", "limit", "time ÷ limit"],
                   mark=common.timing)


# Nsight Compute: DRAM bytes of the kernels between cudaProfilerStart and Stop in a child process
NCU_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")
NCU_SECONDS = 150   # for one path's child under ncu (each kernel replayed: ~300 kernels a path)
NCU_CHILD = ("import importlib.util, sys\n"
             "spec = importlib.util.spec_from_file_location('on_a_gpu', sys.argv[1])\n"
             "script = sys.modules['on_a_gpu'] = importlib.util.module_from_spec(spec)\n"
             "spec.loader.exec_module(script)\n"
             "script.profiled_step(*sys.argv[2:4], *map(int, sys.argv[4:]))\n")


def child_command(path: str, device: str, d: int, h: int, S: int) -> list[str]:
    """The child that runs one path's step for ncu to measure."""
    return [sys.executable, "-c", NCU_CHILD, os.path.abspath(__file__), path, device,
            str(d), str(h), str(S)]


def profiled_step(path: str, device: str, d: int, h: int, S: int):
    """What the child runs: one forward and backward along path after a warm-up step, between
    cudaProfilerStart and Stop on a GPU, so that ncu (--profile-from-start off) measures that step's
    kernels only."""
    layer, x, mask, gradient = path_setup(d, h, S, 1, device)
    step(layer, x, path, mask, gradient)
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
    step(layer, x, path, mask, gradient)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def ncu_dram_bytes(text: str) -> dict:
    """Nsight Compute's --csv page (a row per kernel and metric: "ID", ..., "Metric Name", "Metric
    Unit", "Metric Value") -> bytes read and written over all kernels, and how many kernels."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    units = {"byte": 1, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "tbyte": 1e12}
    totals, kernels_seen = {name: 0.0 for name in NCU_METRICS}, set()
    for row in csv.DictReader(lines):
        if row.get("Metric Name") in totals:
            value = float(row["Metric Value"].replace(",", ""))
            totals[row["Metric Name"]] += value * units[row["Metric Unit"].lower()]
            kernels_seen.add(row["ID"])
    return dict(read=round(totals[NCU_METRICS[0]]), write=round(totals[NCU_METRICS[1]]),
                kernels=len(kernels_seen))


def ncu_path() -> str | None:
    """Nsight Compute's command line, on PATH or where the CUDA toolkit puts it."""
    found = shutil.which("ncu")
    return found or next((p for p in ("/usr/local/cuda/bin/ncu",) if os.path.exists(p)), None)


def print_dram_bytes(args, rows: tuple, limits: Limits):
    """⚙ each path's DRAM bytes by Nsight Compute beside the model's, or one line saying why
    not."""
    ncu = ncu_path()
    if ncu is None or args.quick:
        common.kernel_note("Nsight Compute (ncu) " + ("is not on this machine" if ncu is None
                                                      else "is not run by --quick")
                           + ": the bytes above are the model's alone")
        return
    table, (d, h, S) = [], gpt2_sizes()
    for r in rows:
        command = [ncu, "--csv", "--print-units", "base", "--profile-from-start", "off",
                   "--metrics", ",".join(NCU_METRICS),
                   *child_command(r["path"], limits.device, d, h, S)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=NCU_SECONDS)
        except subprocess.TimeoutExpired:
            common.kernel_note(f"ncu took over {NCU_SECONDS} s for {r['path']}: the bytes above "
                               "are the model's alone")
            return
        counted = ncu_dram_bytes(done.stdout)
        if done.returncode != 0 or counted["kernels"] == 0:
            said = (done.stdout + done.stderr).strip().splitlines() or ["(nothing)"]
            common.kernel_note(f"ncu measured nothing for {r['path']} (exit {done.returncode}): "
                               f"{said[-1][:200]}; the bytes above are the model's alone")
            return
        moved = counted["read"] + counted["write"]
        table.append([r["path"], str(counted["kernels"]), f"{counted['read'] / MIB:,.0f}",
                      f"{counted['write'] / MIB:,.0f}", f"{moved / MIB:,.0f}",
                      f"{moved / float32_bytes(r):.2f}"])
        _measured.setdefault("bytes", {})[r["path"]] = moved
    measured_table(table, ["path", "kernels (ncu)", "DRAM MiB read", "written", "total",
                           "÷ model"])


# ---- Part 3 · §8.3, §13 memory kept for backward -------------------------------------------------
BATCHES = (1, 8)
KORTHIKANTI_LAYER = dict(s=128, b=1, h=64, a=4, p_dropout=0.1)   # 06 part 7's layer, their names


def model_kept(batch_size: int) -> list[dict]:
    """Elements each path's layer keeps for backward at a batch size: 03 part 7's (tensor.py's
    float64 bytes ÷ 8, × B: every array kept has the batch dimension), and 06's formulas for
    torch's layer (parts 4 and 6; composed: tensor.py's count, which torch's composed path keeps
    too, tensor for tensor)."""
    d, h, S = gpt2_sizes()
    formulas = {"fused": costs.exact_saved_floats(S, d, h),
                "fused + flash": costs.flash_saved_floats(S, d, h)["torch SDPA"]}
    return [dict(path=r["path"], B=batch_size, tensor_py=batch_size * r["saved"] // 8,
                 torch=batch_size * formulas.get(r["path"], r["saved"] // 8))
            for r in model_rows()]


def kept_for_backward(forward, exclude, device, inputs=()) -> dict:
    """What autograd keeps for the backward of forward(): by saved_tensors_hooks, each storage
    once, the tensors of `exclude` (parameters) left out, as 06 part 4 counts (bytes, elements);
    on a CUDA device also by the allocator: what is allocated once forward() has run, less what was
    before and the output, plus those of `inputs` (allocated before) that are kept."""
    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
    left_out, kept = {t.untyped_storage().data_ptr() for t in exclude}, {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in left_out:
            kept[t.untyped_storage().data_ptr()] = t   # holding t keeps its address unused
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    storages = [t.untyped_storage() for t in kept.values()]
    result = dict(bytes=sum(s.nbytes() for s in storages), allocator=None,
                  elements=sum(t.untyped_storage().nbytes() // t.element_size()
                               for t in kept.values()))
    if cuda:
        torch.cuda.synchronize()
        inputs_kept = sum(t.untyped_storage().nbytes() for t in inputs
                          if t.untyped_storage().data_ptr() in kept)
        result["allocator"] = (torch.cuda.memory_allocated() - before
                               - out.untyped_storage().nbytes() + inputs_kept)
    return result


def show_memory(args):
    common.header(3, __doc__, "B = 1 and B = 8")
    limits = device_limits(args)
    rows = [row for batch_size in BATCHES for row in model_kept(batch_size)]
    common.table([[r["path"], str(r["B"]), f"{r['tensor_py']:,}", f"{r['torch']:,}",
                   f"{4 * r['torch'] / MIB:,.0f}"] for r in rows],
                 headers=["path", "B", "tensor.py (03 part 7)", "torch's layer (06 parts 4, 6)",
                          "MiB (float32)"], disable_numparse=True)
    common.note(f"(elements kept for backward at S = {gpt2_sizes()[2]}, parameters left out. "
                "06's formulas: "
                "fused 16·S·d + h·S² + 4·S, fused + flash 16·S·d + h·S + 4·S:\ntorch's "
                "scaled_dot_product_attention keeps one logsumexp per row where kernels.py's flash "
                "core keeps two numbers; torch's composed path\nkeeps what tensor.py's does, "
                "tensor for tensor. On a GPU (⚙): saved_tensors_hooks as 06 part 4, and the CUDA "
                "allocator's count.)")
    if limits is not None:
        print_measured_kept(rows, limits)
    print_korthikanti(limits)
    draw_paths(args.figures, limits)


def print_measured_kept(rows: list[dict], limits: Limits):
    """⚙ what each path's layer keeps on this GPU, beside torch's formula."""
    d, h, S = gpt2_sizes()
    table = []
    for batch_size in BATCHES:
        layer, x, mask, gradient = path_setup(d, h, S, batch_size, limits.device)
        for path in costs.FUSION_PATHS:
            step(layer, x, path, mask, gradient)   # warm-up: cuBLAS's workspace is allocated
            kept = kept_for_backward(lambda: layer_forward(layer, x, path, mask),
                                     layer.parameters(), limits.device, inputs=(x,))
            model = next(r for r in rows if (r["path"], r["B"]) == (path, batch_size))
            table.append([path, str(batch_size), f"{kept['elements']:,}",
                          f"{kept['bytes'] / MIB:,.1f}",
                          "" if kept["allocator"] is None else f"{kept['allocator'] / MIB:,.1f}",
                          "yes" if kept["elements"] == model["torch"] else "no"])
            if batch_size == 1:
                _measured.setdefault("kept", {})[path] = kept["bytes"]
        del layer, x, mask, gradient
    measured_table(table, ["path", "B", "elements kept", "MiB (hooks)", "MiB (allocator)",
                           "= torch's formula"])


def kept_by_group(by_term: dict) -> dict:
    """{term: [elements, bytes]} -> [elements, bytes] of the formula's activations, of its dropout
    masks (the terms it counts at 1 byte), and of the LayerNorms' statistics (which it leaves
    out)."""
    masks = {term for _, term, _, _, size in costs.KORTHIKANTI_TERMS if size == 1}
    groups = {"activations": [0, 0], "dropout masks": [0, 0], costs.LAYER_NORM_STATISTICS: [0, 0]}
    for term, (elements, nbytes) in by_term.items():
        group = (term if term == costs.LAYER_NORM_STATISTICS
                 else "dropout masks" if term in masks else "activations")
        groups[group][0] += elements
        groups[group][1] += nbytes
    return groups


def print_korthikanti(limits):
    """Korthikanti et al.'s bytes by group beside torch's bfloat16 layer on the CPU (06 part 7's
    measurement) and, ⚙, on this GPU."""
    s, b, h, a, p = (KORTHIKANTI_LAYER[k] for k in ("s", "b", "h", "a", "p_dropout"))
    theirs = kept_by_group({t["term"]: [t["elements"], t["their_bytes"]]
                            for t in costs.korthikanti_terms(s, b, h, a)})
    cpu = kept_by_group(costs.saved_by_term(s, h, a, p, torch.bfloat16, "cpu")["by_term"])

    def rows_of(groups):   # a row per group, bytes per element beside, and the layer's total
        total = sum(nbytes for _, nbytes in groups.values())
        return ([[name, f"{n:,}", f"{nbytes:,}", f"{nbytes / n:g}" if nbytes else "0"]
                 for name, (n, nbytes) in groups.items()]
                + [["layer", f"{sum(n for n, _ in groups.values()):,}", f"{total:,}", ""]])
    common.note(f"\nKorthikanti et al.'s s·b·h·(34 + 5·a·s/h) bytes at 06 part 7's layer (s = {s}, "
                f"b = {b}, h = d = {h}, a = {a} heads, dropout {p:g}, training mode),\nbeside "
                "torch's layer in bfloat16 on the CPU (06 part 7's measurement, made here again):")
    common.table([[*mine, *cpu_row[2:]] for mine, cpu_row in zip(rows_of(theirs), rows_of(cpu))],
                 headers=["kept for backward", "elements", "their bytes", "per element",
                          "CPU bfloat16 bytes", "per element"], disable_numparse=True)
    common.note("(their masks are 1-byte bool masks, what torch's fused dropout keeps on a GPU; on "
                "the CPU torch's dropout keeps a mask of its input's dtype)")
    if limits is None:
        return
    gpu = costs.saved_by_term(s, h, a, p, torch.bfloat16, limits.device)
    groups = kept_by_group(gpu["by_term"])
    measured_table([row[:1] + row[2:] for row in rows_of(groups)],
                   ["on this GPU, bfloat16", "bytes", "per element"])
    kept = sum(nbytes for _, nbytes in groups.values())
    formula = costs.korthikanti_bytes(s, b, h, a)
    common.kernel_note(f"on this GPU the layer keeps {kept:,} bytes, {kept - formula:+,} against "
                       f"their {formula:,}; storages no term names: {gpu['unnamed'] or 'none'}")


@common.draws_figure
def draw_paths(figures_dir, limits: Limits | None):
    """Launches, bytes moved and memory kept per path: the model's bars, and beside them what this
    GPU measured in parts 1-3 of this run (none without a GPU)."""
    import matplotlib.pyplot as plt
    rows = model_rows()
    panels = [("launches, forward + backward", "launches",
               [r["forward_moving"] + r["backward_moving"] for r in rows], 1),
              ("GiB moved (float32)", "bytes", [float32_bytes(r) for r in rows], GIB),
              ("MiB kept for backward (float32, B = 1)", "kept",
               [r["torch"] * 4 for r in model_kept(1)], MIB)]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    where = np.arange(len(costs.FUSION_PATHS))
    for ax, (title, key, model, unit) in zip(axes, panels):
        measured = _measured.get(key) if limits is not None else None
        width = 0.4 if measured else 0.6
        ax.bar(where - (width / 2 if measured else 0), np.array(model) / unit, width,
               color="#4c72b0", label="model")
        if measured:
            ax.bar(where + width / 2, [measured[p] / unit for p in costs.FUSION_PATHS], width,
                   color="#dd8452", label="measured")
        ax.set_xticks(where, costs.FUSION_PATHS, fontsize=8)
        ax.set_title(title, fontsize=9)
    axes[0].legend(fontsize=8)
    d, h, S = gpt2_sizes()
    fig.subplots_adjust(wspace=0.3)
    fig.suptitle(f"GPT-2 small's Pre-LN layer (d = {d}, h = {h}, S = {S}): "
                 + (f"the model against {limits.name}" if limits is not None
                    else "the model alone (no CUDA device: nothing measured)"), fontsize=10,
                 y=1.02)
    common.save_figure(fig, "09_gpu_paths", figures_dir)


# ---- Part 4 · §8.3 the attention core's share of a layer's time ----------------------------------
TIME_SHARE_LAYER = dict(d=256, h=4, p_dropout=0.1)   # 06 part 5's layer
SEQ_LENS = (128, 256, 512, 1024, 2048, 4096, 8192)
LAUNCH_BOUND = 0.5   # launches decide a forward's time where its kernels × one launch reach this


def core_time_share(layer, x, device, repeats: int, warmup: int = 2) -> dict:
    """The layer's forward time and its attention core's, timed inside it (a wrapper around
    self_attention, as 06 part 5), on the device's clock: medians over `repeats` forwards, and the
    median of their ratio."""
    clock, mha, in_core = DeviceClock(device), layer.attention, []
    core = mha.self_attention

    def timed_core(*args, **kwargs):
        start = clock.mark()
        out = core(*args, **kwargs)
        in_core.append((start, clock.mark()))
        return out

    mha.self_attention = timed_core   # the instance's attribute shadows the method
    runs = []
    try:
        for _ in range(warmup + repeats):
            in_core.clear()
            start = clock.mark()
            layer(x)   # its graph (and the activations it keeps) goes at once
            runs.append(((start, clock.mark()), list(in_core)))
    finally:
        del mha.self_attention
    layer_seconds = [clock.seconds(*whole) for whole, _ in runs[warmup:]]
    core_seconds = [sum(clock.seconds(*inside) for inside in cores) for _, cores in runs[warmup:]]
    return dict(layer=statistics.median(layer_seconds), core=statistics.median(core_seconds),
                share=statistics.median(c / t for c, t in zip(core_seconds, layer_seconds)))


def flop_share(S: int) -> float:
    return costs.attention_share(costs.flop_formula(n_embd=TIME_SHARE_LAYER["d"], seq_len=S))


def show_time_share(args):
    common.header(4, __doc__, "d = 256, h = 4, dropout 0.1", "S = 128 … 8192", "B = 1, 8")
    limits = device_limits(args)
    common.table([[str(S), f"{100 * flop_share(S):.1f}%"] for S in SEQ_LENS],
                 headers=["S", "the core's FLOP share, S/(6d + S)"], disable_numparse=True)
    common.note("(the model: matmul FLOPs only, the same at every B. 06 part 5's layer: "
                "torch_ref's, float32, training mode, dropout on the weights,\nthe core timed "
                "inside each forward. On a GPU (⏱): each row's time share against its FLOP share, "
                "and whether launches decide\nthe forward's time: they do where its kernels × one "
                f"launch's time reach {LAUNCH_BOUND:.0%} of it, and there the core's share is its "
                "share of the\nkernels, not of the bytes)")
    if limits is not None:
        print_time_shares(args, limits)


def print_time_shares(args, limits: Limits):
    """⏱ the core's time share at each S and B on this GPU."""
    d, h, p = (TIME_SHARE_LAYER[k] for k in ("d", "h", "p_dropout"))
    torch.manual_seed(args.seed)
    layer = torch_ref.TransformerLayer(d, h, p_dropout=p).to(limits.device, torch.float32)
    layer.train()
    table = []
    for batch_size in (1, 8):
        for S in SEQ_LENS:
            x = torch.randn(batch_size, S, d, device=limits.device)
            r = core_time_share(layer, x, limits.device, repeats_of(args))
            kernels_per_forward = kernels_run(lambda: layer(x), limits.device).total()
            floor = kernels_per_forward * limits.launch
            table.append([str(S), str(batch_size), f"{1e3 * r['layer']:.3f}",
                          f"{1e3 * r['core']:.3f}", f"{100 * r['share']:.1f}%",
                          f"{100 * flop_share(S):.1f}%",
                          "above" if r["share"] > flop_share(S) else "not above",
                          str(kernels_per_forward), f"{1e3 * floor:.3f}",
                          "launches" if floor >= LAUNCH_BOUND * r["layer"] else "bytes, FLOPs"])
    measured_table(table, ["S", "B", "layer ms", "core ms", "time share", "FLOP share",
                           "time share is", "kernels", "kernels × one launch, ms", "decided by"],
                   mark=common.timing)


# ---- Part 5 · §14 RMSNorm and grouped-query attention on a GPU -----------------------------------
NORM_SIZE = dict(d=4096, rows=32768)   # LLaMA-7B's width
NORMS = ("LayerNorm, fused", "RMSNorm, fused", "RMSNorm, composed")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
DECODE = dict(n_head=64, head_dim=128, length=32768)   # LLaMA-2-70B's heads (8 KV heads)
KV_HEADS = (64, 8, 1)
FLUSH_BYTES = 256 * MIB   # written before each decoding step: more than any GPU's L2 cache


def norm_traffic(module, n_rows: int, d: int, fused: bool) -> dict:
    """tensor.py's launches and bytes (float64) of one forward and backward of a norm module."""
    x = Tensor(np.ones((n_rows, d)), requires_grad=True)
    with kernels.fused() if fused else contextlib.nullcontext():
        with tensor.count_traffic() as forward:
            y = module(x)
        with tensor.count_traffic() as backward:
            y.backward(np.ones(y.shape))
    return {f"{direction}_{field}": traffic.total(field)
            for direction, traffic in (("forward", forward), ("backward", backward))
            for field in ("launches", "bytes")}


def norm_model(d: int, n_rows: int) -> dict:
    """Each norm's launches and bytes (float64) forward and backward over n_rows rows of d, counted
    at 1, 2 and 3 rows and extrapolated (each is linear in the rows; checked at 4). "LayerNorm,
    fused" is kernels.layer_norm; "RMSNorm, composed" llama.RMSNorm (torch's composed one makes
    the same ops); "RMSNorm, fused" the fused LayerNorm less what RMSNorm lacks: forward it reads no
    bias and writes no mean, backward it reads no mean and writes no bias gradient (d + n_rows
    elements each way)."""
    counted = {}
    for name, module, fused in (("LayerNorm, fused", transformer.LayerNorm(d), True),
                                ("RMSNorm, composed", llama.RMSNorm(d), False)):
        runs = [norm_traffic(module, rows, d, fused) for rows in (1, 2, 3, 4)]
        counted[name] = {}
        for key in runs[0]:
            values = [run[key] for run in runs]
            if costs.extrapolate_quadratic((1, 2, 3), values[:3], 4) != values[3]:
                raise ArithmeticError(f"{name}: {key} is not linear in the rows: {values}")
            counted[name][key] = costs.extrapolate_quadratic((1, 2, 3), values[:3], n_rows)
    layer_norm, lacks = counted["LayerNorm, fused"], 8 * (d + n_rows)
    counted["RMSNorm, fused"] = dict(layer_norm, forward_bytes=layer_norm["forward_bytes"] - lacks,
                                     backward_bytes=layer_norm["backward_bytes"] - lacks)
    return {name: counted[name] for name in NORMS}


def composed_rms_norm(x, weight, eps: float):
    """llama.RMSNorm's primitives in torch: x · 1/√(mean(x²) + eps) · w, 1/√ from log and exp."""
    inv_rms = (((x * x).mean(-1, keepdim=True) + eps).log() * -0.5).exp()
    return x * inv_rms * weight


def norm_forward(name: str, x, weight, bias, eps: float = 1e-5):
    if name == "LayerNorm, fused":
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)
    if name == "RMSNorm, fused":
        return F.rms_norm(x, x.shape[-1:], weight, eps)
    if name == "RMSNorm, composed":
        return composed_rms_norm(x, weight, eps)
    raise ValueError(f"unknown norm {name!r}; choose one of {', '.join(NORMS)}")


def norm_measured(name: str, n_rows: int, d: int, dtype, device, repeats: int) -> dict:
    """One norm over (n_rows, d) on device: its kernels forward and backward, and the medians of
    a forward (no autograd) and of a forward + backward."""
    x = torch.randn(n_rows, d, device=device, dtype=dtype, requires_grad=True)
    weight = torch.ones(d, device=device, dtype=dtype, requires_grad=True)
    bias = torch.zeros(d, device=device, dtype=dtype, requires_grad=True)
    gradient = torch.ones_like(x)

    def training_step():
        norm_forward(name, x, weight, bias).backward(gradient)
        x.grad = weight.grad = bias.grad = None

    def inference():
        with torch.no_grad():
            norm_forward(name, x, weight, bias)
    training_step()   # warm-up
    outputs = []
    forward = kernels_run(lambda: outputs.append(norm_forward(name, x, weight, bias)), device)
    backward = kernels_run(lambda: outputs[0].backward(gradient), device)
    return dict(forward_kernels=forward.total(), backward_kernels=backward.total(),
                forward=statistics.median(timed(inference, device, repeats)),
                training=statistics.median(timed(training_step, device, repeats)))


def show_norms_and_decoding(args):
    common.header(5, __doc__, "d = 4096", "32,768 rows", "32,768 cached positions",
                  "64 query heads and 64 / 8 / 1 KV heads")
    limits = device_limits(args)
    d, n_rows = NORM_SIZE["d"], NORM_SIZE["rows"]
    model = norm_model(d, n_rows)
    common.table([[name, str(m["forward_launches"]), str(m["backward_launches"]),
                   *(f"{m[key] / size / MIB:,.0f}" for size in (2, 4)
                     for key in ("forward_bytes", "backward_bytes"))]
                  for name, m in model.items()],
                 headers=["norm (model)", "launches fwd", "bwd", "MiB fwd, float32", "bwd",
                          "MiB fwd, bfloat16", "bwd"], disable_numparse=True)
    saved = {key: 1 - model["RMSNorm, fused"][key] / model["LayerNorm, fused"][key]
             for key in ("forward_bytes", "backward_bytes")}
    common.note(f"(tensor.py's counts at float64 ÷ 2 and ÷ 4.) By bytes a fused RMSNorm saves "
                f"{100 * saved['forward_bytes']:.3f}% of a fused LayerNorm's traffic forward and "
                f"{100 * saved['backward_bytes']:.3f}% backward:\nwhere bytes decide, the one "
                "reduction it spares a row buys no time. Zhang & Sennrich's 7-64% less time is "
                "whole models' running time.")
    if limits is not None:
        print_norm_times(args, model, limits)
    print()
    show_decoding(args, limits)


def print_norm_times(args, model: dict, limits: Limits):
    """⚙ each norm's kernels and ⏱ its times on this GPU, against the model's bytes ÷ bandwidth."""
    d, n_rows = NORM_SIZE["d"], NORM_SIZE["rows"]
    kernels_table, times, table = [], {}, []
    for dtype_name, dtype in DTYPES.items():
        size = 8 // dtype.itemsize   # the model's float64 bytes ÷ this
        for name in NORMS:
            r = norm_measured(name, n_rows, d, dtype, limits.device, repeats_of(args))
            times[dtype_name, name] = r
            kernels_table.append([name, dtype_name, str(r["forward_kernels"]),
                                  str(r["backward_kernels"])])
            floors = [model[name][key] / size / limits.bandwidth
                      for key in ("forward_bytes", "backward_bytes")]
            table.append([name, dtype_name, f"{1e6 * r['forward']:,.0f}",
                          f"{1e6 * floors[0]:,.0f}", f"{1e6 * r['training']:,.0f}",
                          f"{1e6 * sum(floors):,.0f}"])
    measured_table(kernels_table, ["norm (on this GPU)", "dtype", "kernels fwd", "bwd"])
    measured_table(table, ["norm", "dtype", "forward µs", "bytes ÷ bandwidth",
                           "forward + backward µs", "bytes ÷ bandwidth"], mark=common.timing)
    for dtype_name in DTYPES:
        rms, layer = (times[dtype_name, name] for name in ("RMSNorm, fused", "LayerNorm, fused"))
        common.timing(f"{dtype_name}: fused RMSNorm takes "
                      f"{rms['forward'] / layer['forward']:.2f} of fused LayerNorm's time forward, "
                      f"{rms['training'] / layer['training']:.2f} forward + backward (Zhang & "
                      "Sennrich: 0.36-0.93)")


def decode_attention(q, k, v):
    """One decoding step's attention: q (B, n_head, 1, Dh) against a cache k, v (B, n_kv, T, Dh),
    each KV head read once by the n_head / n_kv query heads that share it -> (B, n_head, 1, Dh)."""
    batch_size, n_head, _, head_dim = q.shape
    n_kv = k.shape[1]
    # (B, n_head, 1, Dh) -> (B, n_kv, g, Dh): a KV head's g query heads, the rows of one matmul
    grouped = q.view(batch_size, n_kv, n_head // n_kv, head_dim) * (1.0 / math.sqrt(head_dim))
    weights = torch.softmax(grouped @ k.transpose(-2, -1), dim=-1)          # (B, n_kv, g, T)
    return (weights @ v).view(batch_size, n_head, 1, head_dim)   # (B, n_kv, g, Dh) -> (B, h, 1, Dh)


def decode_seconds(n_kv: int, length: int, n_head: int, head_dim: int, device, repeats: int,
                   flush_bytes: int) -> float:
    """The median time of decode_attention over a bfloat16 cache of `length` positions, a buffer
    of flush_bytes written before each step so that the cache comes from DRAM, not a cache."""
    shape = (1, n_kv, length, head_dim)
    k, v = (torch.randn(shape, device=device, dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(1, n_head, 1, head_dim, device=device, dtype=torch.bfloat16)
    flush = torch.empty(flush_bytes, dtype=torch.uint8, device=device)
    with torch.no_grad():
        return statistics.median(timed(lambda: decode_attention(q, k, v), device, repeats,
                                       before=flush.zero_))


def show_decoding(args, limits: Limits | None):
    n_head, head_dim, length = (DECODE[k] for k in ("n_head", "head_dim", "length"))
    cache = {n_kv: llama.kv_cache_formula(1, 1, length, n_kv, head_dim, itemsize=2)
             for n_kv in KV_HEADS}
    common.table([[str(n_kv), f"{cache[n_kv] / MIB:,.0f}", f"{cache[n_head] // cache[n_kv]}×"]
                  for n_kv in KV_HEADS],
                 headers=["KV heads", "cache MiB, 2·T·n_kv·Dh·2 (bfloat16)", "smaller by"],
                 disable_numparse=True)
    common.note(f"(one layer's decoding step, B = 1, {n_head} query heads of {head_dim}: each KV "
                "head read once by its query heads, two matmuls and a softmax whose scores go\n"
                "through memory; on a GPU (⏱) the L2 cache is flushed before each step, and the "
                "time is held against the cache's bytes ÷ bandwidth)")
    if limits is None:
        return
    seconds = {n_kv: decode_seconds(n_kv, length, n_head, head_dim, limits.device,
                                    repeats_of(args), FLUSH_BYTES) for n_kv in KV_HEADS}
    measured_table([[str(n_kv), f"{1e6 * t:,.1f}", f"{1e6 * cache[n_kv] / limits.bandwidth:,.1f}",
                     f"{t * limits.bandwidth / cache[n_kv]:.2f}",
                     f"{seconds[n_head] / t:.1f}×"] for n_kv, t in seconds.items()],
                   ["KV heads", "µs", "cache ÷ bandwidth, µs", "time ÷ that", "faster by"],
                   mark=common.timing)


PARTS = {1: show_launches, 2: show_roofline, 3: show_memory, 4: show_time_share,
         5: show_norms_and_decoding}

if __name__ == "__main__":
    common.main(__doc__, PARTS)
