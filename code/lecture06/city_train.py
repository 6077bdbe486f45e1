"""Training small Transformers on the city language (city_lab.py) and scoring them against its exact
bound.

Scripts 04 and 05 train with this harness (notes §5.4, §7.6): torch_ref.DecoderLM in float32 (the
PyTorch twin of transformer.py's model, for speed), Adam on fresh batches of the city language, and
the test excess in milli-nats per token over the exact lower bound that only a known language gives.

    # seed: the initial weights
    model = build_model(n_layers=6, pre_ln=False, init="xavier", seed=0)
    result = train(model, steps=400, lr=6e-3, warmup=100, seed=0)        # seed: the batches
    result.final_excess, result.best_excess, result.curve                # mnat/token over the bound
    # the two lines in one
    result = run(model=dict(n_layers=2, seed=0), training=dict(lr=1e-3, seed=0))
    results = train_many([dict(model=..., training=...), ...])           # run() each, in order

Every run uses one torch thread (threads.py says why), and this module is the one place that
enforces it for training: a run gives the same bits alone, in a loop or in another process
(runner.py decides where).
"""
from __future__ import annotations

import threads  # first: one BLAS thread, set before numpy loads

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.optim.adam import adam

import runner
import torch_ref
from city_lab import SEQ_LEN, V, test_excess_mnats, test_set, training_batches

INITS = ("xavier", "gpt2", "default")
SCHEDULES = ("constant", "linear", "cosine")


def build_model(n_layers: int = 6, n_embd: int = 64, n_head: int = 4, pre_ln: bool = True,
                init: str = "xavier", seed: int = 0, embedding_std: float | None = None):
    """A torch_ref.DecoderLM for the city language in float32: no dropout, learned positions.

    init:  "xavier"   Xavier-uniform Linear weights, zero biases, embeddings N(0, 0.02²): the
                      original Transformer's. Every branch then starts about as large as the
                      residual stream.
           "gpt2"     N(0, 0.02²) for every Linear weight and embedding, zero biases (GPT-2 without
                      its 1/√(2L) scaling of the residual projections).
           "default"  torch_ref's own init, which is PyTorch's: Linear U(±1/√fan_in), embeddings
                      N(0, 1).
    seed:  seeds torch's global generator before the parameters are drawn.
    embedding_std: the token and position embeddings' N(0, std²) instead of the init's (04 part 3
           asks what the small 0.02 does to the first layer's gradient).
    """
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    if n_embd % n_head:
        raise ValueError(f"n_embd ({n_embd}) must be a multiple of n_head ({n_head})")
    torch.manual_seed(seed)
    model = torch_ref.DecoderLM(V, n_embd, n_head, n_positions=SEQ_LEN, n_layers=n_layers,
                                p_dropout=0.0, pre_ln=pre_ln).float()
    if init != "default" or embedding_std is not None:
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, torch_ref.Linear) and init != "default":
                    if init == "xavier":
                        # symmetric in fan_in, fan_out
                        torch.nn.init.xavier_uniform_(module.weights)
                    else:
                        module.weights.normal_(0.0, 0.02)
                    if module.bias is not None:
                        module.bias.zero_()
                elif isinstance(module, torch_ref.Embedding):
                    module.weights.normal_(0.0, 0.02 if embedding_std is None else embedding_std)
    return model


@dataclass
class TrainResult:
    """What train() returns. Excesses are test cross-entropy minus the bound, in mnat/token.

    final_excess  on the test set after the last step
    best_excess   the lowest test excess of the evaluation points (the last step included)
    curve         [(step, train_excess, test_excess)] at every evaluation point: step 0 (before
                  training, train_excess None), every eval_every steps, the last step; train_excess
                  is the mean batch excess over the steps since the previous point
    train_excess  the excess of every step's batch, before that step's update (fresh data, so held
                  out)
    checkpoints   [(step, state_dict copy)] every checkpoint_every steps (none if checkpoint_every
                  is None)
    """
    final_excess: float
    best_excess: float
    curve: list
    train_excess: list
    checkpoints: list


