"""The Dataloader rule's input: each rank's DataLoader workers, as trainprof.data() reads
them; its defaults are SageMaker's (as the real ProfilerReport output states them)."""

from __future__ import annotations

import json

import pytest

import trainprof
from conftest import require_module
from trainprof.rules.config import default_config
from trainprof.training.state import TrainingState


@pytest.fixture(autouse=True)
def fresh_session(monkeypatch):
    for var in ("TRAINPROF_BASE_PORT", "TRAINPROF_RULES_CONFIG", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    trainprof.stop()
    yield
    trainprof.stop()


class Loader:
    def __init__(self, workers):
        self.num_workers = workers

    def __iter__(self):
        return iter([1, 2])


def test_iterating_a_loader_exports_its_workers():
    session = trainprof.start(serve=False)
    assert session.value("trainprof_training_dataloader_workers") is None  # not yet known
    assert list(trainprof.data(Loader(6))) == [1, 2]
    assert session.value("trainprof_training_dataloader_workers") == 6


@pytest.mark.parametrize("workers", [None, -1, "4", True, 2.5])
def test_a_loader_without_a_worker_count_exports_none_and_still_iterates(workers):
    session = trainprof.start(serve=False)
    assert list(trainprof.data(Loader(workers))) == [1, 2]
    assert list(trainprof.data([3, 4])) == [3, 4]
    assert session.value("trainprof_training_dataloader_workers") is None


def test_a_torch_dataloader_exports_num_workers():
    torch = require_module("torch")
    loader = torch.utils.data.DataLoader(list(range(4)), batch_size=2, num_workers=0)
    session = trainprof.start(serve=False)
    assert len(list(trainprof.data(loader))) == 2
    assert session.value("trainprof_training_dataloader_workers") == 0


def test_the_state_refuses_a_negative_worker_count():
    state = TrainingState({"training_job": "j"})
    with pytest.raises(ValueError, match="whole number >= 0"):
        state.set_dataloader_workers(-2)


def test_defaults_are_the_ones_sagemaker_ran_with(real_data):
    reports = sorted((real_data / "real-sagemaker").rglob("Dataloader.json"))
    assert reports
    values = default_config().rule("Dataloader").values
    for path in reports:
        parameters = dict(
            line.split(":", 1) for line in json.loads(path.read_text())["RuleParameters"].split()
        )
        assert float(parameters["min_threshold"]) == values["min_threshold"], path
        assert float(parameters["max_threshold"]) == values["max_threshold"], path


def test_replayed_sagemaker_output_gives_the_rule_no_data(real_data, promtool):
    """SageMaker's own reports of real jobs analysed 0 datapoints; replay says no data."""
    from trainprof.replay import replay

    result = replay(str(real_data / "real-sagemaker" / "trimcrae-8xtt-redock"), None)
    verdict = result.rules["Dataloader"]
    assert not verdict.fired and verdict.status.status == "no_data"
