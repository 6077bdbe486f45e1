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
    # checkpoint averaging scored in the run: the excess of the mean of the weights after each list
    result = run(model=dict(n_layers=1), training=dict(averages=[[300, 350, 400], [400]]))
    result.averaged_excess                     # {(300, 350, 400): excess, (400,): excess}

Every run uses one torch thread (threads.py says why), and this module is the one place that
enforces it for training: a run gives the same bits alone, in a loop or in another process
(runner.py decides where).
"""
from __future__ import annotations

from lecture06 import threads  # first: one BLAS thread, set before numpy loads

import copy
import functools
import inspect
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch.optim.adam import adam

from lecture06 import city_stack, progress, runner, torch_ref
from lecture06.city_lab import (SEQ_LEN, V, CityBatch, excess_mnats, test_excess_mnats,
                                test_set, training_batches)

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
    if n_embd % n_head:
        raise ValueError(f"n_embd ({n_embd}) must be a multiple of n_head ({n_head})")
    torch.manual_seed(seed)
    model = torch_ref.DecoderLM(V, n_embd, n_head, n_positions=SEQ_LEN, n_layers=n_layers,
                                p_dropout=0.0, pre_ln=pre_ln).float()
    return initialise(model, init, embedding_std)


def initialise(model, init: str = "xavier", embedding_std: float | None = None):
    """Draw `model`'s Linear weights and embeddings in place by `init` (see build_model), from
    torch's global generator; city_llama.py's LLaMA-style models are drawn by the same rule."""
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
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
    averaged_excess  {steps (a tuple): excess} for each list of steps in `averages`: the test
                  excess of the element-wise average of the weights after those steps (checkpoint
                  averaging, notes §7.6; one step: that checkpoint's own excess), scored in the
                  run, so that it sends back numbers, not checkpoints; inf where the run ended
                  before
    """
    final_excess: float
    best_excess: float
    curve: list
    train_excess: list
    checkpoints: list
    averaged_excess: dict


def lr_factor(step: int, steps: int, warmup: int, schedule: str) -> float:
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


def evaluate(model, batch: CityBatch | None = None) -> float:
    """The model's test excess in mnat/token (eval mode, no gradients; the model's mode is
    restored); given a batch (windows of another length, say), its excess on that batch."""
    was_training = model.training
    model.eval()
    inputs = _test_inputs() if batch is None else torch.tensor(batch.x)
    with torch.no_grad(), threads.torch_threads(1):
        # (B, S, V)
        log_probs = torch.log_softmax(model(inputs).double(), dim=-1)
    model.train(was_training)
    if not torch.isfinite(log_probs).all():
        return math.inf  # the weights have overflowed: no finite excess to report
    if batch is None:
        return test_excess_mnats(log_probs.numpy())
    return excess_mnats(log_probs.numpy(), batch)


def average_state_dicts(state_dicts: list) -> dict:
    """The element-wise mean of several state_dicts of one model (checkpoint averaging, notes
    §7.6)."""
    if not state_dicts:
        raise ValueError("average_state_dicts needs at least one state_dict")
    return {name: sum(sd[name] for sd in state_dicts) / len(state_dicts) for name in state_dicts[0]}


def score_averages(model, kept: dict, averages) -> dict:
    """{steps (a tuple): the test excess of the average of the weights kept after those steps}
    ({step: state dict}), scored on `model`, whose weights they replace; inf where a step was never
    reached."""
    excess = {}
    for steps in map(tuple, averages):
        if all(step in kept for step in steps):
            model.load_state_dict(average_state_dicts([kept[step] for step in steps]))
            excess[steps] = evaluate(model)
        else:
            excess[steps] = math.inf
    return excess


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


# train()'s arguments: a run's `training` dict holds these and its seed
TRAINING = ("steps", "lr", "warmup", "schedule", "batch_size", "eval_every", "checkpoint_every",
            "averages")


def check_training(steps: int, lr: float, warmup: int, schedule: str, eval_every, averages=()):
    """A clear error for training arguments train() cannot use."""
    if any(not group or not all(isinstance(s, int) and 1 <= s <= steps for s in group)
           for group in averages):
        raise ValueError(f"averages: each is a non-empty list of steps in 1..{steps} (the weights "
                         f"after those updates are averaged), got {averages!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if (steps < 1 or not 0 <= warmup <= steps or (eval_every is not None and eval_every < 1)
            or lr <= 0):
        raise ValueError("need steps >= 1, 0 <= warmup <= steps, eval_every >= 1 (or None) and lr "
                         f"> 0; got steps={steps}, warmup={warmup}, eval_every={eval_every}, "
                         f"lr={lr}")