def _lr_factor(step: int, steps: int, warmup: int, schedule: str) -> float:
    """The lr of update `step` (0-based) as a fraction of the peak: linear warmup over `warmup`
    updates (the first one at peak/warmup, not 0), then constant, linear decay to 0 or cosine decay
    to 0."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    if schedule == "linear":
        return 1.0 - progress
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


@functools.lru_cache(maxsize=None)
def _test_inputs():
    return torch.tensor(test_set().x)  # a writable copy: torch warns on read-only numpy arrays


def evaluate(model) -> float:
    """The model's test excess in mnat/token (eval mode, no gradients; the model's mode is
    restored)."""
    was_training = model.training
    model.eval()
    with torch.no_grad(), threads.torch_threads(1):
        # (N_TEST, SEQ_LEN, V)
        log_probs = torch.log_softmax(model(_test_inputs()).double(), dim=-1)
    model.train(was_training)
    if not torch.isfinite(log_probs).all():
        return math.inf  # the weights have overflowed: no finite excess to report
    return test_excess_mnats(log_probs.numpy())


def average_state_dicts(state_dicts: list) -> dict:
    """The element-wise mean of several state_dicts of one model (checkpoint averaging, notes
    §7.6)."""
    if not state_dicts:
        raise ValueError("average_state_dicts needs at least one state_dict")
    return {name: sum(sd[name] for sd in state_dicts) / len(state_dicts) for name in state_dicts[0]}


class Adam:
    """torch.optim.Adam(fused=True) without weight decay, bit for bit: its state and torch's own
    update function, torch.optim.adam.adam, which Adam.step calls. Building a torch.optim.Adam
    imports torch._dynamo (1.5 s of CPU) in every process that trains; this does not."""

    def __init__(self, parameters, lr: float, betas=(0.9, 0.999), eps: float = 1e-8):
        self.params = [p for p in parameters if p.requires_grad]
        self.lr, (self.beta1, self.beta2), self.eps = lr, betas, eps
        self.exp_avgs = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sqs = [torch.zeros_like(p) for p in self.params]
        # as torch.optim keeps them
        self.steps = [torch.zeros((), dtype=torch.float32) for _ in self.params]

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        adam(self.params, [p.grad for p in self.params], self.exp_avgs, self.exp_avg_sqs, [],
             self.steps, fused=True, amsgrad=False, beta1=self.beta1, beta2=self.beta2, lr=self.lr,
             weight_decay=0.0, eps=self.eps, maximize=False)


def train(model, steps: int = 400, lr: float = 1e-3, warmup: int = 0, schedule: str = "constant",
          batch_size: int = 8, seed: int = 0, eval_every: int | None = 50,
          checkpoint_every: int | None = None) -> TrainResult:
    """Train `model` in place with Adam on training_batches(seed, batch_size) and score it on the
    test set.

    lr is the peak learning rate; warmup and schedule as in _lr_factor. eval_every: test excess
    every this many steps (and at step 0 and the last step); None: after the last step only (one
    pass over the test set costs about ten training steps). A step whose loss is not finite ends the
    run; its remaining excesses are inf.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if (steps < 1 or not 0 <= warmup <= steps or (eval_every is not None and eval_every < 1)
            or lr <= 0):
        raise ValueError("need steps >= 1, 0 <= warmup <= steps, eval_every >= 1 (or None) and lr "
                         f"> 0; got steps={steps}, warmup={warmup}, eval_every={eval_every}, "
                         f"lr={lr}")
    with threads.torch_threads(1):  # the bits of a run must not depend on the machine's core count
        model.train()
        optimizer = Adam(model.parameters(), lr=lr)
        batches = training_batches(seed, batch_size)
        curve = [(0, None, evaluate(model))] if eval_every else []
        train_excess, checkpoints, since_eval = [], [], []
        for step in range(steps):
            batch = next(batches)
            optimizer.lr = lr * _lr_factor(step, steps, warmup, schedule)
            logits = model(torch.from_numpy(batch.x))  # (B, S, V)
            loss = F.cross_entropy(logits.reshape(-1, V), torch.from_numpy(batch.y).reshape(-1))
            if not torch.isfinite(loss):
                curve.append((step + 1, math.inf, math.inf))
                break
            excess = 1000.0 * (loss.item() - batch.entropy)
            train_excess.append(excess)
            since_eval.append(excess)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done = step + 1
            if (eval_every and done % eval_every == 0) or done == steps:
                test_excess = evaluate(model)
                curve.append((done, float(np.mean(since_eval)), test_excess))
                since_eval = []
            if checkpoint_every and done % checkpoint_every == 0:
                checkpoints.append((done,
                                    {k: v.detach().clone() for k, v in model.state_dict().items()}))
    final = curve[-1][2]
    return TrainResult(final_excess=final, best_excess=min(c[2] for c in curve), curve=curve,
                       train_excess=train_excess, checkpoints=checkpoints)


def run(model: dict, training: dict) -> TrainResult:
    """train(build_model(**model), **training): one run from build_model's and train()'s arguments.

    Each dict carries its own seed: model["seed"] draws the initial weights, training["seed"] the
    batches.
    """
    return train(build_model(**model), **training)


def train_many(runs: list) -> list:
    """[run(**r) for r in runs], each r = dict(model=..., training=...): the same results in the
    same order, computed by runner.py (side by side on the machine's cores, each once per
    process)."""
    return runner.map(run, runs)
