"""Benchmark: one training step of the same DecoderLM in tensor.py and PyTorch (torch_ref), float64.

Part 1 · §9 One training step: tensor.py against PyTorch (float64)

A step is forward + backward + Adam update, dropout on (p = 0.1), the loss the mean next-token
cross-entropy. Each size runs a warmup, then the median of several repeats is reported, with the
ratio tensor.py / PyTorch (target: within 2x): wall-clock time, and the process's CPU time, which
other programs sharing the machine disturb less. Both sides use the same number of threads:
OPENBLAS_NUM_THREADS (default 1, threads.py) for numpy's BLAS and for torch.

The ratio mixes two things: the BLAS each side calls (numpy's OpenBLAS against the MKL torch's wheel
is built with), whose relative speed differs from CPU to CPU (at these sizes numpy's float64 GEMMs
took 1.4× torch's time on one AVX-512 machine, and about 0.6× on an AVX2 AMD EPYC), and the
framework around it. So each size also times the step's bare GEMMs on both sides, every matrix
product of the step at its shape (the four projections, QKᵀ, AV, the two FFN matmuls and the head;
forward, and the two products of each backward) on contiguous float64 operands, and splits the
step's time into GEMMs + everything else, with the ratio of each.
`make bench` runs it; about 20 s of CPU time (--quick: the small size only, fewer repeats, about
7 s, most of it importing torch).
"""
import sys

try:   # first: one BLAS thread before numpy loads
    from lecture06 import common
except ModuleNotFoundError as missing:   # the course's package is not installed in this Python
    sys.exit(f"{missing} in {sys.executable}: run `make venv`, then .venv/bin/python {sys.argv[0]}")

import math
import os

import numpy as np
import torch
import torch.nn.functional as F

from lecture06 import optim, torch_ref, transformer
from lecture06.threads import torch_threads

THREADS = int(os.environ["OPENBLAS_NUM_THREADS"])  # threads.py's default, or the caller's setting

SIZES = [  # (B, S, d, h, layers, V)
    (16, 32, 64, 4, 2, 64),
    (16, 64, 128, 4, 4, 64),
]


def build(batch, seq, d, heads, layers, vocab, seed=0):
    """The same model twice (tensor.py and torch_ref,
    same weights), each with its Adam, and a batch."""
    transformer.set_seed(seed)
    ours = transformer.DecoderLM(vocab, d, heads, n_positions=seq, n_layers=layers, p_dropout=0.1)
    twin = torch_ref.copy_from(torch_ref.DecoderLM(vocab, d, heads, n_positions=seq,
                                                   n_layers=layers, p_dropout=0.1), ours)
    for module in twin.modules():                 # each side draws its own dropout masks
        if isinstance(module, torch_ref.Dropout):
            module.twin = None
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (batch, seq + 1))
    return ours, twin, ids[:, :-1], ids[:, 1:]


