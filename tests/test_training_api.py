"""The live API in one process: timing, nesting, failures kept from the loop, ports, restarts.

Times come from a fake perf_counter, so no test depends on how fast this machine is.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

import trainprof
from conftest import require_module
from trainprof.training import timing


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(timing, "perf_counter", fake)
    return fake


@pytest.fixture(autouse=True)
def fresh_session(monkeypatch):
    for var in (
        "TRAINPROF_BASE_PORT",
        "TRAINPROF_RULES_CONFIG",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "KUBERNETES_SERVICE_HOST",
    ):
        monkeypatch.delenv(var, raising=False)
    trainprof.stop()
    yield
    trainprof.stop()


def phase_seconds(name: str) -> float | None:
    return trainprof.current().value("trainprof_training_phase_seconds_total", phase=name)


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def sample(samples: dict, name: str, **labels: str) -> float | None:
    for (n, lbls), v in samples.items():
        if n == name and all((k, val) in lbls for k, val in labels.items()):
            return v
    return None


def test_a_training_loop_with_phases(clock):
    trainprof.start(serve=False, training_job="t")
    batches = iter(range(3))

    def slow_loader():
        for b in batches:
            clock.advance(0.5)
            yield b

    for _ in trainprof.data(slow_loader()):
        with trainprof.step(samples=8, tokens=100):
            clock.advance(0.01)  # unattributed: counted as "other"
            with trainprof.phase("forward"):
                clock.advance(0.2)
            with trainprof.phase("backward"):
                clock.advance(0.3)
            with trainprof.phase("optimizer"):
                clock.advance(0.1)
    s = trainprof.current()
    assert s.value("trainprof_training_steps_total", mode="train") == 3
    assert s.value("trainprof_training_step_duration_seconds_sum") == pytest.approx(1.83)
    assert phase_seconds("dataloader") == pytest.approx(1.5)
    assert phase_seconds("forward") == pytest.approx(0.6)
    assert phase_seconds("backward") == pytest.approx(0.9)
    assert phase_seconds("optimizer") == pytest.approx(0.3)
    assert phase_seconds("other") == pytest.approx(0.03)
    assert s.value("trainprof_training_samples_total") == 24
    assert s.value("trainprof_training_tokens_total") == 300
    assert s.value("trainprof_instrumentation_errors_total") == 0


def test_nested_phases_count_their_own_time_only(clock):
    trainprof.start(serve=False)
    with trainprof.step():
        with trainprof.phase("forward"):
            clock.advance(1.0)
            with trainprof.phase("attention"):
                clock.advance(2.0)
                with trainprof.phase("collective"):
                    clock.advance(4.0)
            clock.advance(8.0)
    assert phase_seconds("forward") == 9.0
    assert phase_seconds("attention") == 2.0
    assert phase_seconds("collective") == 4.0
    assert phase_seconds("other") == 0.0
    assert trainprof.current().value("trainprof_training_step_duration_seconds_sum") == 15.0


def test_eval_steps_count_their_unattributed_time_as_evaluation(clock):
    trainprof.start(serve=False)
    with trainprof.step(mode="validation"):
        clock.advance(2.0)
    s = trainprof.current()
    assert s.value("trainprof_training_steps_total", mode="eval") == 1
    assert phase_seconds("evaluation") == 2.0


def test_decorators_time_every_call_and_are_reentrant(clock):
    trainprof.start(serve=False)

    @trainprof.phase("forward")
    def layer(depth: int) -> int:
        clock.advance(1.0)
        return depth if depth == 0 else layer(depth - 1)

    @trainprof.step(samples=2)
    def train_step() -> int:
        return layer(2)

    assert train_step() == 0 and train_step() == 0
    assert train_step.__name__ == "train_step"
    assert phase_seconds("forward") == 6.0
    s = trainprof.current()
    assert s.value("trainprof_training_steps_total") == 2
    assert s.value("trainprof_training_samples_total") == 4


def test_exceptions_from_the_training_code_pass_through_and_are_timed(clock):
    trainprof.start(serve=False)
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        with trainprof.step():
            with trainprof.phase("forward"):
                clock.advance(1.0)
                raise RuntimeError("CUDA out of memory")
    s = trainprof.current()
    assert s.value("trainprof_training_steps_total") == 1
    assert phase_seconds("forward") == 1.0
    assert s.value("trainprof_instrumentation_errors_total") == 0
    with trainprof.phase("optimizer"):  # the frame stack is intact afterwards
        clock.advance(1.0)
    assert phase_seconds("optimizer") == 1.0


def test_failures_inside_instrumentation_are_counted_never_raised(clock, monkeypatch, caplog):
    trainprof.start(serve=False)
    s = trainprof.current()

    def broken(*args, **kwargs):
        raise ZeroDivisionError("bug in trainprof")

    monkeypatch.setattr(s._state, "observe_step", broken)
    monkeypatch.setattr(s._state, "phase_label", broken)
    monkeypatch.setattr(s._state, "add_samples", broken)
    with caplog.at_level(logging.WARNING, logger="trainprof"):
        for _ in range(3):
            with trainprof.step():
                with trainprof.phase("forward"):
                    clock.advance(1.0)
        trainprof.add(samples=3)
    assert s.value("trainprof_instrumentation_errors_total") == 7
    logged = [r for r in caplog.records if "exception inside instrumentation" in r.message]
    assert len(logged) == 1 and logged[0].exc_info[0] is ZeroDivisionError


def test_misuse_is_counted_and_does_nothing(clock, caplog):
    trainprof.start(serve=False)
    s = trainprof.current()
    with caplog.at_level(logging.WARNING, logger="trainprof"):
        for _ in range(2):
            with trainprof.step(mode="warmup"):  # unknown mode: no step, one warning
                pass
        with trainprof.phase(None):  # not a name
            pass
        with trainprof.step(mode=["train"]):  # unhashable
            pass
        trainprof.add(samples=-5)
    assert s.value("trainprof_training_steps_total", mode="train") == 0
    assert s.value("trainprof_instrumentation_errors_total") == 5
    assert len([r for r in caplog.records if "unknown mode 'warmup'" in r.message]) == 1


def test_a_frame_exited_out_of_order_does_not_break_later_ones(clock):
    trainprof.start(serve=False)
    outer, inner = trainprof.phase("forward"), trainprof.phase("backward")
    outer.__enter__()
    inner.__enter__()
    clock.advance(1.0)
    outer.__exit__(None, None, None)
    inner.__exit__(None, None, None)
    with trainprof.step():
        clock.advance(1.0)
    assert trainprof.current().value("trainprof_training_steps_total") == 1
    assert trainprof.current()._hot.own().top is None


def test_cuda_sync_hook_runs_around_every_block_and_charges_the_gpu_time(clock):
    calls = []

    def sync():  # stands in for torch.cuda.synchronize
        calls.append(clock.now)
        clock.advance(0.5)  # the kernels queued by the block finish here

    trainprof.start(serve=False, cuda_sync=sync)
    with trainprof.step():
        with trainprof.phase("forward"):
            clock.advance(0.1)  # launching kernels
    assert len(calls) == 4
    assert phase_seconds("forward") == pytest.approx(0.6)


def test_a_failing_sync_hook_is_counted_and_timing_goes_on(clock):
    def sync():
        raise RuntimeError("CUDA error: an illegal memory access")

    trainprof.start(serve=False, cuda_sync=sync)
    with trainprof.step():
        clock.advance(1.0)
    with trainprof.step():
        clock.advance(1.0)
    s = trainprof.current()
    assert s.value("trainprof_instrumentation_errors_total") == 4
    assert s._hot.own().top is None


def test_cuda_sync_true_without_cuda_logs_and_times_without_it(caplog):
    with caplog.at_level(logging.WARNING, logger="trainprof"):
        trainprof.start(serve=False, cuda_sync=True)
    assert trainprof.current()._sync is None
    assert any("cuda_sync=True" in r.message for r in caplog.records)


def test_concurrent_threads_lose_no_steps():
    trainprof.start(serve=False)

    def work():
        for _ in range(2_000):
            with trainprof.step():
                with trainprof.phase("forward"):
                    pass

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = trainprof.current()
    assert s.value("trainprof_training_steps_total") == 8_000
    assert s.value("trainprof_instrumentation_errors_total") == 0


def test_data_keeps_length_and_attributes_of_the_loader():
    class Loader:
        dataset = "imagenet"

        def __iter__(self):
            return iter([1, 2, 3])

        def __len__(self):
            return 3

    wrapped = trainprof.data(Loader())
    assert len(wrapped) == 3 and wrapped.dataset == "imagenet"
    assert list(wrapped) == [1, 2, 3]
    assert list(wrapped) == [1, 2, 3]  # iterable again, like a DataLoader


def test_gpu_assignment_is_taken_once_cuda_is_up(monkeypatch):
    from types import SimpleNamespace

    class FakeCuda:
        initialized = False

        def is_available(self):
            return True

        def is_initialized(self):
            return self.initialized

        def current_device(self):
            return 1

        def get_device_properties(self, index):
            return SimpleNamespace(uuid="8f1e2d3c-0000-1111-2222-333344445555")

    cuda = FakeCuda()
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda, __version__="9.9"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    trainprof.start(serve=False)
    s = trainprof.current()
    assert s.value("trainprof_gpu_assignment_info") is None  # CUDA not initialised yet
    cuda.initialized = True  # the script calls .cuda()
    with trainprof.step():
        pass
    assert (
        s.value(
            "trainprof_gpu_assignment_info",
            gpu="6",
            uuid="GPU-8f1e2d3c-0000-1111-2222-333344445555",
        )
        == 1
    )
    assert s.value("trainprof_training_info", framework="pytorch", framework_version="9.9") == 1


def test_explicit_gpus_and_framework():
    trainprof.start(
        serve=False, gpus=[(0, "GPU-x"), (1, "GPU-y")], framework="jax", framework_version="0.4"
    )
    s = trainprof.current()
    assert s.value("trainprof_gpu_assignment_info", gpu="1", uuid="GPU-y") == 1
    assert s.value("trainprof_training_info", framework="jax", framework_version="0.4") == 1


def test_rules_config_adds_its_stddev_factors(tmp_path):
    config = tmp_path / "rules.yaml"
    config.write_text("rules:\n  - rule: StepOutlier\n    parameters: {stddev: 2.5}\n")
    trainprof.start(serve=False, rules_config=str(config), stddevs=[7])
    s = trainprof.current()
    for k in ("2", "2.5", "3", "4", "5", "7"):
        assert s.value("trainprof_training_step_outliers_total", mode="train", stddev=k) == 0


def test_a_bad_rules_config_is_logged_and_the_defaults_are_counted(tmp_path, caplog):
    config = tmp_path / "rules.yaml"
    config.write_text("rules:\n  - rule: StepOutlyer\n")
    with caplog.at_level(logging.WARNING, logger="trainprof"):
        trainprof.start(serve=False, rules_config=str(config))
    assert any("cannot read rules_config" in r.message for r in caplog.records)
    assert trainprof.current().value("trainprof_training_step_outliers_total", stddev="3") == 0


def test_start_serves_the_contract_over_http():
    s = trainprof.start(port=0, addr="127.0.0.1", training_job="job-a", rank=2, local_rank=0)
    with trainprof.step():
        pass
    samples = scrape(s.port)
    assert (
        sample(
            samples, "trainprof_training_steps_total", training_job="job-a", rank="2", mode="train"
        )
        == 1
    )
    names = {name for name, _ in samples}
    assert all(n.startswith("trainprof_") for n in names)


def test_start_twice_keeps_the_running_session():
    first = trainprof.start(port=0, addr="127.0.0.1")
    assert trainprof.start(port=0, addr="127.0.0.1") is first


def test_stop_then_start_begins_from_zero_on_the_same_port():
    s = trainprof.start(port=0, addr="127.0.0.1")
    port = s.port
    for _ in range(3):
        with trainprof.step():
            pass
    trainprof.stop()
    with pytest.raises(OSError):
        scrape(port)
    s = trainprof.start(port=port, addr="127.0.0.1")
    assert s.port == port
    assert sample(scrape(port), "trainprof_training_steps_total", mode="train") == 0


def test_records_made_before_start_are_kept():
    with trainprof.step():
        pass
    s = trainprof.start(serve=False, training_job="late")
    assert s.value("trainprof_training_steps_total", training_job="late") == 1


def occupy(port: int) -> socket.socket:
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


def free_base(span: int) -> int:
    for base in range(30_000, 60_000, 97):
        socks = []
        try:
            for i in range(span):
                socks.append(occupy(base + i))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return base
    raise RuntimeError("no free port range")


def test_a_port_in_use_falls_back_past_the_other_ranks_ports(monkeypatch, caplog):
    base = free_base(12)
    monkeypatch.setenv("TRAINPROF_BASE_PORT", str(base))
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    taken = occupy(base + 1)
    try:
        with caplog.at_level(logging.WARNING, logger="trainprof"):
            s = trainprof.start(addr="127.0.0.1")
        assert s.port == base + 1 + 4
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and str(base + 1) in warnings[0].getMessage()
        assert sample(scrape(s.port), "trainprof_training_steps_total") == 0
    finally:
        taken.close()


def test_no_free_port_disables_serving_and_training_goes_on(monkeypatch, caplog):
    base = free_base(16)
    monkeypatch.setenv("TRAINPROF_BASE_PORT", str(base))
    taken = [occupy(base + k) for k in range(4)]
    try:
        with caplog.at_level(logging.WARNING, logger="trainprof"):
            s = trainprof.start(addr="127.0.0.1")
        assert s.port is None
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and "not serving" in warnings[0].getMessage()
        with trainprof.step():
            pass
        assert s.value("trainprof_training_steps_total") == 1
    finally:
        for sock in taken:
            sock.close()


def test_start_timestamp_is_when_the_process_started_not_when_start_was_called():
    code = textwrap.dedent("""
        import time
        time.sleep(1.5)
        called = time.time()
        import trainprof
        s = trainprof.start(serve=False)
        print(called - s.value("trainprof_training_start_timestamp_seconds"))
    """)
    before = time.time()
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    lag = float(out.stdout)
    assert 1.3 < lag < time.time() - before + 1.0


def test_start_timestamp_matches_psutil():
    psutil = require_module("psutil")
    s = trainprof.start(serve=False)
    assert s.value("trainprof_training_start_timestamp_seconds") == pytest.approx(
        psutil.Process(os.getpid()).create_time(), abs=1.0
    )


def test_import_needs_only_prometheus_client():
    code = textwrap.dedent("""
        import sys
        class Block:
            heavy = {"torch", "numpy", "yaml", "psutil", "pynvml", "grafanalib",
                     "lightning", "pytorch_lightning", "transformers", "keras"}
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in self.heavy:
                    raise ImportError(f"{name} is blocked in this test")
        sys.meta_path.insert(0, Block())
        import trainprof
        trainprof.start(serve=False)
        for batch in trainprof.data(range(3)):
            with trainprof.step(samples=1):
                with trainprof.phase("forward"):
                    pass
        s = trainprof.current()
        assert s.value("trainprof_training_steps_total") == 3
        assert not Block.heavy & set(sys.modules), Block.heavy & set(sys.modules)
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_nan_or_infinite_samples_and_tokens_do_not_poison_the_counters():
    trainprof.start(serve=False)
    s = trainprof.current()
    with trainprof.step(samples=8, tokens=100):
        pass
    for bad in (float("nan"), float("inf"), float("-inf")):
        with trainprof.step(samples=bad, tokens=bad):
            pass
        trainprof.add(samples=bad, tokens=bad)
    with trainprof.step(samples=8, tokens=100):
        pass
    assert s.value("trainprof_training_samples_total") == 16
    assert s.value("trainprof_training_tokens_total") == 200
    assert s.value("trainprof_training_steps_total", mode="train") == 5
    assert s.value("trainprof_instrumentation_errors_total") >= 6


