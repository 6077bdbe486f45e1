"""Lecture 5's autodiff framework: a float64 Tensor over numpy with reverse-mode differentiation.

Lecture 6 builds every HW3 module (code/lecture06/transformer.py) from the primitives below and
nothing else, so this file is the whole engine: read it top to bottom once.

How it works (micrograd's design, with arrays):
- A Tensor wraps a float64 numpy array. Strides are numpy's own, so `permute` is zero-copy and
  `view` of a non-contiguous tensor fails exactly where PyTorch's does (notes §3.2).
- Each primitive computes its output with numpy and attaches a short `_backward` closure that
  adds the output's gradient, pushed through the local derivative, into its inputs' `.grad`.
- `backward()` sorts the graph topologically with an explicit stack (no recursion, so a chain of
  thousands of operations is fine) and runs the closures in reverse order. Gradients accumulate
  until `zero_grad`, so a tensor used twice receives both contributions. As in torch, a graph is
  backpropagated through once: the closures are released, and a second backward() through them
  is refused unless the first one was called with retain_graph=True.
- Every primitive call increments `OP_COUNTS[kind]`: each call would be one kernel launch on a
  GPU, which is what script 03 part 5 counts (notes §8.4).

The primitives (16): add, sub, mul, div, neg, exp, log, sigmoid, relu, matmul, sum, max (value
only, treated as a constant), view, permute, contiguous, embedding (gather; backward is scatter-add).
Softmax, GELU, 1/sqrt are compositions of these.
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

import numpy as np

DTYPE = np.float64
OP_COUNTS: Counter = Counter()


@contextmanager
def count_ops():
    """Count primitive calls inside the block: `with count_ops() as counts: ...` -> Counter by kind."""
    counts = Counter()
    before = OP_COUNTS.copy()
    try:
        yield counts
    finally:
        counts.update(OP_COUNTS - before)


_grad_enabled = True


@contextmanager
def no_grad():
    """Build no graph inside the block (evaluation, parameter updates)."""
    global _grad_enabled
    previous, _grad_enabled = _grad_enabled, False
    try:
        yield
    finally:
        _grad_enabled = previous


def _unbroadcast(grad: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum a broadcast gradient back down to an input's shape (in one reduction)."""
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(extra + i for i, size in enumerate(shape)
                                       if size == 1 and grad.shape[extra + i] != 1)
    return grad.sum(axis=axes).reshape(shape)


def _broadcasts(a: tuple, b: tuple) -> bool:
    """Whether shapes a and b broadcast (numpy's rule; in plain Python, as np.broadcast_shapes is slow)."""
    return a == b or all(x == y or x == 1 or y == 1 for x, y in zip(reversed(a), reversed(b)))


def _broadcast_shape(a: tuple, b: tuple, op: str):
    if not _broadcasts(a, b):
        raise ValueError(f"{op}: shapes {a} and {b} cannot broadcast; "
                         f"trailing dimensions must be equal or 1")


def _released(g):
    """Stands in for a backward closure that backward() has run and let go of (see backward)."""
    raise AssertionError("a released backward closure was called")


