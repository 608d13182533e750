"""More tiny CPU models trained into a condition and into health, for the tensor rules that
test_health_live.py does not drive: Overfit, Overtraining, TensorVariance, SaturatedActivation,
Confusion, NLPSequenceRatio and SimilarAcrossRuns (two runs). As there, the live series go
through the compiled rules in promtool after every step, the same run written as an smdebug
trial is replayed through the same rules, and both must agree on what fired."""

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


@pytest.fixture(autouse=True)
def fresh_session():
    trainprof.stop()
    yield
    trainprof.stop()


def _config(*rules: dict):
    return load_config({"rules": list(rules)})


def _classifier(activation=torch.nn.ReLU, width=16):
    return torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(32, width),
        activation(),
        torch.nn.Linear(width, 2),
    )


def _images(n, seed, shuffled=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, 4, 4, generator=g)
    y = (x[:, 0].mean(dim=(1, 2)) > 0).long()  # learnable: the sign of channel 0's mean
    if shuffled:
        y = y[torch.randperm(n, generator=g)]  # labels unrelated to the inputs
    return x, y


class Run:
    """One training run, recorded both ways: the session's families after every step (live)
    and the tensors smdebug would have saved (the trial)."""

    def __init__(self, job, model, lr, save_interval=1):
        trainprof.start(training_job=job, serve=False, rank=0, local_rank=0, world_size=1)
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=lr)
        self.watcher = tt.watch(model, self.opt, save_interval=save_interval)
        self.names = [n for n, _ in model.named_parameters()]
        self.saves: list[Save] = []
        self.trial: dict[int, dict] = {}
        self.modes: dict[str, str] = {}
        self.activations: dict[str, np.ndarray] = {}
        kinds = {torch.nn.ReLU: "relu", torch.nn.Tanh: "tanh", torch.nn.Sigmoid: "sigmoid"}
        for index, module in enumerate(m for m in model.modules() if type(m) in kinds):
            kind = kinds[type(module)]
            module.register_forward_hook(
                lambda m, a, out, tag=f"{kind}{index}": self.activations.update(
                    {
                        f"{tag}_input_0": a[0].detach().clone().numpy(),
                        f"{tag}_output_0": out.detach().clone().numpy(),
                    }
                )
            )

    def step(self, step, x, y, *, val=None, tokens=None, predictions=True):
        weights = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        out = self.model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in self.model.named_parameters()}
        self.opt.step()
        trainprof.log_loss(loss)
        tensors = {
            **{n: weights[n].numpy() for n in self.names},
            **{f"gradient/{n}": grads[n].numpy() for n in self.names},
            **{k: v for k, v in self.activations.items() if "relu" in k or "_input_" in k},
            "CrossEntropyLoss_output_0": np.float32(loss.item()),
        }
        if val is not None:
            with torch.no_grad():
                val_loss = torch.nn.functional.cross_entropy(self.model(val[0]), val[1])
            trainprof.log_loss(val_loss, mode="eval", step=step)
            tensors["val_CrossEntropyLoss_output_0"] = np.float32(val_loss.item())
            self.modes["val_CrossEntropyLoss_output_0"] = "eval"
        if predictions:
            self.watcher.log_predictions(y, out)
            tensors["labels"] = y.numpy()
            tensors["predictions"] = out.detach().argmax(dim=1).numpy()
        if tokens is not None:
            self.watcher.log_tokens(tokens)
            tensors["embedding0_input_0"] = tokens.numpy()
        self.opt.zero_grad()
        self.watcher.publish()
        if step % self.watcher.save_interval == 0:
            self.trial[step] = tensors
        self.saves.append(Save(step, 1.7e9 + step, list(trainprof.current().families())))

    def finish(self, root):
        self.watcher.close()
        collections = {
            "weights": [n for n in self.names if n.endswith("weight")],
            "biases": [n for n in self.names if n.endswith("bias")],
        }
        return write_trial(root, self.trial, collections=collections, modes=self.modes)


def _fired(result) -> set[str]:
    return {name for name, v in result.rules.items() if v.fired}


def verdicts(run: Run, config, root) -> set[str]:
    """What fired live; asserts the replay of the same run's trial agrees."""
    trial = run.finish(root)
    live = _fired(evaluate_saves(run.saves, config))
    assert live == _fired(replay_trial(str(trial), config)), root.name
    return live


# --- Overfit: memorising a few samples whose labels carry no signal -------------------------

OVERFIT = _config({"rule": "Overfit", "parameters": {"start_step": 4}})


def overfit_run(condition, tmp_path):
    torch.manual_seed(0)
    run = Run(condition, _classifier(), lr=0.1)
    memorise = condition == "memorise"
    x, y = _images(8 if memorise else 256, seed=1, shuffled=memorise)
    val = _images(256, seed=2, shuffled=memorise)
    for step in range(STEPS):
        run.step(step, x, y, val=val)
    return verdicts(run, OVERFIT, tmp_path / condition)


def test_overfit_fires_on_memorised_noise(promtool, tmp_path):
    assert overfit_run("memorise", tmp_path) == {"Overfit"}


def test_overfit_is_quiet_when_validation_follows_training(promtool, tmp_path):
    assert overfit_run("healthy", tmp_path) == set()


# --- Overtraining: the loss stops improving --------------------------------------------------

OVERTRAINING = _config({"rule": "Overtraining"})


def overtraining_run(condition, tmp_path):
    torch.manual_seed(0)
    run = Run(condition, _classifier(), lr=0.0 if condition == "frozen" else 0.5)
    x, y = _images(64, seed=0)
    for step in range(STEPS):
        run.step(step, x, y)
    return verdicts(run, OVERTRAINING, tmp_path / condition)


