"""tensor.py (lecture 5's framework): gradients of every primitive and composition, autodiff
bookkeeping, strides and views against PyTorch, the op counter, and the errors on bad input."""
from collections import Counter

import numpy as np
import pytest
import torch

from lecture05 import tensor
from gradcheck import PRIMITIVES, check_gradients, leaf, relative_error
from lecture05.tensor import Tensor, count_ops, embedding, no_grad



def away_from_zero(t, margin=0.05):
    """Push entries out of (-margin, margin): relu's kink
    must not sit within a finite-difference step."""
    t.data[...] = np.where(np.abs(t.data) < margin, np.sign(t.data + 1e-300) * margin, t.data) + 0.0
    return t


# (name, f(*leaves), leaf shapes, leaf value range or None for N(0, 1))
CASES = [
    ("add", lambda a, b: a + b, [(3, 4), (3, 4)], None),
    ("add broadcast right", lambda a, b: a + b, [(2, 3, 4), (4,)], None),
    ("add broadcast left", lambda a, b: a + b, [(3, 1), (2, 1, 4)], None),
    ("add constant", lambda a: a + 2.5, [(3, 4)], None),
    ("sub", lambda a, b: a - b, [(3, 4), (3, 4)], None),
    ("sub broadcast right", lambda a, b: a - b, [(2, 3, 4), (3, 1)], None),
    ("sub broadcast left", lambda a, b: a - b, [(1, 4), (2, 3, 4)], None),
    ("sub broadcast both", lambda a, b: a - b, [(3, 1), (1, 4)], None),
    ("sub constant", lambda a: a - 2.5, [(3, 4)], None),
    ("rsub array", lambda a: np.arange(12.0).reshape(3, 4) - a, [(3, 4)], None),
    ("sub same tensor", lambda a: a - a * a, [(3, 4)], None),
    ("mul", lambda a, b: a * b, [(3, 4), (3, 4)], None),
    ("mul broadcast right", lambda a, b: a * b, [(2, 3, 4), (3, 1)], None),
    ("mul broadcast left", lambda a, b: a * b, [(1, 4), (2, 3, 4)], None),
    ("mul broadcast both", lambda a, b: a * b, [(3, 1), (1, 4)], None),
    ("mul array", lambda a: np.arange(12.0).reshape(3, 4) * a, [(3, 4)], None),
    ("div", lambda a, b: a / b, [(3, 4), (3, 4)], (0.3, 2.0)),
    ("div broadcast right", lambda a, b: a / b, [(3, 4), (3, 1)], (0.3, 2.0)),
    ("div broadcast left", lambda a, b: a / b, [(1, 4), (2, 3, 4)], (0.3, 2.0)),
    ("div negative divisor", lambda a, b: a / b, [(3, 4), (4,)], (-2.0, -0.3)),
    ("rdiv", lambda a: 1.5 / a, [(3, 4)], (-2.0, -0.3)),
    ("div same tensor", lambda a: (a * a) / a, [(3, 4)], (0.3, 2.0)),
    ("neg", lambda a: -a, [(3, 4)], None),
    ("exp", lambda a: a.exp(), [(3, 4)], None),
    ("log", lambda a: a.log(), [(3, 4)], (0.2, 3.0)),
    ("sigmoid", lambda a: a.sigmoid(), [(3, 4)], None),
    ("sigmoid large", lambda a: a.sigmoid(), [(3, 4)], (-30.0, 30.0)),
    ("matmul", lambda a, b: a @ b, [(3, 4), (4, 5)], None),
    ("matmul batched", lambda a, b: a @ b, [(2, 3, 4), (2, 4, 5)], None),
    ("matmul broadcast batch", lambda a, b: a @ b, [(2, 1, 3, 4), (3, 4, 2)], None),
    ("matmul matrix @ batch", lambda a, b: a @ b, [(3, 4), (2, 4, 2)], None),
    # run as one 2-D product
    ("matmul batch @ matrix", lambda a, b: a @ b, [(2, 3, 4), (4, 5)], None),
    ("matmul 4-D @ matrix", lambda a, b: a @ b, [(2, 2, 3, 4), (4, 2)], None),
    ("sum all", lambda a: a.sum(), [(2, 3, 4)], None),
    ("sum axis 1", lambda a: a.sum(axis=1), [(2, 3, 4)], None),
    ("sum axis -1 keepdims", lambda a: a.sum(axis=-1, keepdims=True), [(2, 3, 4)], None),
    ("sum axes (0, 2)", lambda a: a.sum(axis=(0, 2)), [(2, 3, 4)], None),
    ("view", lambda a: a.contiguous().view(6, 4), [(2, 3, 4)], None),
    ("view -1", lambda a: a.contiguous().view(-1), [(2, 3, 4)], None),
    ("permute", lambda a: a.permute(2, 0, 1), [(2, 3, 4)], None),
    ("permute then contiguous", lambda a: a.permute(1, 2, 0).contiguous(), [(2, 3, 4)], None),
    ("embedding repeated ids", lambda w: embedding(w, np.array([[0, 2, 2], [4, 0, 2]])), [(5, 3)],
     None),
    # compositions
    ("rsub", lambda a: 1.5 - a, [(3, 4)], None),
    ("div constant", lambda a: a / 3.0, [(3, 4)], None),
    ("pow 3", lambda a: a ** 3, [(3, 4)], None),
    ("mean all", lambda a: a.mean(), [(2, 3, 4)], None),
    ("mean axis", lambda a: a.mean(axis=-1, keepdims=True), [(2, 3, 4)], None),
    ("mean axes", lambda a: a.mean(axis=(0, 1)), [(2, 3, 4)], None),
    ("transpose", lambda a: a.transpose(0, 2), [(2, 3, 4)], None),
]


