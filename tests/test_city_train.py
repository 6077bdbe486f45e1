"""Tests for code/lecture06/city_train.py: the harness that trains small models on the city
language. Tiny configurations, so the whole file runs in a few seconds."""
import math

import pytest

from lecture06 import city_lab, city_train


TINY_MODEL = dict(n_layers=1, n_embd=16, n_head=2)
TINY_TRAINING = dict(lr=1e-2, steps=20, eval_every=10)


def test_a_one_layer_model_trains_below_the_bigram_baseline():
    result = city_train.run(model=dict(n_layers=1, n_embd=32, n_head=2),
                            training=dict(lr=3e-3, steps=150, eval_every=50))
    steps, train_excess, test_excess = zip(*result.curve)
    assert (steps == (0, 50, 100, 150) and train_excess[0] is None
            and len(result.train_excess) == 150)
    # untrained: worse than unigram
    assert test_excess[0] > city_lab.baseline_excess_mnats()["unigram"]
    assert result.final_excess == test_excess[-1] < city_lab.baseline_excess_mnats()["bigram"]
    assert result.best_excess == min(test_excess)
    # every batch is fresh data, so the batch excess tracks the test excess
    assert abs(train_excess[-1] - test_excess[-1]) < 0.5 * test_excess[-1]
    assert result.train_excess[0] == pytest.approx(test_excess[0], rel=0.1)


def test_runs_are_deterministic_and_runs_in_worker_processes_equal_runs_here():
    from lecture06 import runner
    import torch
    configs = [dict(model=dict(TINY_MODEL, seed=s), training=dict(TINY_TRAINING, seed=s))
               for s in (10, 11, 10)]
    threads = torch.get_num_threads()
    here = [city_train.run(**config) for config in configs]
    assert torch.get_num_threads() == threads  # train() restores the caller's thread count
    runner.forget()
    in_workers = runner.map(city_train.run, configs, workers=2)
    for p, s in zip(in_workers, here):
        assert p.curve == s.curve and p.train_excess == s.train_excess  # bit for bit
    assert here[0].curve == here[2].curve and here[0].curve != here[1].curve
    assert city_train.train_many(configs) == in_workers   # kept: asked again, not trained again


def test_inits():
    import torch
    from lecture06 import torch_ref
    for init in city_train.INITS:
        model = city_train.build_model(n_layers=2, n_embd=64, n_head=4, init=init, seed=3)
        assert all(p.dtype == torch.float32 for p in model.parameters())
        w = model.layers[0].ff.linear_in.weights.detach()                              # (64, 256)
        emb = model.token_embeddings.weights.detach()
        b = model.layers[0].ff.linear_in.bias.detach()
        if init == "xavier":  # U(±√(6/(fan_in + fan_out))): variance 2/(fan_in + fan_out)
            assert (float(w.abs().max()) <= (6 / 320) ** 0.5
                    and float(w.var()) == pytest.approx(2 / 320, rel=0.1))
        elif init == "gpt2":
            assert float(w.std()) == pytest.approx(0.02, rel=0.1)
        else:  # PyTorch's default: U(±1/√fan_in), embeddings N(0, 1)
            assert (float(w.abs().max()) <= 1 / 8
                    and float(w.var()) == pytest.approx(1 / 192, rel=0.1))
        assert float(emb.std()) == pytest.approx(1.0 if init == "default" else 0.02, rel=0.1)
        assert (float(b.abs().max()) == 0.0) == (init != "default")
    # the same seed gives the same model; Pre-LN ends with
    # a final LayerNorm (GPT-2's ln_f), Post-LN does not
    a, b = city_train.build_model(n_layers=2, seed=5), city_train.build_model(n_layers=2, seed=5)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert (isinstance(a.ln, torch_ref.LayerNorm)
            and city_train.build_model(n_layers=2, pre_ln=False).ln is None)


