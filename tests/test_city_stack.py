"""city_stack.StackedDecoderLM and city_train.train_stack: E runs as one model compute what E lone
torch_ref.DecoderLMs compute (float64, to rounding), and a run's bits do not depend on its stack."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lecture06 import city_lab, city_stack, city_train


def _named_gradients(stack, e: int, model) -> dict:
    """Run e's gradients in the stack under model's parameter names (q, k, v cut out of qkv)."""
    grads = {}
    for name, p in model.named_parameters():
        if any(f"{x}_projection" in name for x in "qkv"):
            layer, rest = name.split(".attention.")
            which, part = "qkv".index(rest[0]), name.rsplit(".", 1)[1]
            joined = stack.params[f"{layer}.qkv.{part}"].grad[e]
            d = joined.shape[-1] // 3
            grads[name] = joined[..., which * d:(which + 1) * d].reshape(p.shape)
        else:
            grads[name] = stack.params[name].grad[e].reshape(p.shape)
    return grads


@pytest.mark.parametrize("pre_ln", [True, False])
def test_a_stack_computes_what_lone_models_compute_in_float64(pre_ln):
    models = [city_train.build_model(n_layers=2, n_embd=32, n_head=4, pre_ln=pre_ln,
                                     seed=s).double()
              for s in (0, 1, 2)]
    stack = city_stack.StackedDecoderLM(models)
    batches = [next(city_lab.training_batches(s, 4)) for s in (0, 1, 2)]
    x = torch.from_numpy(np.stack([b.x for b in batches]))          # (E, B, S)
    y = torch.from_numpy(np.stack([b.y for b in batches]))
    losses = city_stack.losses(stack(x), y.view(3, -1))
    losses.sum().backward()
    for e, model in enumerate(models):
        loss = F.cross_entropy(model(x[e]).reshape(-1, city_lab.V), y[e].reshape(-1))
        loss.backward()
        assert abs(loss.item() - losses[e].item()) < 1e-14
        grads = _named_gradients(stack, e, model)
        worst = max(float((grads[n] - p.grad).abs().max()) for n, p in model.named_parameters())
        assert worst < 1e-13


def test_state_dicts_give_back_each_models_parameters_exactly():
    models = [city_train.build_model(n_layers=2, n_embd=32, n_head=2, seed=s) for s in (4, 5)]
    for model, state in zip(models, city_stack.StackedDecoderLM(models).state_dicts()):
        expected = model.state_dict()
        assert state.keys() == expected.keys()
        assert all(torch.equal(state[k], v) for k, v in expected.items())


SMALL = dict(n_layers=2, n_embd=32, n_head=2, pre_ln=False)
TRAINING = dict(lr=6e-3, warmup=10, steps=40, eval_every=20, checkpoint_every=20)


def _same(a, b) -> bool:
    return (a.curve == b.curve and a.train_excess == b.train_excess
            and [s for s, _ in a.checkpoints] == [s for s, _ in b.checkpoints]
            and all(torch.equal(x[k], y[k]) for (_, x), (_, y) in zip(a.checkpoints, b.checkpoints)
                    for k in x))


def test_a_run_gets_the_same_bits_alone_and_in_any_stack():
    runs = [dict(model=dict(SMALL, seed=s), training=dict(TRAINING, seed=s)) for s in range(7)]
    in_stacks = city_train.train_many(runs)                      # stacks of 5 and 2
    reversed_stack = city_train.train_stack(SMALL, TRAINING, seeds=[(s, s) for s in (4, 2, 0)])
    for seed in (0, 2, 4, 6):
        alone = city_train.run(**runs[seed])
        assert _same(alone, in_stacks[seed])
    assert all(_same(r, in_stacks[s]) for r, s in zip(reversed_stack, (4, 2, 0)))


def test_a_run_that_diverges_ends_alone_and_leaves_its_stack_mates_as_they_were():
    healthy = dict(lr=3e-3, steps=30, eval_every=None)
    # a lr of 1e30 sends the weights, and so the loss, past float32's range within a few steps
    mixed = city_train.train_many([dict(model=dict(SMALL, seed=1), training=dict(healthy, seed=1)),
                                   dict(model=dict(SMALL, seed=1), training=dict(healthy, seed=1,
                                                                                 lr=1e30))])
    doomed = city_train.train_stack(SMALL, dict(healthy, lr=1e30), seeds=[1, 2])
    assert doomed[0].final_excess == np.inf and len(doomed[0].train_excess) < 30
    assert _same(mixed[0], city_train.run(model=dict(SMALL, seed=1),
                                          training=dict(healthy, seed=1)))
    assert _same(mixed[1], doomed[0])


def test_runs_of_another_shape_or_schedule_go_into_stacks_of_their_own():
    runs = [dict(model=dict(SMALL, seed=s, pre_ln=p), training=dict(TRAINING, seed=s, lr=lr))
            for p in (True, False) for lr in (1e-3, 6e-3) for s in range(6)]
    stacks, members = city_train._stacks(runs)
    assert [len(s["seeds"]) for s in stacks] == [5, 1] * 4
    assert all(runs[i]["model"]["pre_ln"] == stacks[s]["model"]["pre_ln"] and
               runs[i]["training"]["lr"] == stacks[s]["training"]["lr"] and
               stacks[s]["seeds"][m] == (runs[i]["model"]["seed"],) * 2
               for i, (s, m) in enumerate(members))


def test_train_stack_says_which_arguments_it_does_not_take():
    with pytest.raises(ValueError, match=r"unknown training arguments \['epochs'\]"):
        city_train.train_stack(SMALL, dict(epochs=3), seeds=[0])
    with pytest.raises(ValueError, match="no seeds; give one or more"):
        city_train.train_stack(SMALL, {}, seeds=[])
    with pytest.raises(ValueError, match="a run is dict"):
        city_train.train_many([dict(model=SMALL)])
    with pytest.raises(ValueError, match="learned positions and an lm_head"):
        city_stack.StackedDecoderLM(
            [city_train.torch_ref.DecoderLM(10, 16, 2, 8, tie_weights=True)])
