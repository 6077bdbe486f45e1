"""Lecture 5's autodiff framework: a float64 Tensor over numpy with reverse-mode differentiation.

Lecture 6 builds every HW3 module (code/lecture06/transformer.py) from the primitives below and
nothing else, so this file is the whole engine. A first reading stops at the ruler "beyond the
notes": everything above it is lecture 5's framework (notes §9.1).

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
only, treated as a constant), view, permute, contiguous, embedding (gather; backward is
scatter-add). Softmax, GELU, 1/sqrt are compositions of these.

Beyond the notes, after the ruler (03 part 7, 06 part 6): `count_traffic` and `saved_bytes` (the
bytes each launch moves, what a graph keeps alive for backward). The fused primitives they are
compared with live in lecture 6's kernels.py.
"""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

import numpy as np

DTYPE = np.float64
OP_COUNTS: Counter = Counter()

# Lecture 6's one additive-mask convention (notes §2.3): 0 where a query may look, MASK_VALUE where
# it may not. Defined here, below every module that masks (transformer.py's attention, kernels.py's
# flash core, decoding.py's KV cache), so that each imports the same number from the one file all
# of them build on.
MASK_VALUE = -1e9


@contextmanager
def count_ops():
    """`with count_ops() as counts: ...` -> a Counter, by kind, of the primitive calls inside."""
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
    """Whether shapes a and b broadcast: numpy's rule, in plain Python (np.broadcast_shapes is
    slow)."""
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
        self._saved = ()            # the arrays _backward reads (bytes moved, memory kept alive)
        self._backward_flops = 0

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

    def __getitem__(self, key):
        # without it Python says only "not subscriptable"; slicing is no primitive here (notes §9.1)
        raise TypeError("Tensor: indexing (t[...]) is not one of tensor.py's primitives, so "
                        "autodiff could not follow it; read the values with t.numpy()[...], or "
                        "pick rows differentiably with embedding(t, ids)")

    def __iter__(self):
        raise TypeError("Tensor: iterating over a Tensor is not one of tensor.py's primitives; "
                        "iterate over t.numpy() to read the values")

    def item(self) -> float:
        return float(self.data.item())  # .item(): numpy 2 refuses float() of a (1, 1) array

    def zero_grad(self):
        self.grad = None

    def detach(self) -> "Tensor":
        return Tensor(self.data)

    def _accumulate(self, grad: np.ndarray):
        """Add a contribution to .grad. The first one is kept as is, without a copy (most tensors
        get just one); it may be shared with another tensor, so a second one makes a fresh sum
        rather than writing into it. backward() gives leaves a private copy at the end."""
        if self.grad is None:
            self.grad, self._grad_owned = grad, False
        elif self._grad_owned:
            self.grad += grad
        else:
            self.grad, self._grad_owned = self.grad + grad, True

    @staticmethod
    def _wrap(x) -> "Tensor":
        return x if isinstance(x, Tensor) else Tensor(x)

    def _result(self, data: np.ndarray, parents: tuple, op: str, backward, saved: tuple = (),
                written: tuple = (), flops: int = 0, backward_flops: int = 0,
                read=None) -> "Tensor":
        """Create an op's output; keep the graph only if some input needs a gradient.

        The other arguments are for the accounting after the ruler (03 part 7): saved, the arrays
        backward reads; written, what the forward writes beside its output (a fused kernel's per-row
        statistics); read, bytes read when not all of every input; flops and backward_flops."""
        OP_COUNTS[op] += 1
        _charge_forward(op, parents, data, written, read, flops)
        needs_grad = _grad_enabled and any([p.requires_grad for p in parents])
        out = Tensor(data, requires_grad=needs_grad, _parents=parents if needs_grad else (), _op=op)
        if needs_grad:
            out._backward = backward  # called with out.grad; holds no reference to out, so no cycle
            out._saved, out._backward_flops = saved, backward_flops
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
        return self._result(a.data * b.data, (a, b), "mul", backward,
                            saved=_kept((b.data, a.requires_grad), (a.data, b.requires_grad)))

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
        if not isinstance(other, Tensor):  # a constant: multiply by its reciprocal, no graph for it
            return self * (1.0 / other)
        _broadcast_shape(self.shape, other.shape, "div")
        a, b = self, other
        out_data = a.data / b.data

        def backward(g):
            if a.requires_grad:
                a._accumulate(_unbroadcast(g / b.data, a.shape))
            if b.requires_grad:
                # d(a/b)/db = -(a/b)/b
                b._accumulate(_unbroadcast(-g * out_data / b.data, b.shape))
        return self._result(out_data, (a, b), "div", backward,
                            saved=_kept((b.data, True), (out_data, b.requires_grad)))

    def __neg__(self) -> "Tensor":
        a = self

        def backward(g):
            a._accumulate(-g)
        return self._result(-a.data, (a,), "neg", backward)

    def exp(self) -> "Tensor":
        a, out_data = self, np.exp(self.data)

        def backward(g):
            a._accumulate(g * out_data)
        return self._result(out_data, (a,), "exp", backward, saved=(out_data,))

    def log(self) -> "Tensor":
        a = self
        if np.any(a.data < 0):
            raise ValueError(f"log: input of shape {a.shape} has entries < 0 "
                             f"(min {a.data.min():.3g}); log is real only for x >= 0")

        def backward(g):
            with np.errstate(divide="ignore"):
                a._accumulate(g / a.data)
        # log 0 = -inf, as in torch: logsumexp of an all -inf row needs it
        with np.errstate(divide="ignore"):
            return self._result(np.log(a.data), (a,), "log", backward, saved=(a.data,))

    def sigmoid(self) -> "Tensor":
        a = self
        # 1/(1 + e^-x) is accurate everywhere; for x < -709 e^-x overflows to inf and 1/inf = 0 is
        # right. In place from here on (out= keeps 0-d arrays).
        out_data = np.negative(a.data, out=np.empty_like(a.data))
        with np.errstate(over="ignore"):
            np.exp(out_data, out=out_data)
        out_data += 1.0
        np.reciprocal(out_data, out=out_data)

        def backward(g):
            a._accumulate(g * out_data * (1.0 - out_data))
        return self._result(out_data, (a,), "sigmoid", backward, saved=(out_data,))

    def relu(self) -> "Tensor":
        a = self

        def backward(g):
            a._accumulate(g * (a.data > 0))
        return self._result(np.maximum(a.data, 0.0), (a,), "relu", backward, saved=(a.data,))

    def __matmul__(self, other) -> "Tensor":
        other = self._wrap(other)
        a, b = self, other
        if a.ndim < 2 or b.ndim < 2:
            raise ValueError(f"matmul: both inputs need at least 2 dimensions, "
                             f"got {a.shape} @ {b.shape}")
        if a.shape[-1] != b.shape[-2]:
            raise ValueError(f"matmul: shapes {a.shape} @ {b.shape} do not line up: "
                             f"the last dimension of the left ({a.shape[-1]}) must equal "
                             f"the second-to-last of the right ({b.shape[-2]})")
        if not _broadcasts(a.shape[:-2], b.shape[:-2]):
            raise ValueError(f"matmul: batch dimensions of {a.shape} and {b.shape} "
                             f"cannot broadcast")

        if b.ndim == 2 and a.ndim > 2:
            # (..., n, k) @ (k, m) as one (N, k) @ (k, m) product: one BLAS call instead of one per
            # batch entry, and the weight's gradient comes out summed over the batch with no
            # (..., k, m) temporary
            rows_a = a.data.reshape(-1, a.shape[-1])

            def backward(g):
                rows_g = g.reshape(-1, g.shape[-1])
                if a.requires_grad:
                    a._accumulate((rows_g @ b.data.T).reshape(a.shape))
                if b.requires_grad:
                    b._accumulate(rows_a.T @ rows_g)
            out_data = (rows_a @ b.data).reshape(*a.shape[:-1], b.shape[-1])
            return self._result(out_data, (a, b), "matmul", backward,
                                **_matmul_cost(a, b, out_data))

        def backward(g):
            if a.requires_grad:
                a._accumulate(_unbroadcast(g @ np.swapaxes(b.data, -1, -2), a.shape))
            if b.requires_grad:
                b._accumulate(_unbroadcast(np.swapaxes(a.data, -1, -2) @ g, b.shape))
        out_data = a.data @ b.data
        return self._result(out_data, (a, b), "matmul", backward, **_matmul_cost(a, b, out_data))

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

        finite=True gives 0 where the maximum is ±inf: any finite shift is exact, and an infinite
        one would turn inf - inf into nan (torch.logsumexp shifts the same way). The maximum of an
        empty row is -inf (numpy would raise), so a length-0 sequence goes through softmax as
        through torch."""
        OP_COUNTS["max"] += 1
        m = self.data.max(axis=axis, keepdims=keepdims, initial=-np.inf)
        _charge_forward("max", (self,), m)
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
            raise ValueError(f"view: cannot view a tensor of shape {a.shape} "
                             f"({a.data.size} elements) as {shape}; the number of elements "
                             f"must match") from None

        def backward(g):
            a._accumulate(g.reshape(a.shape))
        return self._result(out_data, (a,), "view", backward)

    reshape = view

    def permute(self, *dims) -> "Tensor":
        a = self
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = tuple(dims[0])
        if sorted(dims) != list(range(a.ndim)):
            raise ValueError(f"permute: {dims} is not a permutation of the {a.ndim} dimensions "
                             f"of {a.shape}")
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

    def __rmatmul__(self, other):
        return self._wrap(other) @ self

    def __pow__(self, exponent: int):
        if not isinstance(exponent, int) or exponent < 1:
            raise ValueError(f"pow: only positive integer exponents are supported, "
                             f"got {exponent!r}")
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
            raise ValueError(f"backward: grad has shape {grad.shape} but the output has shape "
                             f"{self.shape}")

        order = graph(self, only_grad=True)
        # checked before any gradient is touched
        if any(node._backward is _released for node in order):
            raise RuntimeError("backward: this graph has already been backpropagated through, and "
                               "its backward closures released; doing it again would add the same "
                               "gradients a second time. Call the first "
                               "backward(retain_graph=True) to go through the graph twice, or run "
                               "the forward pass again")

        self._accumulate(grad)
        for node in reversed(order):
            if node._backward is None:
                if node.grad is not None and not node._grad_owned:
                    # a leaf's own, writable copy
                    node.grad, node._grad_owned = np.array(node.grad), True
                continue
            if node.grad is not None:
                _charge_backward(node)
                node._backward(node.grad)
                node.grad = None  # free intermediates' gradients
            if not retain_graph:
                node._backward = _released


def graph(root: Tensor, only_grad: bool = False) -> list:
    """Every tensor `root` was computed from, root included, each once, in topological order: a
    tensor comes after the tensors it was made from. only_grad=True follows only tensors that
    require a gradient (what backward() visits). One walk for backward() and for anyone who reads
    the graph (FLOP counts, tests)."""
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
        stack.extend((p, False) for p in node._parents
                     if (p.requires_grad or not only_grad) and id(p) not in visited)
    return order


def tensor(data, requires_grad: bool = False) -> Tensor:
    return Tensor(np.array(data, dtype=DTYPE), requires_grad=requires_grad)


def check_token_ids(owner: str, ids, what: str = "token ids", name: str = "ids") -> np.ndarray:
    """ids as an integer numpy array, the one check of all that takes ids (embedding, the models,
    generate, the losses' targets); the message says how to convert `name`, the argument."""
    if isinstance(ids, Tensor):   # numpy would hold it whole, as one object of shape ()
        raise TypeError(f"{owner}: {what} must be integers in a numpy array (or nested lists), "
                        f"got a Tensor of shape {ids.shape}; pass {name}.numpy().astype(int)")
    ids = np.asarray(ids)
    if ids.size == 0:              # an empty list arrives as float64
        return ids.astype(np.int64)
    if np.issubdtype(ids.dtype, np.integer):
        return ids
    if ids.dtype.kind in "US":
        got, fix = f"strings (dtype {ids.dtype})", "look each token up in the vocabulary first"
    elif ids.dtype == bool:        # numpy would read True/False as ids 1/0 (and torch as a mask)
        got, fix = "dtype bool (a mask?)", "pass integer ids"
    else:   # floats as torch's nn.Embedding, whole ones too: an id names a row, it is no amount
        got, fix = f"dtype {ids.dtype}", f"pass {name}.astype(int)"
    raise TypeError(f"{owner}: {what} must be integers, got {got}; {fix}")


def embedding(weight: Tensor, indices) -> Tensor:
    """Row lookup weight[indices] (gather); the backward scatter-adds rows, so repeated ids add
    up."""
    idx = check_token_ids("embedding", indices, "indices", "indices")
    n_rows = weight.shape[0]
    if idx.size and (idx.min() < 0 or idx.max() >= n_rows):
        bad = int(idx.max() if idx.max() >= n_rows else idx.min())
        raise IndexError(f"embedding: index {bad} is out of range for a table with {n_rows} rows "
                         f"(valid ids: 0..{n_rows - 1})")

    def backward(g):
        grad = np.zeros_like(weight.data)
        np.add.at(grad, idx.reshape(-1), g.reshape(-1, weight.shape[1]))
        weight._accumulate(grad)
    rows = weight.data[idx]
    # it reads the rows it gathers, not the whole table
    return weight._result(rows, (weight,), "embedding", backward, saved=(idx,),
                          read=rows.nbytes + idx.nbytes)


# ==== beyond the notes: accounting (03 part 7, 06 part 6) =========================================
# A first reading stops above. What follows measures what the primitives above cost (launches,
# bytes moved, FLOPs, memory kept for backward); lecture 6's kernels.py adds fused primitives that
# cost less.

# ---- traffic accounting: the hooks the primitives call, and the counters they fill ---------------
class Traffic:
    """What the launches inside a block cost: Counters keyed by (pass, kind), pass "forward" (a
    primitive's call) or "backward" (its closure's call). A launch is charged the bytes of every
    array it reads and writes, once (a GPU kernel's global-memory traffic with perfect caching);
    view and permute move nothing (they change strides only), nor do the backward closures of view,
    permute and contiguous (they hand the gradient on). flops: multiply-adds ×2 of matmul and
    flash_attention (kernels.py) only, as the notes count."""

    def __init__(self):
        self.launches, self.bytes, self.flops = Counter(), Counter(), Counter()

    def total(self, field: str, direction: str | None = None) -> int:
        return sum(n for (d, _), n in getattr(self, field).items() if direction in (None, d))


TRAFFIC = Traffic()
MOVES_NOTHING = {"forward": {"view", "permute"}, "backward": {"view", "permute", "contiguous"}}


def _charge(direction: str, kind: str, nbytes: int, flops: int = 0):
    TRAFFIC.launches[direction, kind] += 1
    TRAFFIC.bytes[direction, kind] += 0 if kind in MOVES_NOTHING[direction] else nbytes
    TRAFFIC.flops[direction, kind] += flops


def _charge_forward(op: str, parents: tuple, data: np.ndarray, written: tuple = (), read=None,
                    flops: int = 0):
    """A primitive's call: what it reads (all of every input unless told), writes and computes."""
    read = sum(p.data.nbytes for p in parents) if read is None else read
    _charge("forward", op, read + data.nbytes + sum(w.nbytes for w in written), flops)


def _charge_backward(node: "Tensor"):
    """A backward closure's call: it reads the gradient and the saved arrays and writes a gradient
    for each input that requires one."""
    written = sum(p.data.nbytes for p in node._parents if p.requires_grad)
    _charge("backward", node._op, node.grad.nbytes + sum(a.nbytes for a in node._saved) + written,
            node._backward_flops)


@contextmanager
def count_traffic():
    """`with count_traffic() as traffic: ...` -> a Traffic of the launches made inside the block."""
    traffic = Traffic()
    before = [counter.copy() for counter in (TRAFFIC.launches, TRAFFIC.bytes, TRAFFIC.flops)]
    try:
        yield traffic
    finally:
        for mine, now, then in zip((traffic.launches, traffic.bytes, traffic.flops),
                                   (TRAFFIC.launches, TRAFFIC.bytes, TRAFFIC.flops), before):
            mine.update(now - then)


def _kept(*pairs) -> tuple:
    """The arrays a backward closure reads: of each (array, needed) pair, the array if needed."""
    return tuple(array for array, needed in pairs if needed)


def _owner(array: np.ndarray) -> np.ndarray:
    """The array that owns a view's memory (a view keeps its owner alive)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def saved_bytes(root: "Tensor", exclude=()) -> int:
    """Bytes the backward closures of root's graph keep alive: each buffer once (a view counts as
    the array it views), single numbers (constants) and the arrays of `exclude` (parameters) left
    out."""
    left_out = {id(_owner(t.data)) for t in exclude}
    buffers = {id(_owner(a)): _owner(a) for node in graph(root) for a in node._saved if a.ndim}
    return sum(a.nbytes for key, a in buffers.items() if key not in left_out)


def _matmul_cost(a: "Tensor", b: "Tensor", out_data: np.ndarray) -> dict:
    """A matmul's saved arrays and FLOPs: 2·K per output element forward, as much per input
    gradient."""
    flops = 2 * out_data.size * a.shape[-1]
    return dict(saved=_kept((b.data, a.requires_grad), (a.data, b.requires_grad)), flops=flops,
                backward_flops=flops * (a.requires_grad + b.requires_grad))
