"""A tensor trial read within bounds: each step read when folded, its series encoded as they
come and evaluated in time chunks that give what one promtool run gives, patterns matched
by RE2, shapes checked against their bytes."""

from __future__ import annotations

import doctest
import time

import numpy as np
import pytest

from trainprof.replay import patterns, series_store, smdebug, tfrecord
from trainprof.replay.series_store import SeriesStore
from trainprof.replay.tensors import replay_trial
from trainprof.rules.tensors import default_tensor_config

from smdebug_writer import _bytes, _int, event, record, write_trial


def test_the_docstrings_run():
    for module in (patterns, tfrecord, series_store):
        assert doctest.testmod(module).failed == 0, module.__name__


def _diverging_trial(root, steps=40):
    """A loss that stops falling at step 12 and a gradient that blows up to inf at step 30."""
    rng = np.random.default_rng(1)
    saved = {}
    for s in range(steps):
        gradient = rng.normal(size=8).astype(np.float32) * (1e-9 if 20 <= s < 25 else 1.0)
        if s >= 30:
            gradient[0] = np.inf if s % 2 else np.nan
        saved[s] = {
            "loss": np.float32(1.0 / (s + 1) if s < 12 else 0.08),
            "gradients/fc.weight": gradient,
            "fc.weight": np.full(8, 0.5 + 0.01 * s, np.float32),
        }
    return write_trial(root, saved)


def test_chunked_evaluation_gives_what_one_promtool_run_gives(tmp_path, promtool):
    root = _diverging_trial(tmp_path / "trial")
    config = default_tensor_config()
    one = replay_trial(str(root), config, chunk_instants=0)
    chunked = replay_trial(str(root), config, chunk_instants=6)
    fired = {name: v.first_fired_step for name, v in one.rules.items()}
    assert fired == {name: v.first_fired_step for name, v in chunked.rules.items()}
    assert one.as_json() == chunked.as_json()
    # the trial is long enough to be cut, and rules fire on both sides of the cuts
    assert fired["LossNotDecreasing"] is not None and fired["ExplodingTensor"] == 30, fired
    assert list(chunked.steps) == list(range(40))


def test_non_finite_values_are_single_tokens_never_runs():
    store = SeriesStore(count=7)
    s = store.id_of("x", {})
    for k, v in enumerate([1.0, 2.0, float("nan"), float("nan"), float("inf"), 3.0, 4.0]):
        store.put(s, k, v)
    assert list(store.items()) == [("x{}", "1+1x1 NaN NaN Inf 3+1x1")]


def test_steps_are_read_when_folded_not_before(tmp_path):
    root = _diverging_trial(tmp_path / "trial", steps=5)
    trial = smdebug.read_trial(root)
    assert list(trial.steps.numbers) == [0, 1, 2, 3, 4]
    late = root / "events" / "000000000003" / "000000000003_worker_0.tfevents"
    late.write_bytes(record(event("loss", np.float32(7.0), 3)))  # written after read_trial
    assert [e.value.tolist() for e in trial.steps[3]] == [[7.0]]
    assert list(trial.steps) == [0, 1, 2, 3, 4]


def test_an_event_of_another_step_than_its_file_is_skipped_and_said(tmp_path):
    root = _diverging_trial(tmp_path / "trial", steps=3)
    path = root / "events" / "000000000001" / "000000000001_worker_0.tfevents"
    with path.open("ab") as f:
        f.write(record(event("loss", np.float32(1.0), 7)))
    trial = smdebug.read_trial(root)
    assert len(trial.steps[2]) == 3 and trial.problems == []  # one step read, the others not yet
    assert sorted(trial.steps) == [0, 1, 2]
    assert sum("an event of step 7 in the file of step 1" in p for p in trial.problems) == 1
    assert sorted(trial.steps) == [0, 1, 2]  # a second pass reports nothing twice
    assert sum("step 7" in p for p in trial.problems) == 1


def test_a_backtracking_pattern_is_matched_in_linear_time_or_within_a_budget(tmp_path):
    name = "a" * 40 + "b"
    root = write_trial(
        tmp_path / "trial",
        {0: {name: np.ones(2, np.float32), "fc.weight": np.ones(2, np.float32)}},
        regexes={
            "losses": ["^(a+)+$"],  # RE2: linear time
            "biases": ["^(?!b)(a+)+$"],  # a lookahead: Python's re, within its budget
            "weights": ["^(?!gradient).*weight"],  # smdebug's own default, a lookahead too
            "inputs": ["(unclosed"],
        },
    )
    started = time.perf_counter()
    trial = smdebug.read_trial(root)
    assert trial.collection_of(name) == "default"
    assert trial.collection_of("a" * 40) == "losses"
    assert trial.collection_of("fc.weight") == "weights"
    assert trial.collection_of("gradient/fc.weight") == "gradients"
    assert time.perf_counter() - started < 3 * patterns.MATCH_BUDGET  # Python's re: hours
    (slow,) = [p for p in trial.problems if "took over" in p]
    assert "'biases'" in slow and "'^(?!b)(a+)+$'" in slow and name in slow
    (bad,) = [p for p in trial.problems if "(unclosed" in p]
    assert "'inputs'" in bad and "not a regular expression" in bad
    assert trial.regexes["biases"] == []  # left out for the names after


def test_a_shape_is_checked_against_its_bytes_before_numpy_allocates():
    value = np.ones(6, np.float32)
    good = write_event_tensor(value, (2, 3))
    assert tfrecord.decode_tensor(good).shape == (2, 3)
    with pytest.raises(tfrecord.DecodeError, match=r"24 bytes, not 36 for shape \[3, 3\]"):
        tfrecord.decode_tensor(write_event_tensor(value, (3, 3)))
    with pytest.raises(tfrecord.DecodeError, match=r"shape \[1000000, 1000000\] is 1,000,000,"):
        tfrecord.decode_tensor(write_event_tensor(value, (1_000_000, 1_000_000)))


def write_event_tensor(value: np.ndarray, shape: tuple[int, ...]) -> bytes:
    """A float32 TensorProto of `value`'s bytes under `shape` (dtype 1, shape 2, content 4)."""
    dims = b"".join(_bytes(2, _int(1, d)) for d in shape)
    return _int(1, 1) + _bytes(2, dims) + _bytes(4, value.astype(np.float32).tobytes())
