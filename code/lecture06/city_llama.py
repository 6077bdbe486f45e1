"""LLaMA-style decoders trained on the city language: script 08's trained parts (§14's preview).

The models are llama_ref.DecoderLM in float32 (the float64 twin of llama.py's, cast down for speed),
drawn by city_train's init and trained by city_train.train (Adam, fresh batches, one torch thread),
scored as excess over the language's exact bound in mnat/token. One run is one function of plain
data, so that runner.map can spread runs over the cores and keep their results:

    rungs = ladder(n_layers=1, n_embd=64, n_head=4, n_kv_heads=2)   # [(name, model settings)]
    result = run(model=dict(rungs[3][1], seed=0), training=dict(steps=200, lr=3e-3, seed=0),
                 long_lengths=[64, 128], convert_to=[4, 2, 1], uptrain_steps=20)
    result["excess"]              # on the test set (windows of SEQ_LEN = 32 targets)
    result["long_excess"]         # {64: ..., 128: ...}: windows longer than any trained on
    result["refusal"]             # instead, the model's one-line reason (learned positions)
    result["converted"]           # {2: (right after mean-pooling K, V heads, after uptraining)}
    results = run_many([dict(model=..., training=...), ...])    # run() each, on every core

The ladder goes from the notes' Pre-LN GPT (LayerNorm, GELU, learned positions, as many KV heads as
query heads) to a LLaMA-style model one change at a time, at matched parameter count: SwiGLU's
hidden size m makes its three d·m matrices hold GELU's two d·4d ones as nearly as whole numbers
allow (m = 8d/3 rounded), and the GQA rung's m grows by what its smaller K, V projections save (as
LLaMA-2-70B's larger feed-forward does).
"""
from __future__ import annotations

from lecture06 import threads  # first: one BLAS thread, set before numpy loads

import functools

import numpy as np
import torch

from lecture06 import city_lab, city_train, llama_ref, runner
from lecture06.city_lab import N_TEST, SEQ_LEN, TEST_SEED, V, sample

RUNGS = ("GPT", "+RMSNorm", "+SwiGLU", "+RoPE", "+GQA")
# the long windows' generator is seeded by [TEST_SEED, LONG_STREAM, length]: no training seed's
# ([seed, 1]) and not the test set's ([TEST_SEED, 0])
LONG_STREAM = 3
# the uptraining's batches come from seed + UPTRAIN_SEEDS: a stream the base run never trained on
UPTRAIN_SEEDS = 1_000_000


def swiglu_middle_dim(n_embd: int) -> int:
    """The m whose three d·m matrices hold GELU's 8d² most nearly: 8d/3 rounded."""
    return round(8 * n_embd / 3)


def build_model(n_layers: int = 1, n_embd: int = 64, n_head: int = 4, norm: str = "layernorm",
                ffn: str = "gelu", positions: str = "learned", n_kv_heads: int | None = None,
                middle_dim: int | None = None, init: str = "xavier", seed: int = 0,
                embedding_std: float | None = None):
    """A llama_ref.DecoderLM for the city language in float32, no dropout, a table of SEQ_LEN
    positions if positions="learned"; weights drawn by city_train.initialise(init, embedding_std)
    after seeding torch with `seed`. Sinusoidal positions want embedding_std=1: their table's
    entries are ±1 in size and would drown tokens drawn at the init's 0.02 (the original Transformer
    scales its embeddings by √d for this)."""
    if n_kv_heads is not None and (n_kv_heads < 1 or n_head % n_kv_heads):
        raise ValueError(f"n_head ({n_head}) must be a multiple of n_kv_heads ({n_kv_heads}); "
                         "pass a divisor of n_head, or None for one KV head per query head")
    if n_embd % n_head:
        raise ValueError(f"n_embd ({n_embd}) must be a multiple of n_head ({n_head})")
    torch.manual_seed(seed)
    model = llama_ref.DecoderLM(V, n_embd, n_head, n_positions=SEQ_LEN, n_layers=n_layers,
                                p_dropout=0.0, norm=norm, ffn=ffn, positions=positions,
                                n_kv_heads=n_kv_heads, middle_dim=middle_dim).float()
    return city_train.initialise(model, init, embedding_std)


def parameter_count(settings: dict) -> int:
    # torch's generator left as it was (a meta-device build would draw nothing, but its first
    # use costs 3 s of CPU)
    with torch.random.fork_rng(devices=[]):
        model = llama_ref.DecoderLM(V, settings["n_embd"], settings["n_head"], SEQ_LEN,
                                    **{k: v for k, v in settings.items()
                                       if k not in ("n_embd", "n_head", "seed", "init",
                                                    "embedding_std")})
    return sum(p.numel() for p in model.parameters())


