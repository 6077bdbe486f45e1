"""bench_step.py (make bench): runs, times both sides of the same model, prints only ⏱ lines that
vary; its list of the step's GEMMs is the list of matrix products our forward really makes (and
their backward)."""
from collections import Counter
import math

import numpy as np

from lecture06 import common, transformer
from lecture05 import tensor
from conftest import load_script

bench = load_script("bench_step")


def test_build_gives_the_same_model_twice():
    ours, twin, x, y = bench.build(2, 5, 8, 2, 1, 7)
    twin_params = dict(twin.named_parameters())
    assert [n for n, _ in ours.named_parameters()] == list(twin_params)
    assert all(np.array_equal(p.data, twin_params[n].detach().numpy())
               for n, p in ours.named_parameters())
    assert x.shape == y.shape == (2, 5) and (x[:, 1:] == y[:, :-1]).all()  # y is x shifted by one


def _forward_products(out) -> Counter:
    """(batch entries, M, K, N) of every matmul in the autodiff graph of out."""
    products = Counter()
    for t in tensor.graph(out):
        if t._op == "matmul":
            left, right = t._parents
            if right.ndim == 2:   # (..., M, K) @ (K, N): one product over all rows
                products[1, math.prod(left.shape[:-1]), left.shape[-1], right.shape[-1]] += 1
            else:
                products[math.prod(t.shape[:-2]), left.shape[-2], left.shape[-1],
                         right.shape[-1]] += 1
    return products


def test_step_gemms_are_the_products_of_our_forward_and_their_backward():
    size = (3, 6, 12, 3, 2, 11)
    ours, _, x, y = bench.build(*size)
    gemms = bench.step_gemms(*size)
    forward = Counter((math.prod(shape), M, K, N) for what, shape, M, K, N in gemms
                      if "backward" not in what)
    assert forward == _forward_products(transformer.lm_loss(ours(x), y))
    assert len(gemms) == 3 * sum(forward.values())  # each forward product brings two
    for (what, shape, M, K, N), (back_a, s_a, *dA), (back_b, s_b, *dB) in zip(
            gemms[::3], gemms[1::3], gemms[2::3]):
        assert (back_a == f"{what} backward dA" and back_b == f"{what} backward dB"
                and shape == s_a == s_b)
        assert dA == [M, N, K] and dB == [K, M, N]
    B, S, d, h, L, V = size
    assert bench.gemm_flops(gemms) == 3 * (B * L * (24 * S * d * d + 4 * S * S * d)
                                           + 2 * B * S * d * V)


def test_bench_times_both_sides():
    r = bench.bench((2, 5, 8, 2, 1, 7), warmup=1, repeats=2)
    assert r["parameters"] == bench.build(2, 5, 8, 2, 1, 7)[0].num_parameters()
    for key in ("ours", "torch", "ours_cpu", "torch_cpu", "ours_gemm", "torch_gemm",
                "ours_gemm_cpu", "torch_gemm_cpu"):
        assert 0 < r[key] < 5
    assert (r["ratio"] == r["ours"] / r["torch"]
            and r["gemm_ratio"] == r["ours_gemm"] / r["torch_gemm"])
    assert (r["ours_rest"] == r["ours"] - r["ours_gemm"]
            and r["torch_rest"] == r["torch"] - r["torch_gemm"])
    assert r["rest_ratio"] == r["ours_rest"] / r["torch_rest"]
    assert r["gemms"] == len(bench.step_gemms(2, 5, 8, 2, 1, 7))


def test_quick_run_prints_ratio(capsys):
    common.main(bench.__doc__, bench.PARTS, argv=["--quick", "--no-figures"])
    lines = capsys.readouterr().out.splitlines()
    timed = [line for line in lines if line.startswith(common.TIMER)]
    assert len(timed) == 2 and "ratio" in timed[0] and "B=16 S=32 d=64" in timed[0]
    assert "GEMMs: numpy" in timed[1] and "(BLAS)" in timed[1] and "everything else" in timed[1]
    assert "(framework)" in timed[1]
    assert any("GEMMs/step" in line for line in lines)