def test_learning_rate_schedules():
    f = city_train.lr_factor
    assert [f(s, 10, 4, "constant") for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert f(0, 10, 0, "constant") == 1.0
    assert f(4, 10, 4, "linear") == 1.0 and f(7, 10, 4, "linear") == 0.5
    assert f(2, 10, 0, "cosine") == pytest.approx(0.5 + 0.5 * math.cos(0.2 * math.pi))
    # symmetric about the middle
    assert f(2, 10, 0, "cosine") + f(8, 10, 0, "cosine") == pytest.approx(1.0)


def test_checkpoints_and_their_average():
    import torch
    model = city_train.build_model(n_layers=1, n_embd=16, n_head=2)
    result = city_train.train(model, steps=20, lr=1e-2, eval_every=10, checkpoint_every=5)
    assert [step for step, _ in result.checkpoints] == [5, 10, 15, 20]
    last = result.checkpoints[-1][1]
    assert all(torch.equal(last[k], v) for k, v in model.state_dict().items())
    first = result.checkpoints[0][1]
    mean = city_train.average_state_dicts([first, last])
    assert all(torch.allclose(mean[k], (first[k] + last[k]) / 2) for k in first)
    model.load_state_dict(last)
    assert city_train.evaluate(model) == result.final_excess


def test_averages_scored_in_the_run_equal_the_checkpoints_averaged_afterwards():
    """What a run sends back instead of its checkpoints: the test excess of each average, the same
    bits as averaging the checkpoints and scoring them afterwards, in the plain loop (train) and in
    a stack (run); a step the run never reached scores inf."""
    averages = [[20], [15, 20], [5, 10, 15, 20], [10]]
    training = dict(steps=20, lr=1e-2, eval_every=None, checkpoint_every=5, averages=averages)
    model = city_train.build_model(**TINY_MODEL, seed=2)
    alone = city_train.train(model, seed=2, **training)
    stacked = city_train.train_stack(TINY_MODEL, training, seeds=[1, 2])[1]
    for result in (alone, stacked):
        checkpoints = dict(result.checkpoints)
        afterwards = []
        for steps in averages:
            scorer = city_train.build_model(**TINY_MODEL)
            scorer.load_state_dict(city_train.average_state_dicts([checkpoints[s] for s in steps]))
            afterwards.append(city_train.evaluate(scorer))
        assert list(result.averaged_excess.values()) == afterwards
        assert list(result.averaged_excess) == [tuple(steps) for steps in averages]
        # the last step's own excess is the one training scored
        assert afterwards[0] == result.final_excess
    # train() scores the averages on a copy: the model keeps its trained weights
    assert city_train.evaluate(model) == alone.final_excess
    # lr 1e30: the loss leaves float32's range within a few steps, before step 20
    doomed = city_train.run(model=dict(TINY_MODEL, seed=0),
                            training=dict(steps=20, lr=1e30, eval_every=None,
                                          averages=[[1], [20]]))
    assert len(doomed.train_excess) < 20 and doomed.averaged_excess[(20,)] == math.inf


def test_harness_bad_input_gets_a_clear_error():
    with pytest.raises(ValueError, match="init must be one of"):
        city_train.build_model(init="he")
    with pytest.raises(ValueError, match="multiple of n_head"):
        city_train.build_model(n_embd=30, n_head=4)
    model = city_train.build_model(n_layers=1, n_embd=16, n_head=2)
    with pytest.raises(ValueError, match="schedule must be one of"):
        city_train.train(model, schedule="step")
    with pytest.raises(ValueError, match="warmup <= steps"):
        city_train.train(model, steps=10, warmup=20)
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_layer'"):
        city_train.run(model=dict(n_layer=2), training={})
    with pytest.raises(ValueError, match="at least one"):
        city_train.average_state_dicts([])
    for averages in ([[]], [[0, 10]], [[10, 21]], [[2.5]]):
        with pytest.raises(ValueError, match=r"averages: each is a non-empty list of steps in "
                                             r"1\.\.20"):
            city_train.run(model=TINY_MODEL, training=dict(steps=20, averages=averages))


def test_train_many_after_the_parent_used_several_threads_does_not_hang():
    """A forked worker that went back to the parent's thread
    count hung in OpenMP sending its results home."""
    import subprocess
    import sys
    program = ("import torch; torch.set_num_threads(2); a = torch.randn(256, 256)\n"
               "for _ in range(10): a @ a\n"
               "from lecture06 import city_train\n"
               "model, training = dict(n_layers=1, n_embd=16, n_head=2), "
               "dict(steps=4, eval_every=2)\n"
               "from lecture06 import runner\n"
               "runs = runner.map(city_train.run, "
               "[dict(model=model, training=dict(training, seed=s)) for s in (0, 1)],\n"
               "                  workers=2)\n"
               "print(len(runs))\n")
    # -W error: Python 3.12+ warns when a process that
    # runs threads forks; the runner must not fork it
    done = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", program],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "2"


def test_the_harness_adam_is_torch_optim_adam_bit_for_bit():
    import torch
    model = city_train.build_model(n_layers=1, n_embd=16, n_head=2, seed=4)
    twin = city_train.build_model(n_layers=1, n_embd=16, n_head=2, seed=4)
    ours, theirs = (city_train.Adam(model.parameters(), lr=3e-3),
                    torch.optim.Adam(twin.parameters(), lr=3e-3, fused=True))
    x = torch.tensor(city_lab.test_set().x[:4])
    for step in range(5):
        for m, opt in ((model, ours), (twin, theirs)):
            opt.zero_grad()
            m(x).square().mean().backward()
            opt.lr = 3e-3 * (step + 1) / 5  # our lr, as train() sets it each step
            for group in getattr(opt, "param_groups", []):
                group["lr"] = 3e-3 * (step + 1) / 5
            opt.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), twin.parameters()))
