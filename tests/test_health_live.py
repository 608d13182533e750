"""Tiny CPU models trained into each condition (and into health): the live series go through
the compiled rules in promtool, and so does the same run written as an smdebug trial; each
rule fires on its condition, stays quiet on the healthy run, and both paths agree."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import trainprof
import trainprof.torch as tt
from trainprof.replay.tensors import Save, evaluate_saves, replay_trial
from trainprof.rules.config import load_config

from smdebug_writer import write_trial

STEPS = 24
CONFIG = load_config(
    {
        "rules": [
            {"rule": "VanishingGradient"},
            {"rule": "ExplodingTensor"},
            {"rule": "LossNotDecreasing"},
            {"rule": "UnchangedTensor"},
            {"rule": "WeightUpdateRatio"},
            {"rule": "DeadRelu"},
            {"rule": "AllZero", "parameters": {"collection_names": "gradients"}},
            {"rule": "ClassImbalance", "parameters": {"samples": 200}},
            {"rule": "CheckInputImages", "parameters": {"threshold_samples": 100}},
            {"rule": "PoorWeightInitialization"},
        ]
    }
)


@pytest.fixture(autouse=True)
def fresh_session():
    trainprof.stop()
    yield
    trainprof.stop()


def _data(condition, n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, 4, 4, generator=g)
    y = (x[:, 0].mean(dim=(1, 2)) > 0).long()  # learnable: the sign of channel 0's mean
    if condition == "imbalanced":
        y = torch.zeros(n, dtype=torch.long)
        y[:1] = 1
    if condition == "constant_input":
        x = torch.ones_like(x)
    return x, y


def run(condition, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(32, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 16),
        torch.nn.ReLU(),
        torch.nn.Linear(16, 2),
    )
    lr = {"nan_lr": float("nan"), "frozen": 0.0}.get(condition, 0.5)
    if condition == "dead_relu":
        with torch.no_grad():
            model[1].bias.fill_(-100.0)
    if condition == "poor_init":
        with torch.no_grad():
            model[3].weight.mul_(1000.0)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    trainprof.start(training_job="tiny", serve=False, rank=0, local_rank=0, world_size=1)
    watcher = tt.watch(model, opt, save_interval=1)
    relu = {}
    for i in (2, 4):
        model[i].register_forward_hook(
            lambda m, a, out, i=i: relu.update(
                {
                    f"relu{i // 2 - 1}_output_0": out.detach().clone().numpy(),
                    f"relu{i // 2 - 1}_input_0": a[0].detach().clone().numpy(),
                }
            )
        )
    saves, trial = [], {}
    x, y = _data(condition)
    names = [n for n, _ in model.named_parameters()]
    for step in range(STEPS):
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        trainprof.log_loss(loss)
        watcher.log_predictions(y, out)
        watcher.log_inputs(x)
        opt.zero_grad()
        watcher.publish()
        trial[step] = {
            **{n: weights[n].numpy() for n in names},
            **{f"gradient/{n}": grads[n].numpy() for n in names},
            **relu,
            "CrossEntropyLoss_output_0": np.float32(loss.item()),
            "labels": y.numpy(),
            "predictions": out.detach().argmax(dim=1).numpy(),
            "model_input_0": x.numpy(),
        }
        saves.append(Save(step, 1.7e9 + step, list(trainprof.current().families())))
    watcher.close()
    live = evaluate_saves(saves, CONFIG)
    collections = {
        "weights": [n for n in names if n.endswith("weight")],
        "biases": [n for n in names if n.endswith("bias")],
    }
    root = write_trial(tmp_path / condition, trial, collections=collections)
    replayed = replay_trial(str(root), CONFIG)
    fired = {name for name, v in live.rules.items() if v.fired}
    assert fired == {name for name, v in replayed.rules.items() if v.fired}, condition
    return fired


def test_healthy_run_is_quiet(promtool, tmp_path):
    assert run("healthy", tmp_path) == set()


def test_nan_learning_rate_explodes(promtool, tmp_path):
    assert "ExplodingTensor" in run("nan_lr", tmp_path)


def test_frozen_model_is_unchanged_and_its_loss_does_not_decrease(promtool, tmp_path):
    fired = run("frozen", tmp_path)
    assert {"UnchangedTensor", "WeightUpdateRatio", "LossNotDecreasing"} <= fired
    assert "ExplodingTensor" not in fired


def test_dead_relus_and_their_vanished_gradients(promtool, tmp_path):
    fired = run("dead_relu", tmp_path)
    assert {"DeadRelu", "VanishingGradient", "AllZero"} <= fired


def test_imbalanced_dataset(promtool, tmp_path):
    assert "ClassImbalance" in run("imbalanced", tmp_path)


def test_constant_input_images(promtool, tmp_path):
    assert "CheckInputImages" in run("constant_input", tmp_path)


def test_poor_initialisation(promtool, tmp_path):
    assert "PoorWeightInitialization" in run("poor_init", tmp_path)
