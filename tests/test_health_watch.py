"""trainprof.torch.watch: the reductions of tiny CPU models, published as health series."""

from __future__ import annotations

import pytest
import torch

import trainprof
import trainprof.torch as tt
from trainprof.contract import metrics as contract
from trainprof.training.health import reductions


@pytest.fixture(autouse=True)
def fresh_session():
    trainprof.stop()
    yield
    trainprof.stop()


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _train(model, opt, watcher, steps, lr_inputs=1.0):
    for _ in range(steps):
        x = torch.randn(32, 4) * lr_inputs
        y = torch.randint(0, 3, (32,))
        out = model(x)
        loss = torch.nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        trainprof.log_loss(loss)
        watcher.log_predictions(y, out)
        opt.zero_grad()


def value(name, **labels):
    return trainprof.current().value(name, **labels)


def test_healthy_run_publishes_finite_reductions_per_collection():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    w = tt.watch(model, opt, save_interval=2)
    _train(model, opt, w, 5)
    w.close()
    assert value("trainprof_tensor_saves_total") == 3  # steps 0, 2, 4
    assert value("trainprof_tensor_last_save_step") == 4
    assert value("trainprof_tensor_nan_values", collection="gradients", aggregate="max") == 0
    mean_abs = value("trainprof_tensor_mean_abs", collection="gradients", aggregate="min")
    assert 1e-7 < mean_abs < 10
    ratio = value("trainprof_tensor_update_ratio", collection="weights", aggregate="max")
    assert 0 < ratio < 1
    assert value("trainprof_training_loss_step", mode="train") == 4
    confusion = [
        value("trainprof_classification_samples_total", label_class=str(a), predicted_class=str(b))
        or 0
        for a in range(3)
        for b in range(3)
    ]
    assert sum(confusion) == 3 * 32  # saved steps only


def test_a_nan_learning_rate_shows_in_the_nan_counts():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=float("nan"))
    w = tt.watch(model, opt, save_interval=1)
    _train(model, opt, w, 3)
    w.close()
    assert value("trainprof_tensor_nan_values", collection="weights", aggregate="max") > 0
    assert value("trainprof_tensor_nan_values", collection="gradients", aggregate="max") > 0


def test_frozen_layer_counts_unchanged_saves_and_a_trained_one_does_not():
    model = _model()
    for p in model[0].parameters():
        p.requires_grad_(False)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    w = tt.watch(model, opt, save_interval=1, collections=("weights",), include_regex=r"\.weight")
    _train(model, opt, w, 4)
    w.close()
    trained = value(
        "trainprof_tensor_unchanged_saves", collection="weights", tensor="2.weight", aggregate=""
    )
    assert trained == 0
    # weights the optimizer never moves (learning rate 0): saves 1, 2, 3 equal save 0
    trainprof.stop()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    w = tt.watch(model, opt, save_interval=1, collections=("weights",))
    _train(model, opt, w, 4)
    w.close()
    assert value("trainprof_tensor_unchanged_saves", collection="weights", aggregate="min") == 3