def step_ours(model, optimizer, x, y):
    optimizer.zero_grad()
    loss = transformer.lm_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def step_torch(model, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    loss.backward()
    optimizer.step()
    return loss.item()


def step_gemms(batch, seq, d, heads, layers, vocab) -> list[tuple]:
    """Every matrix product of one training step of DecoderLM(vocab, d, heads, seq, layers) on a
    (batch, seq) batch, as (what, batch_shape, M, K, N)
    for (*batch_shape, M, K) @ (*batch_shape, K, N).

    A product C = A B (forward) brings two to backward: dA = dC Bᵀ (M, N, K) and dB = Aᵀ dC (K, M,
    N), each with the forward's FLOPs. Linear layers multiply all batch × seq rows by the weight in
    one product, as both tensor.py and torch do; QKᵀ and AV are batch × heads products of head-sized
    matrices.
    """
    rows, head_dim, pairs, middle = batch * seq, d // heads, (batch * heads,), 4 * d

    def product(what, shape, M, K, N):
        return [(what, shape, M, K, N), (f"{what} backward dA", shape, M, N, K),
                (f"{what} backward dB", shape, K, M, N)]

    def linear(what, in_size, out_size):
        return product(what, (), rows, in_size, out_size)

    layer = (linear("Q projection", d, d) + linear("K projection", d, d)
             + linear("V projection", d, d)
             + product("QKᵀ", pairs, seq, head_dim, seq) + product("AV", pairs, seq, seq, head_dim)
             + linear("O projection", d, d) + linear("FFN in", d, middle)
             + linear("FFN out", middle, d))
    return layer * layers + linear("head", d, vocab)


def gemm_flops(gemms) -> int:
    return sum(2 * math.prod(shape) * M * K * N for _, shape, M, K, N in gemms)


def gemm_runners(gemms, seed: int = 0):
    """Two functions that run every product of `gemms` once, in order: numpy float64 (np.matmul) and
    torch float64 (torch.matmul) on the same contiguous operands (one random pair per distinct
    shape)."""
    rng = np.random.default_rng(seed)
    operands = {}
    for _, shape, M, K, N in gemms:
        if (shape, M, K, N) not in operands:
            operands[shape, M, K, N] = (rng.standard_normal((*shape, M, K)),
                                        rng.standard_normal((*shape, K, N)))
    ours = [operands[shape, M, K, N] for _, shape, M, K, N in gemms]
    theirs = [(torch.from_numpy(a), torch.from_numpy(b)) for a, b in ours]  # the same memory

    def numpy_gemms():
        for a, b in ours:
            np.matmul(a, b)

    def torch_gemms():
        for a, b in theirs:
            torch.matmul(a, b)
    return numpy_gemms, torch_gemms


def bench(size, warmup: int = 2, repeats: int = 7) -> dict:
    """Median seconds per training step, wall-clock
    and CPU, for both implementations at one size."""
    ours, twin, x, y = build(*size)
    ours_opt = optim.Adam(ours.parameters(), lr=1e-3)
    twin_opt = torch.optim.Adam(twin.parameters(), lr=1e-3)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    ours_wall, ours_cpu = common.median_time(lambda: step_ours(ours, ours_opt, x, y),
                                             repeats, warmup)
    torch_wall, torch_cpu = common.median_time(lambda: step_torch(twin, twin_opt, tx, ty),
                                               repeats, warmup)
    gemms = step_gemms(*size)
    numpy_gemms, torch_gemms = gemm_runners(gemms)
    ours_gemm, ours_gemm_cpu = common.median_time(numpy_gemms, repeats, warmup)
    torch_gemm, torch_gemm_cpu = common.median_time(torch_gemms, repeats, warmup)
    return {"size": size, "parameters": ours.num_parameters(),
            "ours": ours_wall, "torch": torch_wall, "ratio": ours_wall / torch_wall,
            "ours_cpu": ours_cpu, "torch_cpu": torch_cpu,
            "ratio_cpu": ours_cpu / torch_cpu,
            "gemms": len(gemms), "gemm_flops": gemm_flops(gemms),
            "ours_gemm": ours_gemm, "torch_gemm": torch_gemm, "gemm_ratio": ours_gemm / torch_gemm,
            "ours_rest": ours_wall - ours_gemm, "torch_rest": torch_wall - torch_gemm,
            "rest_ratio": (ours_wall - ours_gemm) / (torch_wall - torch_gemm),
            "ours_gemm_cpu": ours_gemm_cpu, "torch_gemm_cpu": torch_gemm_cpu,
            "gemm_ratio_cpu": ours_gemm_cpu / torch_gemm_cpu,
            "rest_ratio_cpu": (ours_cpu - ours_gemm_cpu) / (torch_cpu - torch_gemm_cpu)}


@torch_threads(THREADS)
def show_bench(args):
    sizes = SIZES[:1] if args.quick else SIZES
    warmup, repeats = (1, 3) if args.quick else (1, 5)
    common.header(1, __doc__)
    common.table([(
        *size,
        f"{transformer.DecoderLM(size[5], size[2], size[3], size[1], size[4]).num_parameters():,}",
        len(step_gemms(*size)), f"{gemm_flops(step_gemms(*size)) / 1e6:,.1f}")
        for size in sizes],
        headers=("B", "S", "d", "h", "layers", "V", "parameters", "GEMMs/step", "GEMM MFLOP/step"))
    print(f"threads: {THREADS} for numpy's BLAS and for torch; median of {repeats} steps after "
          f"{warmup} warmup; step = its GEMMs\n(each product of the step alone, contiguous float64 "
          f"operands: BLAS against BLAS) + everything else (the framework)")
    for size in sizes:
        r = bench(size, warmup, repeats)
        batch, seq, d, heads, layers, vocab = size
        common.timing(f"B={batch} S={seq} d={d} h={heads} layers={layers} V={vocab}: "
                      f"tensor.py {r['ours'] * 1e3:.1f} ms, PyTorch {r['torch'] * 1e3:.1f} ms, "
                      f"ratio {r['ratio']:.2f}x (CPU time: {r['ours_cpu'] * 1e3:.1f} ms, "
                      f"{r['torch_cpu'] * 1e3:.1f} ms, ratio {r['ratio_cpu']:.2f}x)")
        common.timing(f"  = GEMMs: numpy {r['ours_gemm'] * 1e3:.1f} ms, "
                      f"torch {r['torch_gemm'] * 1e3:.1f} ms, "
                      f"ratio {r['gemm_ratio']:.2f}x (BLAS) + everything else: "
                      f"tensor.py {r['ours_rest'] * 1e3:.1f} ms, "
                      f"PyTorch {r['torch_rest'] * 1e3:.1f} ms, "
                      f"ratio {r['rest_ratio']:.2f}x (framework) "
                      f"(CPU time ratios: {r['gemm_ratio_cpu']:.2f}x, {r['rest_ratio_cpu']:.2f}x)")


PARTS = {1: show_bench}

if __name__ == "__main__":
    common.main(__doc__, PARTS)