@pytest.mark.parametrize("layout", ["contiguous", "permuted"])
@pytest.mark.parametrize("name,f,shapes,value_range", CASES, ids=[c[0] for c in CASES])
def test_gradient(name, f, shapes, value_range, layout):
    low, high = value_range if value_range else (None, None)
    leaves = [leaf(s, layout, seed=k, low=low, high=high) for k, s in enumerate(shapes)]
    check_gradients(lambda: f(*leaves), leaves)


@pytest.mark.parametrize("layout", ["contiguous", "permuted"])
def test_gradient_relu(layout):
    a = away_from_zero(leaf((4, 5), layout))
    assert (a.data > 0).any() and (a.data < 0).any()
    check_gradients(lambda: a.relu(), [a])


def test_gradient_view_of_permuted_graph():
    """A whole chain through a non-contiguous intermediate:
    permute -> mul -> contiguous -> view -> matmul."""
    a, b, w = leaf((2, 3, 4), seed=1), leaf((4, 2, 3), seed=2), leaf((24, 2), seed=3)
    check_gradients(lambda: ((a.permute(2, 0, 1) * b).contiguous().view(1, 24) @ w).sigmoid(),
                    [a, b, w])


def test_relative_error_helper_sees_every_element():
    """The helper must fail on one bad element among many good ones."""
    good = np.linspace(1, 2, 100)
    bad = good.copy()
    bad[57] *= 1 + 1e-5
    assert relative_error(good, good, 1e-6) == 0.0
    assert relative_error(good, bad, 1e-6) > 9e-6


def test_max_is_a_constant_value():
    x = leaf((3, 4))
    m = x.max(axis=-1, keepdims=True)
    np.testing.assert_array_equal(m.data, x.data.max(axis=-1, keepdims=True))
    assert x.max().item() == x.data.max()
    assert not m.requires_grad and m.grad is None
    (x - m).sum().backward()            # m is a constant: d/dx sum(x - m) = 1 everywhere
    np.testing.assert_array_equal(x.grad, np.ones((3, 4)))


def test_max_with_finite_true_puts_zero_where_the_maximum_is_infinite():
    x = tensor.tensor([[-np.inf, -np.inf], [np.inf, 1.0], [2.0, -np.inf], [3.0, 1.0]])
    np.testing.assert_array_equal(x.max(axis=1).data, [-np.inf, np.inf, 2.0, 3.0])
    np.testing.assert_array_equal(x.max(axis=1, keepdims=True, finite=True).data,
                                  [[0.0], [0.0], [2.0], [3.0]])


