"""Framework callbacks, each training a tiny model on the CPU and scraped over HTTP."""

from __future__ import annotations

import os
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import trainprof
from conftest import require_module, skip_or_fail

torch = require_module("torch")

# Third-party frameworks warn about CPU-only runs, few workers and the like.
pytestmark = pytest.mark.filterwarnings("ignore")

SAMPLES, BATCH = 64, 8


@pytest.fixture(autouse=True)
def fresh_session(monkeypatch):
    for var in ("TRAINPROF_BASE_PORT", "RANK", "LOCAL_RANK", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(var, raising=False)
    trainprof.stop()
    yield
    trainprof.stop()


def scrape() -> list:
    port = trainprof.current().port
    assert port, "the callback did not start serving"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def value(samples, name: str, **labels: str) -> float | None:
    for s in samples:
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return None


def assert_timestamps(samples, before: float) -> None:
    start = value(samples, "trainprof_training_start_timestamp_seconds")
    first = value(samples, "trainprof_training_first_step_timestamp_seconds")
    last = value(samples, "trainprof_training_last_step_timestamp_seconds")
    assert start <= before < first <= last <= time.time()


def tensors(n: int = SAMPLES):
    generator = torch.Generator().manual_seed(0)
    return torch.randn(n, 4, generator=generator), torch.randn(n, 1, generator=generator)


def test_lightning_callback():
    pl = require_module("lightning.pytorch")
    from trainprof.integrations.lightning import TrainprofCallback

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.TensorDataset(*tensors())
    trainer = pl.Trainer(
        max_epochs=2,
        limit_val_batches=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[TrainprofCallback(port=0, addr="127.0.0.1")],
    )
    before = time.time()
    trainer.fit(
        Tiny(),
        torch.utils.data.DataLoader(data, batch_size=BATCH),
        torch.utils.data.DataLoader(data, batch_size=BATCH),
    )

    samples = scrape()
    assert value(samples, "trainprof_training_steps_total", mode="train") == 2 * SAMPLES / BATCH
    assert value(samples, "trainprof_training_steps_total", mode="eval") == 2 * 2  # no sanity
    assert value(samples, "trainprof_training_samples_total") == 2 * SAMPLES
    for phase in ("dataloader", "forward", "backward", "optimizer", "evaluation"):
        assert value(samples, "trainprof_training_phase_seconds_total", phase=phase) > 0, phase
    assert value(samples, "trainprof_training_info", framework="lightning") == 1
    # losses: every train batch (no watcher), and each validation run's mean at global step
    assert value(samples, "trainprof_training_loss_step", mode="train") == 2 * SAMPLES / BATCH - 1
    assert value(samples, "trainprof_training_loss_step", mode="eval") == 2 * SAMPLES / BATCH
    assert 0 < value(samples, "trainprof_training_loss", mode="eval") < 10
    assert value(samples, "trainprof_instrumentation_errors_total") == 0
    assert_timestamps(samples, before)


def test_huggingface_trainer_callback(tmp_path):
    transformers = require_module("transformers")
    from trainprof.integrations.huggingface import TrainprofCallback

    class TinyRegressor(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x, labels=None):
            out = self.linear(x)
            loss = None if labels is None else torch.nn.functional.mse_loss(out, labels)
            return {"loss": loss, "logits": out}

    x, y = tensors()
    rows = [{"x": x[i], "labels": y[i]} for i in range(SAMPLES)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH,
        gradient_accumulation_steps=2,
        num_train_epochs=1,
        learning_rate=0.01,
        report_to=[],
        logging_steps=1000,
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = transformers.Trainer(
        model=TinyRegressor(),
        args=args,
        train_dataset=rows,
        eval_dataset=rows[:16],
        callbacks=[TrainprofCallback(port=0, addr="127.0.0.1")],
    )
    before = time.time()
    trainer.train()
    trainer.evaluate()
    trainer.log({"loss": 0.75})  # what the Trainer logs every logging_steps

    samples = scrape()
    # One step per optimizer step: two micro-batches each.
    assert value(samples, "trainprof_training_steps_total", mode="train") == SAMPLES / BATCH / 2
    assert value(samples, "trainprof_training_steps_total", mode="eval") == 16 / BATCH
    assert value(samples, "trainprof_training_samples_total") == SAMPLES
    for phase in ("dataloader", "forward", "backward", "optimizer", "evaluation"):
        assert value(samples, "trainprof_training_phase_seconds_total", phase=phase) > 0, phase
    assert value(samples, "trainprof_training_info", framework="transformers") == 1
    assert value(samples, "trainprof_training_loss", mode="train") == 0.75
    assert value(samples, "trainprof_training_loss_step", mode="train") == SAMPLES / BATCH / 2
    assert 0 < value(samples, "trainprof_training_loss", mode="eval") < 10
    assert value(samples, "trainprof_instrumentation_errors_total") == 0
    assert_timestamps(samples, before)


def test_keras_callback_on_the_torch_backend(monkeypatch):
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = require_module("keras")
    if keras.backend.backend() != "torch":
        skip_or_fail(f"keras was imported with the {keras.backend.backend()} backend")
    from trainprof.integrations.keras import TrainprofCallback

    x, y = tensors()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    callback = TrainprofCallback(batch_size=BATCH, port=0, addr="127.0.0.1")
    before = time.time()
    model.fit(
        x.numpy(),
        y.numpy(),
        batch_size=BATCH,
        epochs=2,
        verbose=0,
        validation_data=(x[:16].numpy(), y[:16].numpy()),
        callbacks=[callback],
    )
    model.predict(x[:16].numpy(), batch_size=BATCH, verbose=0, callbacks=[callback])

    samples = scrape()
    assert value(samples, "trainprof_training_steps_total", mode="train") == 2 * SAMPLES / BATCH
    assert value(samples, "trainprof_training_steps_total", mode="eval") == 2 * 16 / BATCH
    assert value(samples, "trainprof_training_steps_total", mode="predict") == 16 / BATCH
    assert value(samples, "trainprof_training_samples_total") == 2 * SAMPLES
    for phase in ("dataloader", "other", "evaluation"):
        assert value(samples, "trainprof_training_phase_seconds_total", phase=phase) > 0, phase
    assert value(samples, "trainprof_training_info", framework="keras") == 1
    assert value(samples, "trainprof_training_loss_step", mode="train") == 2 * SAMPLES / BATCH - 1
    assert value(samples, "trainprof_training_loss_step", mode="eval") == 2 * SAMPLES / BATCH - 1
    assert 0 < value(samples, "trainprof_training_loss", mode="train") < 10
    assert value(samples, "trainprof_instrumentation_errors_total") == 0
    assert_timestamps(samples, before)
