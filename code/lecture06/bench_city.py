"""Benchmark: a 400-step city-language run of script 04's model, lone against stacked.

Script 04 part 4 counts its claims over seeds, and each seed is a 400-step run of a 6-layer
DecoderLM (d = 64, h = 4, batch 8 × 32, V = 44, Post-LN, lr 6e-3 after 100 warmup steps). Two ways
to train such runs, paired in one process, A B A B:

  lone     city_train.train: one torch_ref.DecoderLM, the plain loop (how every run trained before
           the stack; kept as the reference)
  stacked  city_train.train_stack: city_train.STACK_SIZE runs (seeds 0, 1, ...) as one
           city_stack.StackedDecoderLM, how train_many trains them now

and prints the CPU seconds per run and per step of each (this process's CPU time: the machine's
other programs disturb it less than the wall clock), with the ratio stacked / lone. Also the part
of a step that no framework can save: the FLOPs of its matrix products, at the rate this CPU's
batched float32 GEMM reaches, and the CPU time of the products as a stacked run makes them.

    python code/lecture06/bench_city.py [--steps 400] [--repeats 1]
"""
import sys

try:   # first: one BLAS thread before numpy loads
    from lecture06 import common
except ModuleNotFoundError as missing:   # the course's package is not installed in this Python
    sys.exit(f"{missing} in {sys.executable}: run `make venv`, then .venv/bin/python {sys.argv[0]}")

import argparse
import contextlib
import platform
import statistics
import time

import torch

from lecture06 import city_lab, city_train

MODEL = dict(n_layers=6, n_embd=64, n_head=4, pre_ln=False, init="xavier")
TRAINING = dict(lr=6e-3, warmup=100, batch_size=8, eval_every=None)
GEMM_STEPS = 100   # the stacked run whose matrix products are timed one by one


def cpu_name() -> str:
    """The CPU's model name (Linux), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def step_flops(n_layers: int, d: int, tokens: int, seq: int, vocab: int) -> int:
    """FLOPs of one training step's matrix products: forward 2·tokens·(12d²·L + d·V) for the
    projections, FFN and head, plus 4·tokens·seq·d·L for QKᵀ and AV; backward twice the forward."""
    forward = 2 * tokens * (12 * d * d * n_layers + d * vocab) + 4 * tokens * seq * d * n_layers
    return 3 * forward


def gemm_rate(d: int = 64, tokens: int = 256, runs: int = 5, repeats: int = 50) -> float:
    """GFLOP/s of a batched float32 (tokens, d) @ (d, 4d) on one thread: the stack's FFN product."""
    a, b = torch.randn(runs, tokens, d), torch.randn(runs, d, 4 * d)
    with common.threads.torch_threads(1):
        for _ in range(5):
            torch.bmm(a, b)
        start = time.process_time()
        for _ in range(repeats):
            torch.bmm(a, b)
        seconds = (time.process_time() - start) / repeats
    return 2 * runs * tokens * d * 4 * d / seconds / 1e9


def lone(steps: int) -> float:
    """CPU seconds of one run of the plain loop."""
    start = time.process_time()
    city_train.train(city_train.build_model(**MODEL, seed=0), steps=steps, seed=0, **TRAINING)
    return time.process_time() - start


def stacked(steps: int) -> float:
    """CPU seconds per run of a stack of city_train.STACK_SIZE runs."""
    start = time.process_time()
    city_train.train_stack(MODEL, dict(TRAINING, steps=steps),
                           seeds=list(range(city_train.STACK_SIZE)))
    return (time.process_time() - start) / city_train.STACK_SIZE


@contextlib.contextmanager
def gemm_seconds(spent: list):
    """Count the CPU seconds of every torch.bmm and torch.baddbmm (the stack's matrix products)
    into spent[0] while inside."""
    originals = {name: getattr(torch, name) for name in ("bmm", "baddbmm")}

    def timed(product):
        def call(*args, **kwargs):
            start = time.process_time()
            out = product(*args, **kwargs)
            spent[0] += time.process_time() - start
            return out
        return call

    for name, product in originals.items():
        setattr(torch, name, timed(product))
    try:
        yield spent
    finally:
        for name, product in originals.items():
            setattr(torch, name, product)


def stacked_gemm(steps: int) -> float:
    """CPU seconds per run-step that a stacked run spends in its matrix products."""
    with gemm_seconds([0.0]) as spent:
        stacked(steps)
    return spent[0] / city_train.STACK_SIZE / steps


def show_bench(args):
    print(__doc__.strip().splitlines()[0])
    print(f"CPU: {cpu_name()}, torch {torch.__version__} "
          f"({torch.backends.cpu.get_cpu_capability()}),"
          f" one thread; {args.steps} steps a run, {args.repeats} pair(s)")
    pairs = [(lone(args.steps), stacked(args.steps)) for _ in range(args.repeats)]
    a = statistics.median(p[0] for p in pairs)
    b = statistics.median(p[1] for p in pairs)
    ratio = statistics.median(p[1] / p[0] for p in pairs)
    common.timing(f"lone:    {a:5.2f} s of CPU per run, {1000 * a / args.steps:5.1f} ms per step")
    common.timing(f"stacked: {b:5.2f} s of CPU per run, {1000 * b / args.steps:5.1f} ms per step "
                  f"({city_train.STACK_SIZE} runs a stack)")
    common.timing(f"stacked / lone: {ratio:.2f} (median of the pairs' ratios)")
    flops = step_flops(MODEL["n_layers"], MODEL["n_embd"], TRAINING["batch_size"]
                       * city_lab.SEQ_LEN, city_lab.SEQ_LEN, city_lab.V)
    rate = gemm_rate()
    common.timing(f"a step's matrix products: {flops / 1e6:.0f} MFLOP; at this CPU's batched GEMM "
                  f"rate ({rate:.0f} GFLOP/s) they alone take {flops / rate / 1e6:.1f} ms")
    gemm = stacked_gemm(GEMM_STEPS)
    common.timing(f"timed inside a stacked run ({GEMM_STEPS} steps): its matrix products take "
                  f"{1000 * gemm:.1f} ms a run-step, {gemm * args.steps / a:.2f} of a lone run's "
                  "step by themselves")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="steps a run (default 400)")
    parser.add_argument("--repeats", type=int, default=1, help="pairs of runs (default 1)")
    show_bench(parser.parse_args())
