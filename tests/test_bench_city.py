"""bench_city.py (make bench): its timer of the stack's matrix products counts what runs inside it
and gives torch back as it was."""
import time

import torch

from conftest import load_script

bench = load_script("bench_city")


def test_the_gemm_timer_counts_only_the_products_made_inside_it_and_restores_torch():
    bmm, baddbmm = torch.bmm, torch.baddbmm
    a, b = torch.randn(4, 64, 64), torch.randn(4, 64, 64)
    with bench.gemm_seconds([0.0]) as spent:
        assert torch.bmm is not bmm and torch.baddbmm is not baddbmm
        start = time.process_time()
        for _ in range(20):
            torch.baddbmm(torch.bmm(a, b), a, b)
        inside = time.process_time() - start
        timed = spent[0]
        (a @ b).sum()   # not a torch.bmm call: not counted
    assert 0 < timed <= inside and spent[0] == timed
    assert torch.bmm is bmm and torch.baddbmm is baddbmm