def train(model, steps: int = 400, lr: float = 1e-3, warmup: int = 0, schedule: str = "constant",
          batch_size: int = 8, seed: int = 0, eval_every: int | None = 50,
          checkpoint_every: int | None = None, averages=()) -> TrainResult:
    """Train `model` in place with Adam on training_batches(seed, batch_size) and score it on the
    test set.

    lr is the peak learning rate; warmup and schedule as in lr_factor. eval_every: test excess
    every this many steps (and at step 0 and the last step); None: after the last step only (one
    pass over the test set costs about ten training steps). A step whose loss is not finite ends the
    run; its remaining excesses are inf. averages: lists of steps; see TrainResult.averaged_excess.
    """
    check_training(steps, lr, warmup, schedule, eval_every, averages)
    kept_steps = {step for group in averages for step in group}
    with threads.torch_threads(1):  # the bits of a run must not depend on the machine's core count
        model.train()
        optimizer = Adam(model.parameters(), lr=lr)
        batches = training_batches(seed, batch_size)
        curve = [(0, None, evaluate(model))] if eval_every else []
        train_excess, checkpoints, since_eval, kept = [], [], [], {}
        for step in range(steps):
            batch = next(batches)
            optimizer.lr = lr * lr_factor(step, steps, warmup, schedule)
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
            progress.report_steps(1)
            done = step + 1
            if (eval_every and done % eval_every == 0) or done == steps:
                test_excess = evaluate(model)
                curve.append((done, float(np.mean(since_eval)), test_excess))
                since_eval = []
            if checkpoint_every and done % checkpoint_every == 0:
                checkpoints.append((done,
                                    {k: v.detach().clone() for k, v in model.state_dict().items()}))
            if done in kept_steps:
                kept[done] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        # a copy scores the averages: `model` keeps its trained weights
        averaged = score_averages(copy.deepcopy(model), kept, averages)
    final = curve[-1][2]
    return TrainResult(final_excess=final, best_excess=min(c[2] for c in curve), curve=curve,
                       train_excess=train_excess, checkpoints=checkpoints,
                       averaged_excess=averaged)


def run(model: dict, training: dict) -> TrainResult:
    """One run from build_model's and train()'s arguments, as train_many trains it (a stack of one:
    the same bits as inside any stack). Each dict carries its own seed: model["seed"] draws the
    initial weights, training["seed"] the batches."""
    seeds = (model.get("seed", 0), training.get("seed", 0))
    return train_stack(_without_seed(model), _without_seed(training), [seeds])[0]


class _Run:
    """What train_stack records for one run of its stack, as train() records it for a lone run."""

    def __init__(self, eval_every):
        self.alive, self.eval_every = True, eval_every
        self.curve, self.train_excess, self.since_eval, self.checkpoints = [], [], [], []
        self.kept, self.averaged_excess = {}, {}   # {step: weights} for `averages`, their scores

    def result(self) -> TrainResult:
        return TrainResult(final_excess=self.curve[-1][2],
                           best_excess=min(c[2] for c in self.curve), curve=self.curve,
                           train_excess=self.train_excess, checkpoints=self.checkpoints,
                           averaged_excess=self.averaged_excess)


def evaluate_stack(stack, models: list) -> list[float]:
    """Each run's test excess, scored by evaluate() on a lone model (`models`, one per run, get
    the run's weights): the same bits as scoring a checkpoint of the run later."""
    for model, state in zip(models, stack.state_dicts()):
        model.load_state_dict(state)
    return [evaluate(model) for model in models]


def _record_losses(runs: list, losses: list, batches: list, step: int) -> bool:
    """Each live run's training excess at this step, as train() records it; a run whose loss is
    not finite ends here. Whether any run is still alive."""
    for run_, loss, batch in zip(runs, losses, batches):
        if run_.alive and not math.isfinite(loss):
            run_.alive = False
            run_.curve.append((step + 1, math.inf, math.inf))
        elif run_.alive:
            run_.train_excess.append(1000.0 * (loss - batch.entropy))
            run_.since_eval.append(run_.train_excess[-1])
    return any(run_.alive for run_ in runs)


def _keep_weights(runs: list, stack, done: int, checkpoint_every, kept_steps: set):
    """After step `done`, each live run's weights as a checkpoint (every checkpoint_every steps)
    and for the averages that take this step (kept_steps)."""
    if checkpoint_every and done % checkpoint_every == 0:
        for run_, state in zip(runs, stack.state_dicts()):
            if run_.alive:
                run_.checkpoints.append((done, state))
    if done in kept_steps:
        for run_, state in zip(runs, stack.state_dicts()):
            if run_.alive:
                run_.kept[done] = state


