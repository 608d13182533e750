"""Reading SageMaker Debugger trials: TFRecord framing, checksums, smdebug's tensor protobuf."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from trainprof.replay import smdebug, tfrecord

from smdebug_writer import crc32c_bitwise, event, record, write_trial


def test_crc32c_matches_the_specs_check_value_and_an_independent_implementation():
    assert tfrecord.crc32c(b"123456789") == 0xE3069283 == crc32c_bitwise(b"123456789")
    blob = bytes(range(256)) * 3
    assert tfrecord.crc32c(blob) == crc32c_bitwise(blob)


def test_tensors_round_trip_with_shape_dtype_mode_and_step(tmp_path):
    weights = np.arange(12, dtype=np.float32).reshape(3, 4) - 5
    half = np.array([1.5, -2.0, 0.25], dtype=np.float16)
    ids = np.array([[0, 7, 0], [3, 0, 0]], dtype=np.int64)
    path = tmp_path / "x.tfevents"
    path.write_bytes(
        record(event("fc1.weight", weights, 10))
        + record(event("CrossEntropyLoss_output_0", np.float32(0.25), 10, mode="eval"))
        + record(event("half", half, 10))
        + record(event("embedding0_input_0", ids, 10))
    )
    problems: list[str] = []
    events = [e for r in tfrecord.read_records(path, problems) for e in tfrecord.decode_event(r)]
    assert problems == []
    by_name = {e.name: e for e in events}
    np.testing.assert_array_equal(by_name["fc1.weight"].value, weights)
    assert by_name["fc1.weight"].value.dtype == np.float32 and by_name["fc1.weight"].step == 10
    loss = by_name["CrossEntropyLoss_output_0"]
    assert loss.mode == "eval" and loss.value.shape == (1,) and loss.value[0] == 0.25
    np.testing.assert_array_equal(by_name["half"].value, half)  # smdebug's DT_INT32 tag
    np.testing.assert_array_equal(by_name["embedding0_input_0"].value, ids)


def test_damaged_records_are_skipped_and_reported(tmp_path):
    good = record(event("a", np.ones(3, dtype=np.float32), 0))
    bad = bytearray(record(event("b", np.ones(3, dtype=np.float32), 0)))
    bad[-6] ^= 0xFF  # a data byte: the data checksum fails
    path = tmp_path / "x.tfevents"
    path.write_bytes(good + bytes(bad) + good + b"\x01\x02")  # and a truncated tail
    problems: list[str] = []
    records = list(tfrecord.read_records(path, problems))
    assert len(records) == 2
    assert "record 1" in problems[0] and "data checksum mismatch" in problems[0]
    assert "truncated" in problems[1]


def test_a_damaged_length_ends_the_file_not_the_trial(tmp_path):
    root = write_trial(
        tmp_path / "trial", {0: {"w": np.ones(2, np.float32)}, 1: {"w": np.ones(2, np.float32)}}
    )
    damaged = root / "events" / "000000000001" / "000000000001_worker_0.tfevents"
    data = bytearray(damaged.read_bytes())
    data[0] ^= 0x40
    damaged.write_bytes(bytes(data))
    trial = smdebug.read_trial(root)
    assert list(trial.steps) == [0]
    assert any("length checksum mismatch" in p for p in trial.problems)


def test_a_trial_without_events_is_a_clear_error(tmp_path):
    with pytest.raises(smdebug.TrialError, match="no events/ folder"):
        smdebug.read_trial(tmp_path)


def test_collections_file_decides_membership_and_names_fall_back(tmp_path):
    root = write_trial(
        tmp_path / "t",
        {0: {"layer_a": np.ones(2, np.float32), "gradient/fc.weight": np.ones(2, np.float32)}},
        collections={"weights": ["layer_a"]},
        ended=False,
    )
    trial = smdebug.read_trial(root)
    assert trial.collection_of("layer_a") == "weights"
    assert trial.collection_of("gradient/fc.weight") == "gradients"
    assert trial.collection_of("relu0_output_0") == "relu_output"
    assert any("training_job_end.ts" in p for p in trial.problems)


def test_fold_gives_the_same_reductions_as_numpy(tmp_path):
    rng = np.random.default_rng(0)
    g0, g1 = rng.normal(size=(4, 5)).astype(np.float32), rng.normal(size=(4, 5))
    g1 = g1.astype(np.float32)
    g1[0, 0] = np.nan
    root = write_trial(tmp_path / "t", {0: {"gradient/w": g0}, 5: {"gradient/w": g1}})
    snapshots = []
    for snap in smdebug.fold(smdebug.read_trial(root), include_regex="gradients/"):
        snapshots.append(
            (
                snap.step,
                snap.state.value(
                    "trainprof_tensor_mean_abs", collection="gradients", tensor="gradient/w"
                ),
                snap.state.value(
                    "trainprof_tensor_nan_values", collection="gradients", aggregate="max"
                ),
                snap.state.value(
                    "trainprof_tensor_variance", collection="gradients", aggregate="min"
                ),
            )
        )
    assert snapshots[0][0] == 0 and snapshots[1][0] == 5
    assert snapshots[0][1] == pytest.approx(np.abs(g0).mean(), rel=1e-6)
    assert snapshots[0][3] == pytest.approx(g0.var(), rel=1e-5)  # ddof 0, as smdebug
    assert snapshots[0][2] == 0 and snapshots[1][2] == 1


# --- trials written by smdebug's own code ---------------------------------------------------

SMDEBUG_TRIALS = Path(__file__).resolve().parent / "data" / "smdebug-trials"


def _smdebug_reading(root: Path) -> list[tuple]:
    data = json.loads((root / "smdebug-read.json").read_text())
    return sorted(
        (t["step"], t["worker"], t["name"], t["mode"].lower(), t["mode_step"], tuple(t["shape"]))
        for t in data["tensors"]
    )


@pytest.mark.parametrize(
    "name",
    ["VanishingGradient/fire-on-algo-2", "LossNotDecreasing/fire-eval-plateau", "hook-pytorch"],
)
def test_trainprof_reads_what_smdebugs_reader_reads(name):
    """Written by smdebug's FileWriter at its defaults (every footer the masked CRC of
    CHECKSUM_MAGIC_BYTES): every record is read, with its worker, mode and mode step."""
    root = SMDEBUG_TRIALS / name
    trial = smdebug.read_trial(root)
    read = sorted(
        (e.step, e.worker, e.name, e.mode, e.mode_step, e.value.shape)
        for events in trial.steps.values()
        for e in events
    )
    assert trial.problems == [] and trial.ended  # each step's damage is said as it is read
    assert read == _smdebug_reading(root)
    values = json.loads((root / "smdebug-read.json").read_text())["tensors"]
    first = next(t for t in values if t["name"].startswith("gradient/") or "Loss" in t["name"])
    event = next(
        e
        for e in trial.steps[first["step"]]
        if e.name == first["name"] and e.worker == first["worker"]
    )
    np.testing.assert_allclose(event.value.reshape(-1), first["value"], rtol=1e-6)


def test_a_damaged_footer_or_length_is_still_skipped_and_reported(tmp_path):
    root = tmp_path / "trial"
    shutil.copytree(SMDEBUG_TRIALS / "VanishingGradient" / "fire-at-3", root)
    file = root / "events" / "000000000003" / "000000000003_worker_0.tfevents"
    data = bytearray(file.read_bytes())
    assert struct.unpack("<I", data[-4:])[0] == tfrecord.SMDEBUG_FOOTER  # smdebug's default
    data[-1] ^= 0x01  # the last record's footer: neither the magic CRC nor the data's
    file.write_bytes(bytes(data))
    other = root / "events" / "000000000004" / "000000000004_worker_0.tfevents"
    damaged = bytearray(other.read_bytes())
    damaged[3] ^= 0x10  # the first record's length
    other.write_bytes(bytes(damaged))
    trial = smdebug.read_trial(root)
    list(trial.steps)  # the steps are read as they are asked for, their damage said then
    assert any(
        "000000000003_worker_0" in p and "data checksum mismatch" in p for p in trial.problems
    )
    assert any("000000000004_worker_0" in p and "length checksum" in p for p in trial.problems)
    assert 4 not in trial.steps and len(trial.steps[3]) == 2  # 3 records, the last skipped


def test_a_record_with_its_own_crc_is_read_too(tmp_path):
    """write_checksum=True (TensorFlow's own writers): the footer is the data's CRC."""
    path = tmp_path / "x.tfevents"
    path.write_bytes(record(event("a", np.ones(3, dtype=np.float32), 0)))
    problems: list[str] = []
    assert len(list(tfrecord.read_records(path, problems))) == 1 and problems == []
