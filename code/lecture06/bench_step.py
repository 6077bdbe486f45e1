"""Benchmark: one training step of the same DecoderLM in tensor.py and in PyTorch (torch_ref), float64.

A step is forward + backward + Adam update, dropout on (p = 0.1), the loss the mean next-token
cross-entropy. Each size runs a warmup, then the median of several repeats is reported, with the
ratio tensor.py / PyTorch (target: within 2x): wall-clock time, and the process's CPU time, which
other programs sharing the machine disturb less. Both sides use the same number of threads:
OPENBLAS_NUM_THREADS (default 1, threads.py) for numpy's BLAS and for torch.
`make bench` runs it; about 15 s (--quick: the small size only, fewer repeats, a few seconds).
"""
import common  # first: one BLAS thread before numpy loads, and lecture 5's code importable

import os

import numpy as np
import torch
import torch.nn.functional as F

import torch_ref
import transformer as tr
from threads import torch_threads

THREADS = int(os.environ["OPENBLAS_NUM_THREADS"])  # threads.py's default, or the caller's setting

SIZES = [  # (B, S, d, h, layers, V)
    (16, 32, 64, 4, 2, 64),
    (16, 64, 128, 4, 4, 64),
]


def build(batch, seq, d, heads, layers, vocab, seed=0):
    """The same model twice (tensor.py and torch_ref, same weights), each with its Adam, and a batch."""
    tr.set_seed(seed)
    ours = tr.DecoderLM(vocab, d, heads, n_positions=seq, n_layers=layers, p_dropout=0.1)
    twin = torch_ref.copy_from(torch_ref.DecoderLM(vocab, d, heads, n_positions=seq, n_layers=layers,
                                                   p_dropout=0.1), ours)
    for module in twin.modules():                 # each side draws its own dropout masks
        if isinstance(module, torch_ref.Dropout):
            module.twin = None
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (batch, seq + 1))
    return ours, twin, ids[:, :-1], ids[:, 1:]


def step_ours(model, optimizer, x, y):
    optimizer.zero_grad()
    loss = tr.lm_loss(model(x), y)
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


def bench(size, warmup: int = 2, repeats: int = 7) -> dict:
    """Median seconds per training step, wall-clock and CPU, for both implementations at one size."""
    ours, twin, x, y = build(*size)
    ours_opt = tr.Adam(ours.parameters(), lr=1e-3)
    twin_opt = torch.optim.Adam(twin.parameters(), lr=1e-3)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    ours_wall, ours_cpu = common.median_time(lambda: step_ours(ours, ours_opt, x, y), repeats, warmup)
    torch_wall, torch_cpu = common.median_time(lambda: step_torch(twin, twin_opt, tx, ty), repeats, warmup)
    return {"size": size, "parameters": ours.num_parameters(), "ours": ours_wall, "torch": torch_wall,
            "ratio": ours_wall / torch_wall, "ours_cpu": ours_cpu, "torch_cpu": torch_cpu,
            "ratio_cpu": ours_cpu / torch_cpu}


@torch_threads(THREADS)
def show_bench(args):
    sizes = SIZES[:1] if args.quick else SIZES
    warmup, repeats = (1, 3) if args.quick else (1, 5)
    common.header(1, "§9", "One training step: tensor.py against PyTorch (float64)")
    common.table([(*size, f"{tr.DecoderLM(size[5], size[2], size[3], size[1], size[4]).num_parameters():,}")
                  for size in sizes], headers=("B", "S", "d", "h", "layers", "V", "parameters"))
    print(f"threads: {THREADS} for numpy's BLAS and for torch; median of {repeats} steps after {warmup} warmup")
    for size in sizes:
        r = bench(size, warmup, repeats)
        batch, seq, d, heads, layers, vocab = size
        common.timing(f"B={batch} S={seq} d={d} h={heads} layers={layers} V={vocab}: "
                      f"tensor.py {r['ours'] * 1e3:.1f} ms, PyTorch {r['torch'] * 1e3:.1f} ms, "
                      f"ratio {r['ratio']:.2f}x (CPU time: {r['ours_cpu'] * 1e3:.1f} ms, "
                      f"{r['torch_cpu'] * 1e3:.1f} ms, ratio {r['ratio_cpu']:.2f}x)")


PARTS = {1: show_bench}

if __name__ == "__main__":
    common.main(__doc__, PARTS)