# ---- autodiff bookkeeping ------------------------------------------------------------------------
def test_node_used_twice():
    a = leaf((3,))
    (a + a).sum().backward()
    np.testing.assert_array_equal(a.grad, np.full(3, 2.0))
    a.zero_grad()
    (a * a).sum().backward()
    np.testing.assert_allclose(a.grad, 2 * a.data, rtol=0, atol=0)
    a.zero_grad()
    b = a.exp()                          # an intermediate used by two branches
    (b * a + b).sum().backward()
    np.testing.assert_allclose(a.grad, np.exp(a.data) * (a.data + 2), rtol=1e-15)


def test_gradients_accumulate_over_separate_forward_passes_until_zeroed():
    a, b = leaf((2, 3)), leaf((2, 3), seed=1)
    (a * b).sum().backward()
    first = a.grad.copy()
    np.testing.assert_array_equal(first, b.data)
    (a * b).sum().backward()             # a new graph: its gradients add up
    np.testing.assert_array_equal(a.grad, 2 * first)
    a.zero_grad()
    assert a.grad is None


def test_a_second_backward_through_the_same_graph_is_refused_unless_retain_graph_like_torch():
    a, b = leaf((2, 3)), leaf((2, 3), seed=1)
    loss = (a * b).exp().sum()
    loss.backward()
    first = a.grad.copy()
    with pytest.raises(RuntimeError,
                       match=r"already been backpropagated through.*retain_graph=True"):
        loss.backward()
    np.testing.assert_array_equal(a.grad, first)           # refused before any gradient moved
    shared = (a * b).exp()                                  # two losses sharing a subgraph
    shared.sum().backward()
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        (shared * 2.0).sum().backward()
    a.zero_grad()
    loss = (a * b).exp().sum()
    loss.backward(retain_graph=True)
    loss.backward()                                         # kept for exactly this: the sum of both
    np.testing.assert_array_equal(a.grad, 2 * first)
    t = torch.from_numpy(a.data.copy()).requires_grad_()
    torch_loss = (t * torch.from_numpy(b.data)).exp().sum()
    torch_loss.backward()
    with pytest.raises(RuntimeError, match="retain_graph=True"):  # torch refuses the same way
        torch_loss.backward()


def test_grad_is_not_aliased():
    """An accumulated gradient must be its own array: a later in-place += may not leak elsewhere."""
    a, b = leaf((3,)), leaf((3,), seed=1)
    g = np.ones(3)
    (a + b).backward(g)
    assert not np.shares_memory(a.grad, g) and not np.shares_memory(a.grad, b.grad)
    (a + b).backward(g)
    np.testing.assert_array_equal(g, np.ones(3))
    np.testing.assert_array_equal(b.grad, np.full(3, 2.0))


def test_deep_chain_of_5000_operations():
    x = leaf((2,))
    y = x
    for _ in range(2500):                # 5,000 primitives: mul and add alternate
        y = y * 1.001 + 0.0
    y.sum().backward()
    np.testing.assert_allclose(x.grad, np.full(2, 1.001 ** 2500), rtol=1e-12)


def test_intermediates_and_constants():
    x, c = leaf((2, 2)), Tensor(np.ones((2, 2)))   # c needs no gradient
    h = x * c
    assert h.requires_grad and h._parents
    loss = h.exp().sum()
    loss.backward()
    assert c.grad is None                          # no gradient for a constant
    # intermediates' gradients are freed; leaves keep theirs
    assert h.grad is None and loss.grad is None
    np.testing.assert_allclose(x.grad, np.exp(x.data), rtol=1e-15)
    with no_grad():
        z = x * 2.0
    assert not z.requires_grad and z._parents == ()
    with pytest.raises(RuntimeError, match="requires_grad"):
        z.sum().backward()


def test_backward_with_explicit_grad():
    x = leaf((2, 3))
    (x * 3.0).backward(np.full((2, 3), 2.0))
    np.testing.assert_array_equal(x.grad, np.full((2, 3), 6.0))