def test_a_phase_nested_in_itself_counts_each_block(clock):
    trainprof.start(serve=False)
    with trainprof.step():
        with trainprof.phase("forward"):
            clock.advance(1.0)
            with trainprof.phase("forward"):  # the same name, inside: a block of its own
                clock.advance(2.0)
            clock.advance(4.0)
    assert phase_seconds("forward") == 7.0
    assert phase_seconds("other") == 0.0


def test_a_thread_that_ended_keeps_its_time_and_is_let_go(clock):
    trainprof.start(serve=False)
    s = trainprof.current()

    def loader() -> None:
        for _ in range(3):
            with trainprof.phase("dataloader"):
                clock.advance(0.5)

    for _ in range(20):
        thread = threading.Thread(target=loader)
        thread.start()
        thread.join()
    assert phase_seconds("dataloader") == 30.0
    assert phase_seconds("dataloader") == 30.0  # once moved into the state, still counted
    assert s._hot.threads == []  # nothing is held for the threads that ended


def test_names_made_from_step_numbers_keep_memory_bounded(clock):
    trainprof.start(serve=False)
    s = trainprof.current()
    for i in range(500):
        with trainprof.step():
            with trainprof.phase(f"batch-{i}"):
                clock.advance(1.0)
    own = s._hot.own()
    assert len(own.frames) <= 64 and len(own.accounts) <= 32
    assert phase_seconds("other") == 500.0 - 16  # 16 user names admitted, the rest "other"
    assert phase_seconds("batch-0") == 1.0
