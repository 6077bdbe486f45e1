"""Central-difference gradient checks on every element, in float64.

`check_gradients(f, leaves)`: f() builds an output Tensor from the leaves (Tensors with
requires_grad=True, perturbed in place). The analytic gradient is f().backward(R) for a fixed random
R; the numeric one is Σ (f(x+h) - f(x-h))·R / 2h, computed with numpy only (differences taken
before summing, so outputs that do not move cancel exactly), so the check trusts no primitive.
Every element of every leaf is compared.
"""
import numpy as np

H = 1e-5          # ~ eps^(1/3): truncation (h²) and rounding (eps/h) errors both ~1e-11
RTOL = 1e-6


def relative_error(analytic: np.ndarray, numeric: np.ndarray, floor: float) -> float:
    """max over elements of |a - n| / max(|a|, |n|, floor)."""
    denominator = np.maximum(np.maximum(np.abs(analytic), np.abs(numeric)), floor)
    return float(np.max(np.abs(analytic - numeric) / denominator)) if analytic.size else 0.0


def check_gradients(f, leaves, rtol: float = RTOL, seed: int = 0):
    """Assert every element's analytic gradient matches central differences; returns the worst error.

    Rounding limits a central difference to about eps·max|f·R|/h absolute, so gradients smaller than
    that over rtol (the floor, ~1e-5·max|f·R|) are compared with that absolute tolerance instead.
    """
    for leaf in leaves:
        leaf.grad = None
    out = f()
    weights = np.random.default_rng(seed).uniform(0.5, 1.5, out.shape) * \
        np.random.default_rng(seed + 1).choice([-1.0, 1.0], out.shape)
    out.backward(weights)

    floor = 4 * np.finfo(np.float64).eps * max(float(np.max(np.abs(out.data * weights))), 1e-300) / (H * rtol)

    worst = 0.0
    for k, leaf in enumerate(leaves):
        assert leaf.grad is not None, f"leaf {k} of shape {leaf.shape} received no gradient"
        assert leaf.grad.shape == leaf.shape, f"leaf {k}: grad shape {leaf.grad.shape} != {leaf.shape}"
        numeric = np.empty(leaf.shape)
        for index in np.ndindex(*leaf.shape):
            old = leaf.data[index]
            leaf.data[index] = old + H
            plus = f().data.copy()             # copy: f may return a view of the leaf
            leaf.data[index] = old - H
            minus = f().data.copy()
            leaf.data[index] = old
            numeric[index] = np.sum((plus - minus) * weights) / (2 * H)
        error = relative_error(leaf.grad, numeric, floor)
        assert error <= rtol, (f"leaf {k} of shape {leaf.shape}: relative error {error:.2e} > {rtol:.0e}\n"
                               f"analytic\n{leaf.grad}\nnumeric\n{numeric}")
        worst = max(worst, error)
    return worst
