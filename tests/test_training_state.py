"""TrainingState: every training metric from explicit step and phase observations."""

from __future__ import annotations

import random
import statistics

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from trainprof.contract import metrics
from trainprof.training import state as training_state
from trainprof.training.state import (
    OUTLIER_MIN_STEPS,
    TrainingState,
    bounded_label_value,
    canonical_mode,
)

IDENTITY = {"training_job": "bert", "node": "n1", "rank": "3", "local_rank": "1"}


def brute_force_outliers(durations: list[float], k: float) -> int:
    """StepOutlier by its definition: step i against all steps before it, once 100 exist."""
    count = 0
    for i in range(OUTLIER_MIN_STEPS, len(durations)):
        earlier = durations[:i]
        if durations[i] > statistics.fmean(earlier) + k * statistics.pstdev(earlier):
            count += 1
    return count


def feed(
    state: TrainingState, durations: list[float], mode: str = "train", t0: float = 1_000.0
) -> None:
    t = t0
    for d in durations:
        state.observe_step(mode, t, t + d)
        t += d + 0.001


@pytest.mark.parametrize("seed", range(8))
def test_outlier_counts_match_a_brute_force_reference_on_random_series(seed):
    rng = random.Random(seed)
    n = rng.randint(120, 600)
    durations = [rng.lognormvariate(-2, rng.uniform(0.05, 0.6)) for _ in range(n)]
    for i in rng.sample(range(n), k=n // 15):  # stalls: GC, checkpoints
        durations[i] *= rng.uniform(1.5, 20)
    extra = round(rng.uniform(1.1, 6), 2)
    state = TrainingState(IDENTITY, stddevs=[extra])
    feed(state, durations)
    for k in (2.0, 3.0, 4.0, 5.0, extra):
        got = state.value(
            "trainprof_training_step_outliers_total",
            mode="train",
            stddev=metrics.threshold_label(k),
        )
        assert got == brute_force_outliers(durations, k), f"stddev {k}"


def test_a_step_is_judged_only_once_100_earlier_steps_exist():
    state = TrainingState(IDENTITY)
    feed(state, [0.1] * 99 + [50.0])  # the 100th step: only 99 before it
    assert state.value("trainprof_training_step_outliers_total", stddev="3") == 0
    feed(state, [50.0], t0=5_000)  # the 101st: 100 before it
    assert state.value("trainprof_training_step_outliers_total", stddev="3") == 1


def test_modes_keep_separate_statistics():
    state = TrainingState(IDENTITY)
    feed(state, [0.1] * 150, mode="train")
    feed(state, [5.0] * 150, mode="eval")  # slow, but normal for eval
    feed(state, [5.0], mode="train")
    assert state.value("trainprof_training_step_outliers_total", mode="train", stddev="5") == 1
    assert state.value("trainprof_training_step_outliers_total", mode="eval", stddev="2") == 0
    assert state.value("trainprof_training_steps_total", mode="eval") == 150


def test_outlier_counters_exist_at_zero_for_every_grid_factor_before_any_step():
    state = TrainingState(IDENTITY, stddevs=[2.5])
    for k in ("2", "2.5", "3", "4", "5"):
        assert state.value("trainprof_training_step_outliers_total", mode="train", stddev=k) == 0
    assert state.value("trainprof_training_steps_total", mode="train") == 0
    assert state.value("trainprof_training_steps_total", mode="eval") is None
    feed(state, [1.0], mode="eval")
    assert state.value("trainprof_training_step_outliers_total", mode="eval", stddev="3") == 0


def test_factors_added_later_count_from_then_on():
    state = TrainingState(IDENTITY)
    feed(state, [0.1] * 100 + [9.0])
    state.add_stddevs([2.5])
    feed(state, [9.0], t0=9_000)
    assert state.value("trainprof_training_step_outliers_total", stddev="3") == 2
    assert state.value("trainprof_training_step_outliers_total", stddev="2.5") == 1


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf")])
def test_stddev_factors_must_be_positive_numbers(bad):
    with pytest.raises(ValueError, match="positive number"):
        TrainingState(stddevs=[bad])


def test_step_duration_histogram_uses_le_buckets():
    state = TrainingState(IDENTITY)
    feed(state, [0.001, 0.0015, 0.5, 700.0])
    assert state.value("trainprof_training_step_duration_seconds_bucket", le="0.001") == 1
    assert state.value("trainprof_training_step_duration_seconds_bucket", le="0.002") == 2
    assert state.value("trainprof_training_step_duration_seconds_bucket", le="600.0") == 3
    assert state.value("trainprof_training_step_duration_seconds_bucket", le="+Inf") == 4
    assert state.value("trainprof_training_step_duration_seconds_count") == 4
    assert state.value("trainprof_training_step_duration_seconds_sum") == pytest.approx(700.5025)


def test_first_and_last_step_timestamps():
    state = TrainingState(IDENTITY, start_time=900.0)
    assert state.value("trainprof_training_first_step_timestamp_seconds") is None
    assert state.value("trainprof_training_last_step_timestamp_seconds") is None
    state.observe_step("eval", 1_000.0, 1_002.0)
    state.observe_step("train", 1_003.0, 1_004.0)
    state.observe_step("train", 950.0, 960.0)  # replayed out of order
    assert state.value("trainprof_training_first_step_timestamp_seconds") == 1_000.0
    assert state.value("trainprof_training_last_step_timestamp_seconds") == 1_004.0
    assert state.value("trainprof_training_start_timestamp_seconds") == 900.0


def test_a_step_that_ends_before_it_starts_counts_zero_seconds():
    state = TrainingState(IDENTITY)
    state.observe_step("train", 10.0, 9.0)
    assert state.value("trainprof_training_step_duration_seconds_sum") == 0
    assert state.value("trainprof_training_step_duration_seconds_bucket", le="0.001") == 1


def test_unknown_modes_are_rejected_with_the_valid_ones():
    with pytest.raises(ValueError, match="train, eval, predict, global"):
        TrainingState().observe_step("training-ish", 0, 1)
    with pytest.raises(ValueError, match="expected one of"):
        canonical_mode("warmup")


@pytest.mark.parametrize(
    "spelling,mode",
    [
        ("train", "train"),
        ("TRAIN", "train"),
        ("ModeKeys.TRAIN", "train"),
        ("Step:ModeKeys.EVAL", "eval"),
        ("validation", "eval"),
        ("test", "eval"),
        ("ModeKeys.PREDICT", "predict"),
        ("inference", "predict"),
        ("ModeKeys.GLOBAL", "global"),
    ],
)
def test_framework_mode_spellings(spelling, mode):
    assert canonical_mode(spelling) == mode


def test_fixed_phases_are_exported_at_zero_and_user_phases_once_used():
    state = TrainingState(IDENTITY)
    for p in metrics.PHASES:
        assert state.value("trainprof_training_phase_seconds_total", phase=p) == 0
    assert state.observe_phase("tokenize", 0.25) == "tokenize"
    state.observe_phase("tokenize", 0.5)
    state.observe_phase("forward", -1.0)  # clamped
    assert state.value("trainprof_training_phase_seconds_total", phase="tokenize") == 0.75
    assert state.value("trainprof_training_phase_seconds_total", phase="forward") == 0


def test_user_phase_names_are_bounded_in_number_and_length(caplog):
    state = TrainingState(IDENTITY)
    for i in range(metrics.MAX_USER_PHASES):
        state.observe_phase(f"user{i}", 1.0)
    with caplog.at_level("WARNING", logger="trainprof"):
        assert state.observe_phase("step-123456", 2.0) == "other"
        assert state.observe_phase("step-123457", 3.0) == "other"
    assert state.value("trainprof_training_phase_seconds_total", phase="other") == 5.0
    assert len([r for r in caplog.records if "phase names" in r.message]) == 1
    assert state.observe_phase("user0", 1.0) == "user0"  # known names still count
    long_name = "x" * 500
    other = TrainingState()
    assert len(other.observe_phase(long_name, 1.0)) == training_state.MAX_PHASE_NAME_LENGTH


def test_samples_tokens_errors_and_gpus():
    state = TrainingState(IDENTITY)
    assert state.value("trainprof_training_samples_total") == 0
    assert state.value("trainprof_gpu_assignment_info") is None
    state.add_samples(32)
    state.add_tokens(4096)
    state.count_error()
    state.set_gpus([("2", "GPU-abc")])
    assert state.value("trainprof_training_samples_total") == 32
    assert state.value("trainprof_training_tokens_total") == 4096
    assert state.value("trainprof_instrumentation_errors_total") == 1
    assert state.value("trainprof_gpu_assignment_info", gpu="2", uuid="GPU-abc") == 1
    with pytest.raises(ValueError, match="finite number of at least 0, got -1"):
        state.add_samples(-1)


def test_every_exported_name_is_a_training_metric_of_the_contract():
    state = TrainingState(IDENTITY, start_time=1.0)
    feed(state, [0.1] * 3)
    state.set_gpus([("0", "GPU-a")])
    state.set_dataloader_workers(4)
    state.add_tokens(1)
    # The kernel profiler's series come from the rank too, but from its own collector.
    training = {m.name for m in metrics.METRICS if (m.source, m.collector) == ("training",) * 2}
    exported = {f.name + ("_total" if f.type == "counter" else "") for f in state.families()}
    assert exported == training
    for family in state.families():
        m = metrics.BY_NAME[family.name + ("_total" if family.type == "counter" else "")]
        for sample in family.samples:
            assert set(sample.labels) == set(IDENTITY) | set(m.labels) | (
                {"le"} if sample.name.endswith("_bucket") else set()
            ), sample


def test_exposition_of_hostile_label_values_stays_parseable():
    from prometheus_client.parser import text_string_to_metric_families

    hostile = {"training_job": 'a"b}\n{c\\' + "\udcff" + "z" * 300, "rank": "0"}
    state = TrainingState(hostile)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(type("C", (), {"collect": lambda self: state.families()})())
    text = generate_latest(registry).decode("utf-8")
    jobs = {
        s.labels["training_job"] for f in text_string_to_metric_families(text) for s in f.samples
    }
    assert len(jobs) == 1
    (job,) = jobs
    assert job.startswith('a"b}\n{c\\\ufffd') and len(job) == 128


def test_copy_is_independent_of_later_observations():
    state = TrainingState(IDENTITY)
    feed(state, [0.1] * 5)
    snapshot = state.copy()
    feed(state, [0.1] * 5, t0=2_000)
    state.observe_phase("forward", 1.0)
    assert snapshot.value("trainprof_training_steps_total") == 5
    assert snapshot.value("trainprof_training_phase_seconds_total", phase="forward") == 0
    assert state.value("trainprof_training_steps_total") == 10


def test_bounded_label_values_keep_long_values_distinct():
    a, b = bounded_label_value("p" * 300 + "a"), bounded_label_value("p" * 300 + "b")
    assert a != b and len(a) == len(b) == 128
    assert bounded_label_value("short") == "short"


def test_a_row_holds_the_values_of_the_families_and_a_shape_names_them():
    """As SampleAccumulator.row: replay's ranks take their values from here."""
    import random

    from trainprof.contract.sampling import samples_of

    rng = random.Random(11)
    state = TrainingState({"rank": "0", "node": "n"}, stddevs=[2.5], start_time=1000.0)
    names_of: dict = {}
    t = 1010.0
    for i in range(300):
        mode = rng.choice(["train"] * 8 + ["eval", "predict"])
        state.observe_step(mode, t, t + rng.choice([0.1, 0.1, 0.12, 3.0]))
        t += 0.2
        state.observe_phase(rng.choice(["forward", "backward", f"user{i % 20}"]), 0.05)
        if i == 100:
            state.set_dataloader_workers(4)
        if i == 150:
            state.set_gpus([("0", "GPU-a")])
        if i % 9 == 0:
            state.add_samples(32)
        shape, values = state.row()
        rows = list(samples_of(state.families()))
        assert values == [v for _, _, v in rows], i
        names = [(n, sorted(labels.items())) for n, labels, _ in rows]
        assert names_of.setdefault(shape, names) == names, i
    assert len(names_of) > 5
