"""optim.py (notes §7.5): Adam against torch.optim.Adam step by step (max abs difference <= 1e-12),
the optimizers' refusals of a bad learning rate, betas or eps, and noam_lr's refusal of a step
outside its domain (it counts updates from 1) or of a float step."""
import numpy as np
import pytest
import torch

from lecture06 import optim, transformer
from twins import max_diff

TOL = 1e-12


def f64(x) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)


# ---- Adam and SGD --------------------------------------------------------------------------------
@pytest.mark.parametrize("betas,eps", [((0.9, 0.999), 1e-8), ((0.9, 0.98), 1e-9)])
def test_adam_matches_torch(betas, eps):
    rng = np.random.default_rng(0)
    shapes = [(4, 3), (3,), (2, 2, 2)]
    ours = [transformer.Parameter(rng.standard_normal(s)) for s in shapes]
    initial = [p.data.copy() for p in ours]
    theirs = [f64(p.data.copy()).requires_grad_() for p in ours]
    opt = optim.Adam(ours, lr=3e-3, betas=betas, eps=eps)
    official = torch.optim.Adam(theirs, lr=3e-3, betas=betas, eps=eps)
    for step in range(6):
        for p, q in zip(ours, theirs):
            # gradients from 1e-6 to 1e2
            g = rng.standard_normal(p.shape) * 10.0 ** rng.integers(-6, 3)
            p.grad, q.grad = g.copy(), f64(g)
        opt.step()
        official.step()
        assert max(max_diff(p.data, q) for p, q in zip(ours, theirs)) <= TOL, f"step {step}"
    assert min(max_diff(p.data, p0) for p, p0 in zip(ours, initial)) > 1e-3   # and they did move


def test_optimizers_refuse_a_learning_rate_that_is_not_positive_and_adam_refuses_bad_betas_or_eps():
    params = [transformer.Parameter(np.zeros(2))]
    for lr in (-0.1, 0.0, float("nan")):
        with pytest.raises(ValueError, match=rf"Adam: lr must be > 0, got {lr}"):
            optim.Adam(params, lr=lr)
    with pytest.raises(ValueError, match=r"SGD: lr must be > 0, got -1"):
        optim.SGD(params, lr=-1)
    for betas in [(0.9, 1.0), (-0.1, 0.999), (0.9,)]:
        with pytest.raises(ValueError, match=r"Adam: betas must be two numbers in \[0, 1\)"):
            optim.Adam(params, betas=betas)
    for eps in (0.0, -1e-8):
        with pytest.raises(ValueError, match=rf"Adam: eps must be > 0, got {eps}"):
            optim.Adam(params, eps=eps)
    # the edges that are allowed
    optim.Adam(params, lr=1e-3, betas=(0.0, 0.0), eps=1e-12).step()


# ---- the paper's learning rate -------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0, -1, np.array([0, 1])])
def test_noam_lr_rejects_steps_outside_its_domain(bad):
    with pytest.raises(ValueError, match="step must be an integer >= 1"):
        optim.noam_lr(bad)



@pytest.mark.parametrize("optimizer", [optim.SGD, optim.Adam], ids=["SGD", "Adam"])
def test_an_optimizer_given_the_model_says_to_pass_model_parameters(optimizer):
    model = transformer.DecoderLM(7, 8, 2, n_positions=4, n_layers=1)
    name = optimizer.__name__
    with pytest.raises(TypeError, match=rf"^{name}: pass model.parameters\(\), not the DecoderLM "
                                        rf"itself: an optimizer updates a list of Parameters$"):
        optimizer(model, lr=0.1)
    with pytest.raises(TypeError, match=rf"^{name}: parameters must be an iterable of Parameters, "
                                        rf"such as model.parameters\(\), got a Parameter$"):
        optimizer(model.parameters()[0], lr=0.1)
    assert optimizer(model.parameters(), lr=0.1).parameters == model.parameters()

@pytest.mark.parametrize("bad,kind", [(1.0, "a float"), (1.5, "a float"), (True, "a bool"),
                                      (np.array([1.0, 2.0]), "an array of float64")])
def test_noam_lr_given_a_float_step_says_the_float_is_the_problem(bad, kind):
    with pytest.raises(TypeError, match=rf"step must be an integer \(it counts updates, from 1\), "
                                        rf"got .*, {kind}$"):
        optim.noam_lr(bad)
