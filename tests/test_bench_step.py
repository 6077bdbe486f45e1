"""bench_step.py (make bench): runs, times both sides of the same model, prints only ⏱ lines that vary."""
import numpy as np

import common
from conftest import load_script

bench = load_script("bench_step")


def test_build_gives_the_same_model_twice():
    ours, twin, x, y = bench.build(2, 5, 8, 2, 1, 7)
    twin_params = dict(twin.named_parameters())
    assert [n for n, _ in ours.named_parameters()] == list(twin_params)
    assert all(np.array_equal(p.data, twin_params[n].detach().numpy()) for n, p in ours.named_parameters())
    assert x.shape == y.shape == (2, 5) and (x[:, 1:] == y[:, :-1]).all()      # y is x shifted by one


def test_bench_times_both_sides():
    r = bench.bench((2, 5, 8, 2, 1, 7), warmup=1, repeats=2)
    assert r["parameters"] == bench.build(2, 5, 8, 2, 1, 7)[0].num_parameters()
    for key in ("ours", "torch", "ours_cpu", "torch_cpu"):
        assert 0 < r[key] < 5
    assert r["ratio"] == r["ours"] / r["torch"]


def test_quick_run_prints_ratio(capsys):
    common.main(bench.__doc__, bench.PARTS, argv=["--quick", "--no-figures"])
    lines = capsys.readouterr().out.splitlines()
    timed = [line for line in lines if line.startswith(common.TIMER)]
    assert len(timed) == 1 and "ratio" in timed[0] and "B=16 S=32 d=64" in timed[0]