class Tensor:
    __array_priority__ = 1000  # so that `ndarray * Tensor` calls Tensor.__rmul__

    def __init__(self, data, requires_grad: bool = False, _parents: tuple = (), _op: str = ""):
        self.data = data if isinstance(data, np.ndarray) and data.dtype == DTYPE \
            else np.asarray(data, dtype=DTYPE)
        self.requires_grad = requires_grad
        self.grad = None
        self._parents = _parents
        self._op = _op
        self._backward = None
        self._grad_owned = False

    # ---- bookkeeping ------------------------------------------------------------------
    def __repr__(self):
        return f"Tensor(shape={self.shape}, op={self._op or 'leaf'})\n{self.data}"

    @property
    def shape(self) -> tuple:
        return self.data.shape

    @property
    def ndim(self) -> int:
        return self.data.ndim

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def stride(self) -> tuple:
        """Strides in elements, as torch reports them."""
        return tuple(s // self.data.itemsize for s in self.data.strides)

    def is_contiguous(self) -> bool:
        return self.data.flags["C_CONTIGUOUS"]

    def numpy(self) -> np.ndarray:
        return self.data

    def item(self) -> float:
        return float(self.data.item())  # .item(): numpy 2 refuses float() of a (1, 1) array

    def zero_grad(self):
        self.grad = None

    def detach(self) -> "Tensor":
        return Tensor(self.data)

    def __getstate__(self) -> dict:
        """A pickled tensor (a trained model sent home by a worker process) is its data and gradient; the
        graph that computed it, closures and all, stays behind, as it would after torch.save."""
        return {"data": self.data, "requires_grad": self.requires_grad, "grad": self.grad}

    def __setstate__(self, state: dict):
        Tensor.__init__(self, state["data"], requires_grad=state["requires_grad"])
        self.grad = state["grad"]

    def _accumulate(self, grad: np.ndarray):
        """Add a contribution to .grad. The first one is kept as is, without a copy (most tensors get
        just one); it may be shared with another tensor, so a second one makes a fresh sum rather
        than writing into it. backward() gives leaves a private copy at the end."""
        if self.grad is None:
            self.grad, self._grad_owned = grad, False
        elif self._grad_owned:
            self.grad += grad
        else:
            self.grad, self._grad_owned = self.grad + grad, True

    @staticmethod
    def _wrap(x) -> "Tensor":
        return x if isinstance(x, Tensor) else Tensor(x)

    def _result(self, data: np.ndarray, parents: tuple, op: str, backward) -> "Tensor":
        """Create an op's output; keep the graph only if some input needs a gradient."""
        OP_COUNTS[op] += 1
        needs_grad = _grad_enabled and any([p.requires_grad for p in parents])
        out = Tensor(data, requires_grad=needs_grad, _parents=parents if needs_grad else (), _op=op)
        if needs_grad:
            out._backward = backward  # called with out.grad; holds no reference to out, so no cycle
        return out

    # ---- the primitives ---------------------------------------------------------------
    def __add__(self, other) -> "Tensor":
        other = self._wrap(other)
        _broadcast_shape(self.shape, other.shape, "add")
        a, b = self, other

        def backward(g):
            if a.requires_grad:
                a._accumulate(_unbroadcast(g, a.shape))
            if b.requires_grad:
                b._accumulate(_unbroadcast(g, b.shape))
        return self._result(a.data + b.data, (a, b), "add", backward)

    def __mul__(self, other) -> "Tensor":
        other = self._wrap(other)
        _broadcast_shape(self.shape, other.shape, "mul")
        a, b = self, other

        def backward(g):
            if a.requires_grad:
                a._accumulate(_unbroadcast(g * b.data, a.shape))
            if b.requires_grad:
                b._accumulate(_unbroadcast(g * a.data, b.shape))
        return self._result(a.data * b.data, (a, b), "mul", backward)

    def __sub__(self, other) -> "Tensor":
        # a primitive rather than a + (-b), as in most frameworks: one launch instead of two
        other = self._wrap(other)
        _broadcast_shape(self.shape, other.shape, "sub")
        a, b = self, other

        def backward(g):
            if a.requires_grad:
                a._accumulate(_unbroadcast(g, a.shape))
            if b.requires_grad:
                b._accumulate(-_unbroadcast(g, b.shape))
        return self._result(a.data - b.data, (a, b), "sub", backward)

    def __truediv__(self, other) -> "Tensor":
        if not isinstance(other, Tensor):   # a constant: multiply by its reciprocal, no graph for it
            return self * (1.0 / other)
        _broadcast_shape(self.shape, other.shape, "div")
        a, b = self, other
        out_data = a.data / b.data

        def backward(g):
            if a.requires_grad:
                a._accumulate(_unbroadcast(g / b.data, a.shape))
            if b.requires_grad:
                b._accumulate(_unbroadcast(-g * out_data / b.data, b.shape))   # d(a/b)/db = -(a/b)/b
        return self._result(out_data, (a, b), "div", backward)

    def __neg__(self) -> "Tensor":
        a = self

        def backward(g):
            a._accumulate(-g)
        return self._result(-a.data, (a,), "neg", backward)

    def exp(self) -> "Tensor":
        a, out_data = self, np.exp(self.data)

        def backward(g):
            a._accumulate(g * out_data)
        return self._result(out_data, (a,), "exp", backward)

    def log(self) -> "Tensor":
        a = self
        if np.any(a.data < 0):
            raise ValueError(f"log: input of shape {a.shape} has entries < 0 "
                             f"(min {a.data.min():.3g}); log is real only for x >= 0")

        def backward(g):
            with np.errstate(divide="ignore"):
                a._accumulate(g / a.data)
        with np.errstate(divide="ignore"):  # log 0 = -inf, as in torch: logsumexp of an all -inf row needs it
            return self._result(np.log(a.data), (a,), "log", backward)

    def sigmoid(self) -> "Tensor":
        a = self
        # 1/(1 + e^-x) is accurate everywhere; for x < -709 e^-x overflows to inf and 1/inf = 0 is right.
        out_data = np.negative(a.data, out=np.empty_like(a.data))  # in place from here on (out= keeps 0-d arrays)
        with np.errstate(over="ignore"):
            np.exp(out_data, out=out_data)
        out_data += 1.0
        np.reciprocal(out_data, out=out_data)

        def backward(g):
            a._accumulate(g * out_data * (1.0 - out_data))
        return self._result(out_data, (a,), "sigmoid", backward)

    def relu(self) -> "Tensor":
        a = self

        def backward(g):
            a._accumulate(g * (a.data > 0))
        return self._result(np.maximum(a.data, 0.0), (a,), "relu", backward)

    def __matmul__(self, other) -> "Tensor":
        other = self._wrap(other)
        a, b = self, other
        if a.ndim < 2 or b.ndim < 2:
            raise ValueError(f"matmul: both inputs need at least 2 dimensions, got {a.shape} @ {b.shape}")
        if a.shape[-1] != b.shape[-2]:
            raise ValueError(f"matmul: shapes {a.shape} @ {b.shape} do not line up: "
                             f"the last dimension of the left ({a.shape[-1]}) must equal "
                             f"the second-to-last of the right ({b.shape[-2]})")
        if not _broadcasts(a.shape[:-2], b.shape[:-2]):
            raise ValueError(f"matmul: batch dimensions of {a.shape} and {b.shape} cannot broadcast")

        if b.ndim == 2 and a.ndim > 2:
            # (..., n, k) @ (k, m) as one (N, k) @ (k, m) product: one BLAS call instead of one per batch
            # entry, and the weight's gradient comes out summed over the batch with no (..., k, m) temporary
            rows_a = a.data.reshape(-1, a.shape[-1])

            def backward(g):
                rows_g = g.reshape(-1, g.shape[-1])
                if a.requires_grad:
                    a._accumulate((rows_g @ b.data.T).reshape(a.shape))
                if b.requires_grad:
                    b._accumulate(rows_a.T @ rows_g)
            out_data = (rows_a @ b.data).reshape(*a.shape[:-1], b.shape[-1])
            return self._result(out_data, (a, b), "matmul", backward)

        def backward(g):
            if a.requires_grad:
                a._accumulate(_unbroadcast(g @ np.swapaxes(b.data, -1, -2), a.shape))
            if b.requires_grad:
                b._accumulate(_unbroadcast(np.swapaxes(a.data, -1, -2) @ g, b.shape))
        return self._result(a.data @ b.data, (a, b), "matmul", backward)

    def sum(self, axis=None, keepdims: bool = False) -> "Tensor":
        a = self

        def backward(g):
            if axis is not None and not keepdims:
                g = np.expand_dims(g, axis)
            a._accumulate(np.broadcast_to(g, a.shape))
        return self._result(a.data.sum(axis=axis, keepdims=keepdims), (a,), "sum", backward)

    def max(self, axis=None, keepdims: bool = False, finite: bool = False) -> "Tensor":
        """The maximum's value as a constant (no gradient): softmax and logsumexp subtract it,
        and softmax(x - m) is the same for every m, so treating m as constant is exact (notes §9.1).

        finite=True gives 0 where the maximum is ±inf: any finite shift is exact, and an infinite one
        would turn inf - inf into nan (torch.logsumexp shifts the same way). The maximum of an empty
        row is -inf (numpy would raise), so a length-0 sequence goes through softmax as through torch."""
        OP_COUNTS["max"] += 1
        m = self.data.max(axis=axis, keepdims=keepdims, initial=-np.inf)
        return Tensor(np.where(np.isinf(m), 0.0, m) if finite else m)

    def view(self, *shape) -> "Tensor":
        a = self
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        if not a.is_contiguous():
            raise RuntimeError(f"view: tensor of shape {a.shape} with strides {a.stride()} is not "
                               f"contiguous (was it permuted?); call .contiguous() first, "
                               f"which copies it once")
        try:
            out_data = a.data.reshape(shape)
        except ValueError:
            raise ValueError(f"view: cannot view a tensor of shape {a.shape} ({a.data.size} elements) "
                             f"as {shape}; the number of elements must match") from None

        def backward(g):
            a._accumulate(g.reshape(a.shape))
        return self._result(out_data, (a,), "view", backward)

    reshape = view

    def permute(self, *dims) -> "Tensor":
        a = self
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        if sorted(dims) != list(range(a.ndim)):
            raise ValueError(f"permute: {dims} is not a permutation of the {a.ndim} dimensions of {a.shape}")
        inverse = np.argsort(dims)

        def backward(g):
            a._accumulate(np.transpose(g, inverse))
        return self._result(np.transpose(a.data, dims), (a,), "permute", backward)

    def contiguous(self) -> "Tensor":
        a = self

        def backward(g):
            a._accumulate(g)
        return self._result(np.ascontiguousarray(a.data), (a,), "contiguous", backward)

    # ---- compositions (each is a few primitives, so autodiff comes for free) --------------
    def __radd__(self, other):
        return self + other

    def __rsub__(self, other):
        return self._wrap(other) - self

    def __rmul__(self, other):
        return self * other

    def __rtruediv__(self, other):
        return self._wrap(other) / self

    def __pow__(self, exponent: int):
        if not isinstance(exponent, int) or exponent < 1:
            raise ValueError(f"pow: only positive integer exponents are supported, got {exponent!r}")
        out = self
        for _ in range(exponent - 1):
            out = out * self
        return out

    def mean(self, axis=None, keepdims: bool = False) -> "Tensor":
        axes = range(self.ndim) if axis is None else (axis,) if isinstance(axis, int) else axis
        count = int(np.prod([self.shape[a] for a in axes]))
        return self.sum(axis=axis, keepdims=keepdims) * (1.0 / count)

    def transpose(self, dim0: int, dim1: int) -> "Tensor":
        dims = list(range(self.ndim))
        dims[dim0], dims[dim1] = dims[dim1], dims[dim0]
        return self.permute(*dims)

    # ---- backpropagation ------------------------------------------------------------------
    def backward(self, grad=None, retain_graph: bool = False):
        """Accumulate d(self)/d(leaf) into every leaf's .grad that requires a gradient.

        The graph's closures are released afterwards (as torch frees its saved tensors), so calling
        backward() through them again raises instead of silently adding the same gradients twice;
        retain_graph=True keeps them for another pass."""
        if not self.requires_grad:
            raise RuntimeError("backward: this tensor does not depend on any tensor with "
                               "requires_grad=True, so there is nothing to differentiate")
        if grad is None:
            if self.data.size != 1:
                raise RuntimeError(f"backward: output has shape {self.shape}, not a scalar; "
                                   f"pass grad= with that shape (or call .sum() first)")
            grad = np.ones_like(self.data)
        grad = np.asarray(grad, dtype=DTYPE)
        if grad.shape != self.shape:
            raise ValueError(f"backward: grad has shape {grad.shape} but the output has shape {self.shape}")

        order = graph(self, only_grad=True)
        if any(node._backward is _released for node in order):  # checked before any gradient is touched
            raise RuntimeError("backward: this graph has already been backpropagated through, and its "
                               "backward closures released; doing it again would add the same gradients "
                               "a second time. Call the first backward(retain_graph=True) to go through "
                               "the graph twice, or run the forward pass again")

        self._accumulate(grad)
        for node in reversed(order):
            if node._backward is None:
                if node.grad is not None and not node._grad_owned:
                    node.grad, node._grad_owned = np.array(node.grad), True  # a leaf's own, writable copy
                continue
            if node.grad is not None:
                node._backward(node.grad)
                node.grad = None  # free intermediates' gradients
            if not retain_graph:
                node._backward = _released


def graph(root: Tensor, only_grad: bool = False) -> list:
    """Every tensor `root` was computed from, root included, each once, in topological order: a tensor comes
    after the tensors it was made from. only_grad=True follows only tensors that require a gradient (what
    backward() visits). One walk for backward() and for anyone who reads the graph (FLOP counts, tests)."""
    order, visited, stack = [], set(), [(root, False)]
    while stack:  # iterative post-order DFS: deep graphs never hit the recursion limit
        node, parents_done = stack.pop()
        if parents_done:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        stack.extend((p, False) for p in node._parents if (p.requires_grad or not only_grad) and id(p) not in visited)
    return order


def tensor(data, requires_grad: bool = False) -> Tensor:
    return Tensor(np.array(data, dtype=DTYPE), requires_grad=requires_grad)


def embedding(weight: Tensor, indices) -> Tensor:
    """Row lookup weight[indices] (gather); the backward scatter-adds rows, so repeated ids add up."""
    idx = np.asarray(indices.data if isinstance(indices, Tensor) else indices)
    if idx.dtype == bool:  # numpy would read True/False as ids 1/0 (or torch as a mask)
        raise TypeError("embedding: indices are bool (a mask?); token ids must be integers")
    if not np.issubdtype(idx.dtype, np.integer):
        if np.all(np.mod(idx, 1) == 0):
            idx = idx.astype(np.int64)
        else:
            raise TypeError(f"embedding: indices must be integers, got dtype {idx.dtype}")
    n_rows = weight.shape[0]
    if idx.size and (idx.min() < 0 or idx.max() >= n_rows):
        raise IndexError(f"embedding: index {int(idx.max() if idx.max() >= n_rows else idx.min())} is out "
                         f"of range for a table with {n_rows} rows (valid ids: 0..{n_rows - 1})")

    def backward(g):
        grad = np.zeros_like(weight.data)
        np.add.at(grad, idx.reshape(-1), g.reshape(-1, weight.shape[1]))
        weight._accumulate(grad)
    return weight._result(weight.data[idx], (weight,), "embedding", backward)