def test_overtraining_fires_when_the_loss_stops_improving(promtool, tmp_path):
    assert overtraining_run("frozen", tmp_path) == {"Overtraining"}


def test_overtraining_is_quiet_while_the_loss_improves(promtool, tmp_path):
    assert overtraining_run("healthy", tmp_path) == set()


# --- TensorVariance and SaturatedActivation: badly scaled weights ----------------------------

SCALE = _config(
    {"rule": "TensorVariance", "parameters": {"max_threshold": 100}},
    {"rule": "SaturatedActivation"},
)


def scale_run(condition, activation, tmp_path):
    torch.manual_seed(0)
    model = _classifier(activation)
    if condition == "huge_weights":
        with torch.no_grad():
            model[1].weight.mul_(10000.0)
    run = Run(f"{condition}-{activation.__name__}", model, lr=0.01)
    x, y = _images(64, seed=0)
    for step in range(STEPS):
        run.step(step, x, y)
    return verdicts(run, SCALE, tmp_path / f"{condition}-{activation.__name__}")


@pytest.mark.parametrize("activation", [torch.nn.Tanh, torch.nn.Sigmoid])
def test_huge_weights_saturate_and_blow_the_variance(promtool, tmp_path, activation):
    assert scale_run("huge_weights", activation, tmp_path) == {
        "TensorVariance",
        "SaturatedActivation",
    }


@pytest.mark.parametrize("activation", [torch.nn.Tanh, torch.nn.Sigmoid])
def test_default_initialisation_is_quiet(promtool, tmp_path, activation):
    assert scale_run("healthy", activation, tmp_path) == set()


# --- Confusion: a classifier that cannot separate the classes -------------------------------

CONFUSION = _config({"rule": "Confusion"})


def confusion_run(condition, tmp_path):
    torch.manual_seed(0)
    model = _classifier()
    # a classifier trained unwatched first, then fine-tuned under watch on new data whose
    # labels follow the inputs (healthy) or do not (shuffled labels)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    x, y = _images(512, seed=0)
    for _ in range(200):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    run = Run(condition, model, lr=0.05)
    x, y = _images(128, seed=3, shuffled=condition == "shuffled_labels")
    for step in range(STEPS):
        run.step(step, x, y)
    return verdicts(run, CONFUSION, tmp_path / condition)


def test_confusion_fires_on_labels_unrelated_to_the_inputs(promtool, tmp_path):
    assert confusion_run("shuffled_labels", tmp_path) == {"Confusion"}


def test_confusion_is_quiet_for_a_trained_classifier(promtool, tmp_path):
    assert confusion_run("healthy", tmp_path) == set()


# --- NLPSequenceRatio: batches that are mostly padding ---------------------------------------

NLP = _config({"rule": "NLPSequenceRatio"})


class BagOfTokens(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = torch.nn.Embedding(50, 8, padding_idx=0)
        self.head = torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Linear(8, 2))

    def forward(self, ids):
        return self.head(self.embedding(ids).mean(dim=1))


def nlp_run(condition, tmp_path):
    torch.manual_seed(0)
    run = Run(condition, BagOfTokens(), lr=0.5)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 50, (32, 20), generator=g)
    lengths = torch.randint(2, 8, (32,)) if condition == "padded" else torch.randint(17, 21, (32,))
    ids[torch.arange(20)[None, :] >= lengths[:, None]] = 0  # right padding
    y = (ids[:, 0] % 2).long()
    for step in range(STEPS):
        run.step(step, ids, y, tokens=ids, predictions=False)
    return verdicts(run, NLP, tmp_path / condition)


def test_nlp_sequence_ratio_fires_on_mostly_padding(promtool, tmp_path):
    assert nlp_run("padded", tmp_path) == {"NLPSequenceRatio"}


def test_nlp_sequence_ratio_is_quiet_on_full_sequences(promtool, tmp_path):
    assert nlp_run("healthy", tmp_path) == set()


# --- SimilarAcrossRuns: two runs of one job, seeded alike or not -----------------------------


def _similar_run(job, seed, tmp_path):
    torch.manual_seed(seed)
    run = Run(job, _classifier(), lr=0.5)
    x, y = _images(64, seed=0)
    for step in range(STEPS):
        run.step(step, x, y, predictions=False)
    trainprof.stop()
    return run, run.finish(tmp_path / job)


def similar_verdict(other_seed, tmp_path) -> bool:
    a, trial_a = _similar_run("run-a", 0, tmp_path)
    b, trial_b = _similar_run("run-b", other_seed, tmp_path)
    # one Prometheus scrapes both jobs: each evaluation sees both runs' series as of that step
    both = [
        Save(sa.step, sa.wall_time, sa.families + sb.families)
        for sa, sb in zip(a.saves, b.saves, strict=True)
    ]
    live = evaluate_saves(
        both, _config({"rule": "SimilarAcrossRuns", "parameters": {"other_trials": "run-b"}})
    )
    replayed = replay_trial(
        str(trial_a),
        _config({"rule": "SimilarAcrossRuns", "parameters": {"other_trials": str(trial_b)}}),
    )
    fired = live.rules["SimilarAcrossRuns"].fired
    assert fired == replayed.rules["SimilarAcrossRuns"].fired
    if fired:
        assert live.rules["SimilarAcrossRuns"].first_fired_step == 0
        assert replayed.rules["SimilarAcrossRuns"].first_fired_step == 0
    return fired


def test_similar_across_runs_fires_when_the_seeds_differ(promtool, tmp_path):
    assert similar_verdict(other_seed=1, tmp_path=tmp_path)


def test_similar_across_runs_is_quiet_for_a_reproduced_run(promtool, tmp_path):
    assert not similar_verdict(other_seed=0, tmp_path=tmp_path)