def test_dead_relus_are_counted_per_layer():
    model = _model()
    with torch.no_grad():
        model[0].bias.fill_(-100.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    w = tt.watch(model, opt, save_interval=1, collections=("relu_output",))
    _train(model, opt, w, 2)
    w.close()
    assert value("trainprof_tensor_dead_unit_ratio", collection="relu_output", aggregate="max") == 1


def test_saturated_tanh_is_counted():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))
    with torch.no_grad():
        model[0].weight.mul_(1000.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    w = tt.watch(model, opt, save_interval=1, collections=("tanh_input",))
    _train(model, opt, w, 1, lr_inputs=10.0)
    w.close()
    got = value("trainprof_tensor_saturated_unit_ratio", collection="tanh_input", aggregate="max")
    assert got == 1


def test_no_host_copy_on_steps_that_save_nothing(monkeypatch):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    w = tt.watch(model, opt, save_interval=5)
    calls = {"tolist": 0, "item": 0}
    real_tolist, real_item = torch.Tensor.tolist, torch.Tensor.item

    def tolist(self):
        calls["tolist"] += 1
        return real_tolist(self)

    def item(self):
        calls["item"] += 1
        return real_item(self)

    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    monkeypatch.setattr(torch.Tensor, "item", item)
    _train(model, opt, w, 10)  # saves at steps 0 and 5
    monkeypatch.undo()
    w.close()
    # per saving step: one copy after the optimizer, one for what was logged after it
    assert calls["tolist"] <= 2 * 2 + 1
    assert calls["item"] == 2  # the loss, on saving steps only


def test_per_tensor_series_are_capped_and_the_cut_is_counted(monkeypatch):
    monkeypatch.setattr(contract, "MAX_TENSOR_SERIES", 1)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    w = tt.watch(model, opt, save_interval=1, collections=("weights",), include_regex=".")
    _train(model, opt, w, 1)
    w.close()
    families = {f.name: f for f in trainprof.current().families()}
    per_tensor = [s for s in families["trainprof_tensor_l2_norm"].samples if s.labels["tensor"]]
    assert len(per_tensor) == 1
    assert value("trainprof_tensor_series_cut", collection="weights") == 1


def test_errors_inside_hooks_never_reach_the_loop(monkeypatch):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    w = tt.watch(model, opt, save_interval=1)

    def broken(t):
        raise RuntimeError("boom")

    monkeypatch.setattr(reductions, "stats", broken)
    _train(model, opt, w, 2)
    w.close()
    assert value("trainprof_instrumentation_errors_total") > 0


def test_bad_arguments_fail_at_setup_with_the_valid_names():
    with pytest.raises(ValueError, match="unknown collection.*gradient.*expected"):
        tt.watch(_model(), collections=("gradient",))
    with pytest.raises(ValueError, match="save_interval"):
        tt.watch(_model(), save_interval=0)


def test_without_an_optimizer_forwards_count_steps_and_gradients_are_reduced():
    model = _model()
    w = tt.watch(model, save_interval=2, collections=("gradients",))
    for _ in range(3):
        model(torch.randn(8, 4)).sum().backward()
        model.zero_grad()
    w.close()
    assert value("trainprof_tensor_last_save_step") == 2
    assert value("trainprof_tensor_mean_abs", collection="gradients", aggregate="max") > 0


def test_log_loss_and_log_metric_without_a_watcher():
    for v in (0.5, 0.4, 0.45):
        trainprof.log_loss(torch.tensor(v), mode="validation")
    trainprof.log_metric("accuracy", 0.9, mode="eval")
    assert value("trainprof_training_loss", mode="eval") == pytest.approx(0.45)
    assert value("trainprof_training_loss_step", mode="eval") == 2
    assert value("trainprof_training_loss_saves_since_improvement", mode="eval") == 1
    assert value("trainprof_training_metric", metric="accuracy", mode="eval") == 0.9
    trainprof.log_loss("not a number")  # counted, never raised
    assert value("trainprof_instrumentation_errors_total") == 1


def test_every_health_series_is_in_the_contract_with_its_labels():
    from trainprof.training.health.state import HealthState

    state = HealthState(token_values=(0, 1))
    state.observe_save(3, 1.0)
    stats = {"mean_abs": 1, "nan": 0, "inf": 0, "zero_ratio": 0, "variance": 1, "l1": 1, "l2": 1}
    state.observe_tensor("gradients", "fc.weight", {**stats, "spread": 0.1}, include=True)
    state.observe_tensor("weights", "fc.weight", {**stats, "update_ratio": 0.1, "allclose": 1})
    state.observe_tensor("relu_output", "net.1", {"dead_ratio": 0.5})
    state.observe_tensor("tanh_input", "net.3", {"saturated_ratio": 0.5})
    for step, loss in [(0, 1.0), (10, 0.9)]:
        state.observe_loss("train", step, loss, 2.0)
    state.observe_metric("accuracy", "eval", 0.5)
    state.observe_classes({(0, 0): 3, (1, 0): 1})
    state.observe_inputs(2, {0: 0.2})
    state.observe_tokens(10, {0: 3, 1: 1})
    state.observe_feature_importance([3, 1])
    state.observe_tree_depth(2)
    identity = {"training_job": "j", "rank": "0"}
    health = {m.name for m in contract.METRICS if m.collector == "health"}
    exported = set()
    for family in state.families(identity):
        name = family.name + ("_total" if family.type == "counter" else "")
        exported.add(name)
        m = contract.BY_NAME[name]
        for sample in family.samples:
            assert set(sample.labels) == set(identity) | set(m.labels), sample
    assert exported == health


def test_the_spread_is_torch_quantile_to_the_last_bit():
    """PoorWeightInitialization's p95 - p5 comes from topk's tails, not a sort: it must be
    the value torch.quantile gives, ties, NaN and infinities included."""
    import math
    import random

    from trainprof.training.health import reductions as r

    rng = random.Random(4)
    torch.manual_seed(4)
    for n in [1, 2, 3, 20, 21, 101, 4097, 150_000] + [rng.randint(1, 20_000) for _ in range(200)]:
        for x in (torch.randn(n), torch.randint(0, 3, (n,)).float(), torch.randn(n) * 1e-7):
            if n > 5 and rng.random() < 0.2:
                x[rng.randrange(n)] = rng.choice([math.nan, math.inf, -math.inf])
            sample = x[:: -(-n // r.SPREAD_SAMPLE)] if n > r.SPREAD_SAMPLE else x
            q = torch.quantile(sample, torch.tensor([0.05, 0.95]))
            want, got = float(q[1] - q[0]), float(r.spread(x))
            assert got == want or (math.isnan(got) and math.isnan(want)), (n, want, got)