def train_stack(model: dict, training: dict, seeds: list) -> list:
    """[run(model=dict(model, seed=m), training=dict(training, seed=b)) for (m, b) in seeds], the
    runs trained side by side as one city_stack.StackedDecoderLM -> [TrainResult] in that order.

    A seed is an int (it draws both the weights and the batches, as in scripts 04 and 05) or a pair
    (weights seed, batches seed). `training` takes train()'s arguments but its seed. A run whose
    loss stops being finite ends there, as in train(), and the others go on: nothing mixes the
    runs, so each gets the same bits whichever runs share its stack.
    """
    if not seeds:
        raise ValueError("train_stack: no seeds; give one or more (an int, or a pair "
                         "(weights seed, batches seed)) per run")
    pairs = [tuple(s) if isinstance(s, (tuple, list)) else (s, s) for s in seeds]
    unknown = set(training) - set(TRAINING)
    if unknown:
        raise ValueError(f"train_stack: unknown training arguments {sorted(unknown)}; it takes "
                         f"{list(TRAINING)} (each run's seed comes from `seeds`)")
    settings = dict(inspect.signature(train).parameters)
    steps, lr, warmup, schedule, batch_size, eval_every, checkpoint_every, averages = (
        training.get(name, settings[name].default) for name in TRAINING)
    check_training(steps, lr, warmup, schedule, eval_every, averages)
    kept_steps = {step for group in averages for step in group}
    with threads.torch_threads(1):
        models = [build_model(**dict(model, seed=m)) for m, _ in pairs]
        stack = city_stack.StackedDecoderLM(models)
        optimizer = Adam(stack.parameters(), lr=lr)
        streams = [training_batches(b, batch_size) for _, b in pairs]
        runs = [_Run(eval_every) for _ in pairs]
        if eval_every:
            for run_, excess in zip(runs, evaluate_stack(stack, models)):
                run_.curve.append((0, None, excess))
        for step in range(steps):
            batches = [next(stream) for stream in streams]
            x = torch.from_numpy(np.stack([b.x for b in batches]))             # (E, B, S)
            y = torch.from_numpy(np.stack([b.y for b in batches]))             # (E, B, S)
            optimizer.lr = lr * lr_factor(step, steps, warmup, schedule)
            losses = city_stack.losses(stack(x), y.view(len(runs), -1))        # (E,)
            if not _record_losses(runs, losses.tolist(), batches, step):
                break
            optimizer.zero_grad()
            losses.sum().backward()   # each run's gradient is its own loss's: d(sum)/d(loss) = 1
            optimizer.step()
            progress.report_steps(len(runs))
            done = step + 1
            if (eval_every and done % eval_every == 0) or done == steps:
                for run_, excess in zip(runs, evaluate_stack(stack, models)):
                    if run_.alive:
                        run_.curve.append((done, float(np.mean(run_.since_eval)), excess))
                        run_.since_eval = []
            _keep_weights(runs, stack, done, checkpoint_every, kept_steps)
        for run_, model in zip(runs, models):
            run_.averaged_excess = score_averages(model, run_.kept, averages)
    return [run_.result() for run_ in runs]


# How many runs share a stack. On 04's model a stack of 10 costs what one of 5 costs per run-step,
# within 2% (DEVELOPING.md), and it is one process: 10 seeds in two stacks of 5 keep two cores busy.
STACK_SIZE = 5


def _without_seed(settings: dict) -> dict:
    return {name: value for name, value in settings.items() if name != "seed"}


def _stacks(runs: list) -> tuple[list, list]:
    """The stacks train_many trains `runs` in: runs that differ only in their seeds, in their
    order, STACK_SIZE at a time -> ([dict(model=..., training=..., seeds=[(m, b), ...])], for each
    run (its stack, its place in the stack))."""
    groups, members = {}, []
    for r in runs:
        if not isinstance(r, dict) or set(r) != {"model", "training"}:
            raise ValueError(f"a run is dict(model=..., training=...), got {r!r}")
        model, training = _without_seed(r["model"]), _without_seed(r["training"])
        seeds = groups.setdefault(repr((sorted(model.items()), sorted(training.items()))),
                                  (model, training, []))[2]
        members.append((len(groups) - 1, len(seeds)))
        seeds.append((r["model"].get("seed", 0), r["training"].get("seed", 0)))
    stacks, first_stack = [], []
    for model, training, seeds in groups.values():
        first_stack.append(len(stacks))
        stacks += [dict(model=model, training=training, seeds=seeds[i:i + STACK_SIZE])
                   for i in range(0, len(seeds), STACK_SIZE)]
    return stacks, [(first_stack[g] + m // STACK_SIZE, m % STACK_SIZE) for g, m in members]


def training_steps(training: dict) -> int:
    """The steps train(**training) or a run of train_stack takes (its default: train's)."""
    return training.get("steps", inspect.signature(train).parameters["steps"].default)


def stack_steps(model: dict, training: dict, seeds: list) -> int:
    """The steps train_stack(model, training, seeds) trains, its runs' together (5 runs of 400
    steps: 2,000): what the progress bar counts (runner.map's steps)."""
    return training_steps(training) * len(seeds)


def planned(runs: list) -> tuple:
    """(function, [arguments]) that train_many(runs) hands runner.map: what a script passes
    common.main's train_ahead, so that the runs start before the part that asks for them."""
    return train_stack, _stacks(runs)[0]


def train_many(runs: list) -> list:
    """[run(**r) for r in runs], each r = dict(model=..., training=...): the same results in the
    same order, trained in stacks of runs that differ only in their seeds (city_stack.py), the
    stacks side by side on the machine's cores (runner.py), each once per process."""
    stacks, members = _stacks(runs)
    trained = runner.map(train_stack, stacks, steps=stack_steps)
    return [trained[stack][place] for stack, place in members]
