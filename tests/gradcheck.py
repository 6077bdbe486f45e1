"""Central-difference gradient checks on every element, in float64.

`check_gradients(f, leaves)`: f() builds an output Tensor from the leaves (Tensors with
requires_grad=True, perturbed in place). The analytic gradient is f().backward(R) for a fixed random
R; the numeric one is the fourth-order central difference
    Σ [8(f(x+h) - f(x-h)) - (f(x+2h) - f(x-2h))]·R / 12h,
computed with numpy only (differences taken before summing, so outputs that do not move cancel
exactly), so the check trusts no primitive. Every element of every leaf is compared. The plain
(f(x+h) - f(x-h))/2h has a truncation error h²f'''/6 that a tiny LayerNorm (d = 4) pushes past 1e-6;
the fourth-order one's is h⁴f⁽⁵⁾/30, far below rounding.
"""
import numpy as np

from lecture05.tensor import Tensor, no_grad

H = 1e-4          # rounding ~eps/h ~ 2e-12; truncation ~h⁴ ~ 1e-16
RTOL = 1e-6
# tensor.py's 16 primitive kinds, as its op counter names them
PRIMITIVES = {"add", "sub", "mul", "div", "neg", "exp", "log", "sigmoid", "relu", "matmul", "sum",
              "max", "view", "permute", "contiguous", "embedding"}


def leaf(shape, layout="contiguous", seed=0, low=None, high=None):
    """A float64 leaf. layout="permuted": the same shape, but a transposed (non-contiguous) view."""
    rng = np.random.default_rng(seed)
    draw = (lambda s: rng.uniform(low, high, s)) if low is not None else rng.standard_normal
    if layout == "contiguous":
        data = draw(shape)
    else:
        data = draw(shape[::-1]).T                  # reversed axes: strides run backwards
        # 1-D or size-1 axes: every other element instead
        if data.flags["C_CONTIGUOUS"] and data.size > 1:
            data = draw(tuple(2 * s for s in shape))[tuple(slice(None, None, 2) for _ in shape)]
    t = Tensor(data, requires_grad=True)
    assert t.is_contiguous() == (layout == "contiguous" or t.data.size <= 1)
    return t


def relative_error(analytic: np.ndarray, numeric: np.ndarray, floor: float) -> float:
    """max over elements of |a - n| / max(|a|, |n|, floor)."""
    denominator = np.maximum(np.maximum(np.abs(analytic), np.abs(numeric)), floor)
    return float(np.max(np.abs(analytic - numeric) / denominator)) if analytic.size else 0.0


def check_gradients(f, leaves, rtol: float = RTOL, seed: int = 0):
    """Assert every element's analytic gradient matches
    central differences; returns the worst error.

    Rounding limits the difference to about 1.5·eps·max|f·R|/h absolute, so gradients smaller than
    that over rtol (the floor, ~1e-5·max|f·R|) are compared with that absolute tolerance instead.
    """
    for leaf in leaves:
        leaf.grad = None
    out = f()
    weights = np.random.default_rng(seed).uniform(0.5, 1.5, out.shape) * \
        np.random.default_rng(seed + 1).choice([-1.0, 1.0], out.shape)
    out.backward(weights)

    floor = (6 * np.finfo(np.float64).eps * max(float(np.max(np.abs(out.data * weights))), 1e-300)
             / (H * rtol))

    def shifted(leaf, index, step):
        old = leaf.data[index]
        leaf.data[index] = old + step
        with no_grad():   # the same values; no graph kept for a backward that never comes
            value = f().data.copy()          # copy: f may return a view of the leaf
        leaf.data[index] = old
        return value

    worst = 0.0
    for k, leaf in enumerate(leaves):
        assert leaf.grad is not None, f"leaf {k} of shape {leaf.shape} received no gradient"
        assert leaf.grad.shape == leaf.shape, \
            f"leaf {k}: grad shape {leaf.grad.shape} != {leaf.shape}"
        numeric = np.empty(leaf.shape)
        for index in np.ndindex(*leaf.shape):
            near = shifted(leaf, index, H) - shifted(leaf, index, -H)
            far = shifted(leaf, index, 2 * H) - shifted(leaf, index, -2 * H)
            numeric[index] = np.sum((8 * near - far) * weights) / (12 * H)
        error = relative_error(leaf.grad, numeric, floor)
        assert error <= rtol, (f"leaf {k} of shape {leaf.shape}: relative error {error:.2e} > "
                               f"{rtol:.0e}\nanalytic\n{leaf.grad}\nnumeric\n{numeric}")
        worst = max(worst, error)
    return worst