# ---- strides and views ---------------------------------------------------------------------------
def test_strides_match_torch():
    data = np.arange(2 * 3 * 4 * 6, dtype=np.float64).reshape(2, 3, 4, 6)
    ours, theirs = Tensor(data), torch.from_numpy(data.copy())
    steps = [
        lambda t: t.permute(0, 2, 1, 3),                 # (B, S, h, Dh) -> (B, h, S, Dh)
        lambda t: t.permute(0, 1, 3, 2),                 # k -> kT
        lambda t: t.transpose(1, 3),
        lambda t: t.permute(0, 2, 1, 3).contiguous(),
        lambda t: t.view(2, 12, 6),
        lambda t: t.view(6, 4, 6).permute(2, 0, 1),
        lambda t: t.sum(axis=1),
    ]
    for step in steps:
        a, b = step(ours), step(theirs)
        assert a.shape == tuple(b.shape)
        assert a.stride() == b.stride(), (a.stride(), b.stride())
        assert a.is_contiguous() == b.is_contiguous()
        np.testing.assert_array_equal(a.data, b.numpy())


def test_permute_is_zero_copy_and_contiguous_copies():
    x = Tensor(np.arange(24.0).reshape(2, 3, 4))
    p = x.permute(0, 2, 1)
    assert np.shares_memory(p.data, x.data) and not p.is_contiguous()
    assert np.shares_memory(x.view(6, 4).data, x.data)         # a view shares memory too
    c = p.contiguous()
    assert c.is_contiguous() and not np.shares_memory(c.data, x.data)
    assert c.stride() == (12, 3, 1)
    np.testing.assert_array_equal(c.data, p.data)


def test_view_after_permute_raises_like_torch():
    x = Tensor(np.arange(24.0).reshape(2, 3, 4))
    with pytest.raises(RuntimeError, match=r"contiguous\(\)"):
        x.permute(0, 2, 1).view(2, 12)
    with pytest.raises(RuntimeError):                            # PyTorch refuses the same view
        torch.arange(24.0).view(2, 3, 4).permute(0, 2, 1).view(2, 12)
    assert x.permute(0, 2, 1).contiguous().view(2, 12).shape == (2, 12)


# ---- the op counter ------------------------------------------------------------------------------
def test_op_counter_counts_by_kind():
    a, b = leaf((2, 3)), leaf((3, 2), seed=1)
    with count_ops() as counts:
        y = (a @ b).exp() - a.max()           # matmul, exp, max, sub: one primitive, not neg + add
        y = -y.sum(axis=0).view(1, 2).permute(1, 0).contiguous() + 3.0
        y = y.sigmoid().relu().log() * 2.0 / Tensor(np.full((2, 1), 4.0))
        e = embedding(a, [1, 0, 1])
    assert counts == Counter({"matmul": 1, "exp": 1, "max": 1, "sub": 1, "neg": 1, "add": 1,
                              "sum": 1, "view": 1, "permute": 1, "contiguous": 1, "sigmoid": 1,
                              "relu": 1, "log": 1, "mul": 1, "div": 1, "embedding": 1})
    assert set(counts) == PRIMITIVES and len(PRIMITIVES) == 16
    with count_ops() as counts:
        1.5 - a                               # a constant minus a tensor is one sub as well
    assert counts == Counter({"sub": 1})
    with count_ops() as counts:
        (y * y).sum().backward()              # backward launches are not forward ops
        with no_grad():
            e + 1.0                           # counted under no_grad too: it is still a launch
    assert counts == Counter({"mul": 1, "sum": 1, "add": 1})
    with count_ops() as counts:
        a / 3.0                                   # division by a constant: a multiply by 1/3
        a.mean()
    assert counts == Counter({"mul": 2, "sum": 1})


# ---- bad input -----------------------------------------------------------------------------------
def test_error_matmul_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3\) @ \(4, 5\)"):
        leaf((2, 3)) @ leaf((4, 5))
    with pytest.raises(ValueError, match=r"batch dimensions of \(2, 3, 4\) and \(3, 4, 5\)"):
        leaf((2, 3, 4)) @ leaf((3, 4, 5))
    with pytest.raises(ValueError, match=r"at least 2 dimensions.*\(4,\)"):
        leaf((3, 4)) @ leaf((4,))


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div"])
def test_error_cannot_broadcast(op):
    a, b = leaf((2, 3)), leaf((4,))
    with pytest.raises(ValueError, match=rf"{op}: shapes \(2, 3\) and \(4,\) cannot broadcast"):
        {"add": lambda: a + b, "sub": lambda: a - b, "mul": lambda: a * b,
         "div": lambda: a / b}[op]()