def ladder(n_layers: int, n_embd: int, n_head: int, n_kv_heads: int) -> list[tuple[str, dict]]:
    """[(rung, build_model's settings)]: GPT, then each rung adds one change to the one before."""
    gpt = dict(n_layers=n_layers, n_embd=n_embd, n_head=n_head)
    rmsnorm = dict(gpt, norm="rmsnorm")
    swiglu = dict(rmsnorm, ffn="swiglu", middle_dim=swiglu_middle_dim(n_embd))
    rope = dict(swiglu, positions="rope")
    gqa = dict(rope, n_kv_heads=n_kv_heads)
    # each extra hidden unit of SwiGLU holds 3d parameters
    saved = parameter_count(rope) - parameter_count(gqa)
    gqa["middle_dim"] += round(saved / (3 * n_embd))
    return list(zip(RUNGS, (gpt, rmsnorm, swiglu, rope, gqa)))


@functools.lru_cache(maxsize=None)
def long_windows(seq_len: int, n_windows: int = N_TEST):
    """n_windows fresh windows of seq_len targets with their exact probabilities (a CityBatch):
    the bound is exact at any length, since city_lab knows p(next token | every token before)."""
    # cached: shared by every caller, so read-only as the test set is
    return city_lab._read_only(
        sample(n_windows, np.random.default_rng([TEST_SEED, LONG_STREAM, seq_len]), seq_len))


def pooled_kv_heads(model, settings: dict, n_kv_heads: int):
    """A copy of the multi-head `model` (built from `settings`) with n_kv_heads KV heads: each
    group's K and V heads mean-pooled into one (Ainslie et al. 2023), all else copied."""
    n_head, head_dim = settings["n_head"], settings["n_embd"] // settings["n_head"]
    if settings.get("n_kv_heads") not in (None, n_head):
        raise ValueError("pooled_kv_heads converts a multi-head model (n_kv_heads None or n_head)")
    converted = build_model(**dict(settings, n_kv_heads=n_kv_heads))
    state = {}
    for name, value in model.state_dict().items():
        if ".k_projection." in name or ".v_projection." in name:
            # (..., h·Dh) -> (..., n_kv, h/n_kv, Dh) -> mean over the group -> (..., n_kv·Dh)
            grouped = value.reshape(*value.shape[:-1], n_kv_heads, n_head // n_kv_heads, head_dim)
            value = grouped.mean(-2).reshape(*value.shape[:-1], n_kv_heads * head_dim)
        state[name] = value
    converted.load_state_dict(state)
    return converted


def run(model: dict, training: dict, long_lengths=(), long_count: int = N_TEST, convert_to=(),
        uptrain_steps: int = 0, uptrain_lr: float = 3e-3) -> dict:
    """Train build_model(**model) by city_train.train(**training) and score it: see the module's
    docstring. The uptraining after a conversion: uptrain_steps at uptrain_lr decaying linearly to
    0, on batches the base run never saw."""
    if long_count < 1 or any(length < 1 for length in long_lengths):
        raise ValueError(f"run: long_count and every long length must be at least 1, got "
                         f"long_count={long_count}, long_lengths={list(long_lengths)}")
    net = build_model(**model)
    trained = city_train.train(net, **training)
    result = dict(excess=trained.final_excess, long_excess={}, refusal=None, converted={})
    try:
        for length in long_lengths:
            result["long_excess"][length] = city_train.evaluate(
                net, long_windows(length, long_count))
    except ValueError as refusal:   # a table of SEQ_LEN positions has no row for position 32
        result["refusal"] = str(refusal)
    settings = {k: v for k, v in model.items() if k != "seed"}
    for n_kv_heads in convert_to:
        converted = pooled_kv_heads(net, settings, n_kv_heads)
        right_after = city_train.evaluate(converted)
        uptrained = city_train.train(converted, steps=uptrain_steps, lr=uptrain_lr,
                                     schedule="linear", eval_every=None,
                                     batch_size=training.get("batch_size", 8),
                                     seed=training.get("seed", 0) + UPTRAIN_SEEDS)
        result["converted"][n_kv_heads] = (right_after, uptrained.final_excess)
    return result


def run_steps(model: dict, training: dict, convert_to=(), uptrain_steps: int = 0,
              **settings_without_steps) -> int:
    """The training steps run(...) takes: the run's, then uptrain_steps for each conversion; what
    the progress bar counts (runner.map's steps)."""
    return city_train.training_steps(training) + uptrain_steps * len(convert_to)


def planned(runs: list) -> tuple:
    """(function, [arguments]) that run_many(runs) hands runner.map: what a script passes
    common.main's train_ahead, so that the runs start before the part that asks for them."""
    return run, list(runs)


def run_many(runs: list) -> list:
    """[run(**r) for r in runs]: the same results in the same order, the runs side by side on the
    machine's cores (runner.py), each once per process."""
    return runner.map(run, runs, steps=run_steps)
