"""Optimizers and the paper's learning rate (notes §7.5): SGD, Adam, noam_lr.

Each updates the Parameters of a transformer.py model in place from their `.grad`, in numpy: an
update is not part of the graph, so no autodiff is needed. Adam follows torch.optim.Adam's order of
operations, so that our model and its PyTorch twin (torch_ref.py) stay within rounding of each
other step after step.
"""
from __future__ import annotations

import math

import numpy as np


def parameter_list(owner: str, parameters) -> list:
    """The Parameters an optimizer updates, as a list. A model given whole would fail with
    "'DecoderLM' object is not iterable", which says nothing of what to pass."""
    if callable(getattr(parameters, "parameters", None)):
        raise TypeError(f"{owner}: pass model.parameters(), not the {type(parameters).__name__} "
                        f"itself: an optimizer updates a list of Parameters")
    try:
        return list(parameters)
    except TypeError:   # a lone Parameter or a number: the cause is here, not in iteration
        raise TypeError(f"{owner}: parameters must be an iterable of Parameters, such as "
                        f"model.parameters(), got a {type(parameters).__name__}") from None


class SGD:
    """Plain gradient descent, for the smallest demos."""

    def __init__(self, parameters, lr: float):
        if not lr > 0:
            raise ValueError(f"SGD: lr must be > 0, got {lr}")
        self.parameters, self.lr = parameter_list("SGD", parameters), lr

    def step(self):
        for p in self.parameters:
            if p.grad is not None:
                p.data -= self.lr * p.grad


class Adam:
    """Adam with bias correction, updating parameters in place (matches torch.optim.Adam)."""

    def __init__(self, parameters, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8):
        if not lr > 0:
            raise ValueError(f"Adam: lr must be > 0, got {lr}")
        if len(betas) != 2 or not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"Adam: betas must be two numbers in [0, 1), got {betas}")
        if not eps > 0:  # with eps = 0 a parameter whose gradient is exactly 0 would get 0/0 = nan
            raise ValueError(f"Adam: eps must be > 0, got {eps}")
        self.parameters = parameter_list("Adam", parameters)
        self.lr, self.betas, self.eps = lr, betas, eps
        self.m = [np.zeros_like(p.data) for p in self.parameters]
        self.v = [np.zeros_like(p.data) for p in self.parameters]
        self.t = 0

    def step(self):
        self.t += 1
        beta1, beta2 = self.betas
        step_size = self.lr / (1 - beta1 ** self.t)
        sqrt_correction2 = math.sqrt(1 - beta2 ** self.t)
        for p, m, v in zip(self.parameters, self.m, self.v):
            if p.grad is None:
                continue
            m *= beta1
            m += (1 - beta1) * p.grad
            v *= beta2
            v += (1 - beta2) * p.grad * p.grad
            # the same order of operations as torch.optim.Adam, so the twins stay within rounding
            p.data -= step_size * m / (np.sqrt(v) / sqrt_correction2 + self.eps)

    def zero_grad(self):
        for p in self.parameters:
            p.grad = None


def noam_lr(step, d_model: int = 512, warmup: int = 4000):
    """The paper's learning rate (notes §7.5): d_model^-0.5 · min(step^-0.5, step · warmup^-1.5).

    Rises linearly for `warmup` steps to its peak d_model^-0.5 · warmup^-0.5, then falls as 1/√step.
    step counts updates from 1: at step 0 the formula's step^-0.5 divides by zero, so the first
    update uses peak / warmup, not 0. step may be an int or an integer numpy array (for plots).
    """
    steps = np.asarray(step)
    if not np.issubdtype(steps.dtype, np.integer):
        kind = f"an array of {steps.dtype}" if steps.ndim else f"a {type(step).__name__}"
        raise TypeError(f"noam_lr: step must be an integer (it counts updates, from 1), "
                        f"got {step!r}, {kind}")
    if np.any(steps < 1):
        raise ValueError(f"noam_lr: step must be an integer >= 1 (the number of the update about "
                         f"to be made, counting from 1), got {step!r}; step^-0.5 is undefined at 0")
    steps = steps.astype(np.float64)
    lr = d_model ** -0.5 * np.minimum(steps ** -0.5, steps * warmup ** -1.5)
    return float(lr) if lr.ndim == 0 else lr