def test_division_by_a_tensor_with_negative_or_zero_entries_gives_torch_values_and_gradients():
    """It used to be a·exp(-log b), which refused b <= 0 with a message about log."""
    a = tensor.tensor([[1.0, -2.0, 3.0], [0.5, 4.0, -1.0]], requires_grad=True)
    b = tensor.tensor([[-4.0], [0.25]], requires_grad=True)
    (a / b).backward(np.arange(6.0).reshape(2, 3))
    ta, tb = (torch.tensor(t.data, requires_grad=True) for t in (a, b))
    (ta / tb).backward(torch.arange(6.0, dtype=torch.float64).reshape(2, 3))
    np.testing.assert_array_equal((a / b).data, (ta / tb).detach().numpy())
    np.testing.assert_allclose(a.grad, ta.grad.numpy(), rtol=1e-15)
    np.testing.assert_allclose(b.grad, tb.grad.numpy(), rtol=1e-15)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal((tensor.tensor([1.0, -1.0]) / tensor.tensor([0.0, 0.0])).data,
                                      [np.inf, -np.inf])


def test_error_backward_non_scalar():
    y = leaf((2, 3)) * 2.0
    with pytest.raises(RuntimeError, match=r"shape \(2, 3\), not a scalar.*grad="):
        y.backward()
    with pytest.raises(ValueError,
                       match=r"grad has shape \(3,\) but the output has shape \(2, 3\)"):
        y.backward(np.ones(3))


def test_error_view_size():
    with pytest.raises(ValueError, match=r"shape \(2, 3, 4\) \(24 elements\) as \(5, 5\)"):
        leaf((2, 3, 4)).view(5, 5)


def test_error_embedding_index():
    w = leaf((5, 3))
    with pytest.raises(IndexError, match=r"index 5 is out of range for a table with 5 rows"):
        embedding(w, np.array([[0, 5]]))
    with pytest.raises(IndexError, match=r"index -1 is out of range"):
        embedding(w, np.array([-1, 2]))
    with pytest.raises(TypeError, match="integers"):
        embedding(w, np.array([0.5]))


def test_embedding_refuses_float_indices_whole_ones_too_as_torch_does():
    w = leaf((5, 3))
    for indices in (np.array([1.0, 2.0]), np.array([1.7])):
        with pytest.raises(TypeError, match=r"^embedding: indices must be integers, got dtype "
                                            r"float64; pass indices.astype\(int\)$"):
            embedding(w, indices)
    with pytest.raises(TypeError, match=r"^embedding: indices must be integers in a numpy array "
                                        r"\(or nested lists\), got a Tensor of shape \(2,\); "
                                        r"pass indices.numpy\(\).astype\(int\)$"):
        embedding(w, Tensor(np.array([1.0, 2.0])))


def test_log_of_zero_is_minus_inf_as_in_torch_and_a_negative_entry_is_refused():
    x = tensor.tensor([1.0, 0.0], requires_grad=True)
    y = x.log()
    np.testing.assert_array_equal(y.data,
                                  torch.log(torch.tensor([1.0, 0.0], dtype=torch.float64)).numpy())
    assert y.data[1] == -np.inf
    with pytest.raises(ValueError, match=r"log: input of shape \(3,\) has entries < 0 \(min -1\)"):
        tensor.tensor([1.0, 0.0, -1.0]).log()


def test_error_permute_and_pow():
    with pytest.raises(ValueError, match=r"not a permutation of the 3 dimensions"):
        leaf((2, 3, 4)).permute(0, 0, 1)
    with pytest.raises(ValueError, match="positive integer"):
        leaf((2,)) ** 0.5


def test_indexing_or_iterating_a_tensor_points_at_numpy():
    t = Tensor(np.arange(6.0).reshape(2, 3))
    for index in (lambda: t[0], lambda: t[:, 1:], lambda: t[np.array([1, 0])]):
        with pytest.raises(TypeError, match=r"^Tensor: indexing \(t\[...\]\) is not one of "
                                            r"tensor.py's primitives, so autodiff could not "
                                            r"follow it; read the values with t.numpy\(\)\[...\], "
                                            r"or pick rows differentiably with embedding\(t, "
                                            r"ids\)$"):
            index()
    for iterate in (lambda: list(t), lambda: [row for row in t]):
        with pytest.raises(TypeError, match=r"^Tensor: iterating over a Tensor is not one of "
                                            r"tensor.py's primitives; iterate over t.numpy\(\) to "
                                            r"read the values$"):
            iterate()
    assert t.numpy()[1, 2] == 5.0 and embedding(t, [1]).numpy().tolist() == [[3.0, 4.0, 5.0]]


def test_a_numpy_array_left_of_matmul_is_wrapped_as_on_the_right_and_as_in_the_other_ops():
    a = np.arange(6.0).reshape(2, 3)
    b = tensor.tensor(np.arange(12.0).reshape(3, 4), requires_grad=True)
    product = a @ b
    np.testing.assert_array_equal(product.numpy(), a @ b.numpy())
    product.sum().backward()
    np.testing.assert_array_equal(b.grad, a.T @ np.ones((2, 4)))          # d sum(a b) / db
    np.testing.assert_array_equal(product.numpy(), (Tensor(a) @ b).numpy())


def test_item():
    assert tensor.tensor([[2.5]]).item() == 2.5
    assert tensor.tensor(3.0).item() == 3.0


def test_sigmoid_extremes():
    """exp(-logaddexp(0, -x)): no overflow warning at
    |x| = 1000; values and gradients stay accurate."""
    x = tensor.tensor([-1000.0, -30.0, 0.0, 30.0, 1000.0], requires_grad=True)
    with np.errstate(over="raise", divide="raise", invalid="raise"):   # underflow to 0 is fine
        y = x.sigmoid()
        y.sum().backward()
    s = np.array([0.0, np.exp(-30) / (1 + np.exp(-30)), 0.5, 1 / (1 + np.exp(-30)), 1.0])
    np.testing.assert_allclose(y.data, s, rtol=3e-15, atol=0)
    # s(1 - s) loses relative precision where s rounds
    # near 1 (as in torch), never more than eps absolute
    np.testing.assert_allclose(x.grad, s * np.array([1.0, 1 - s[1], 0.5, s[1], 0.0]), rtol=1e-14,
                               atol=2e-16)


def test_broadcast_rule_matches_numpy():
    """tensor.py checks broadcasting in plain Python; it must agree with numpy on every pair."""
    shapes = [(), (1,), (3,), (4,), (1, 1), (3, 1), (1, 4), (3, 4), (2, 3, 4), (2, 1, 4), (5, 3, 1),
              (0,), (0, 4)]
    for a in shapes:
        for b in shapes:
            try:
                np.broadcast_shapes(a, b)
                expected = True
            except ValueError:
                expected = False
            assert tensor._broadcasts(a, b) == expected, (a, b)


@pytest.mark.parametrize("op",
                         ["neg", "exp", "log", "sigmoid", "relu", "sum", "view", "mul", "add",
                          "sub", "div"])
def test_zero_dimensional_tensors(op):
    """A 0-d tensor (a scalar, e.g. a loss) goes through every elementwise primitive and back."""
    x = leaf((), low=0.5, high=2.0)
    f = {"neg": lambda: -x, "exp": x.exp, "log": x.log, "sigmoid": x.sigmoid, "relu": x.relu,
         "sum": x.sum, "view": lambda: x.view(1, 1), "mul": lambda: x * x, "add": lambda: x + 1.0,
         "sub": lambda: 1.0 - x, "div": lambda: x / (x * x)}[op]
    assert isinstance(f().data, np.ndarray)
    check_gradients(f, [x])


def test_graph_lists_every_tensor_once_after_the_tensors_it_was_made_from():
    x = tensor.Tensor(np.ones(3), requires_grad=True)
    c = tensor.Tensor(np.full(3, 2.0))  # a constant: in the graph, not followed for gradients
    y = x * c
    z = (y + y.exp()).sum()
    order = tensor.graph(z)
    assert len(order) == len({id(t) for t in order}) == 6 and order[-1] is z
    position = {id(t): i for i, t in enumerate(order)}
    assert all(position[id(p)] < position[id(t)] for t in order for p in t._parents)
    assert [t for t in tensor.graph(z, only_grad=True) if not t.requires_grad] == []
