"""`make demo`: a training job whose input pipeline starves its GPU, watched end to end.

One command runs, on 127.0.0.1:

* a training loop instrumented with `trainprof.step()/phase()/data()`, and the system exporter
  in the same process. Act 1: every batch is prepared on the CPU while the GPU waits. Act 2:
  batches come prefetched and the GPU is kept busy (with a bigger batch, and a checkpoint
  stall now and then). The GPU is simulated (a machine without one runs the demo too): its
  utilization is the share of each sample the loop spent in GPU phases; the CPU readings are
  real.
* Prometheus, scraping both every second, with SageMaker's ProfilerReport compiled at demo
  speed (patience and windows of seconds instead of minutes);
* Alertmanager with trainprof's generated routing, delivering to a webhook this demo prints.

It prints the alerts as they fire and resolve and the notifications Alertmanager sends, then
writes the profiling report (HTML) and a summary.

    python -m trainprof.demo [--duration 150] [--out out/demo] [--keep]

`--keep` (`make demo KEEP=1`) leaves Prometheus, Alertmanager and the exporter running at the
end, with their URLs printed, until Ctrl-C. `trainprof stack -- python train.py` starts the
same stack (trainprof.engines.stack) for your own training script.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from trainprof.contract.names import EXIT_FAILED, JOB_LABEL
from trainprof.contract.sampling import GpuSample, HostSample
from trainprof.engines.prometheus_api import PrometheusAPI

JOB = "demo"
DEMO_RULES: dict[str, Any] = {
    "datapoint_interval": "0.5s",
    "scrape_interval": "1s",
    "rules": [
        {
            "rule": "ProfilerReport",
            "parameters": {
                # SageMaker's defaults, at demo speed: datapoints of 0.5 s, patience of 10 s.
                "scan_interval_us": 2_000_000,
                # The bottlenecks watch a shorter patience than the alerts they explain (and
                # inhibit), so they reach Alertmanager first, as the tickets' longer group_wait
                # arranges in production.
                "CPUBottleneck_patience": 12,
                "CPUBottleneck_window": 60,
                "IOBottleneck_patience": 12,
                "IOBottleneck_window": 60,
                "LowGPUUtilization_window": 20,
                "LowGPUUtilization_patience": 20,
                "BatchSize_window": 20,
                "BatchSize_patience": 20,
                "GPUMemoryIncrease_patience": 20,
                "LoadBalancing_patience": 20,
                "MaxInitializationTime_threshold": 1,
                "StepOutlier_n_outliers": 3,
            },
        }
    ],
}


class SimulatedGpu:
    """An exporter source for a GPU that is not there: busy for the share of each sample
    interval the training loop spent in its GPU phases (forward, backward, optimizer)."""

    name = "gpu"

    def __init__(self, loop: DemoLoop):
        self.loop = loop
        self._last = time.monotonic()

    def read(self, sample: HostSample) -> bool:
        now = time.monotonic()
        busy = self.loop.take_gpu_seconds()
        utilization = min(busy / max(now - self._last, 1e-6), 1.0)
        self._last = now
        total = 16 * 2**30
        sample.gpus = [
            GpuSample(
                0,
                "GPU-00000000-demo-0000-0000-simulated000",
                utilization=round(utilization, 2),
                memory_used_bytes=self.loop.gpu_memory * total,
                memory_total_bytes=total,
                name="simulated GPU (trainprof demo)",
                driver_version="-",
            )
        ]
        return True

    def close(self) -> None:
        pass


class DemoLoop:
    """The training loop of the demo, run in a thread."""

    def __init__(self, duration: float):
        self.duration = duration
        self.act = 1
        self.gpu_memory = 0.30
        self._gpu_seconds = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="demo-training", daemon=True)

    def take_gpu_seconds(self) -> float:
        with self._lock:
            seconds, self._gpu_seconds = self._gpu_seconds, 0.0
        return seconds

    def _gpu_work(self, phase: str, seconds: float) -> None:
        import trainprof

        with trainprof.phase(phase):
            time.sleep(seconds)
        with self._lock:
            self._gpu_seconds += seconds

    def _batches(self):
        while not self._stop.is_set():
            if self.act == 1:
                _burn_cpu(0.095)  # decode and augment on the CPU, every batch
            else:
                time.sleep(0.002)  # prefetched: the batch is already there
            yield None

    def _run(self) -> None:
        import trainprof

        _pin_to_first_cpu()
        started = time.monotonic()
        step = 0
        for _ in trainprof.data(self._batches()):
            elapsed = time.monotonic() - started
            if elapsed > self.duration:
                break
            if self.act == 1 and elapsed > self.duration / 2:
                self.act, self.gpu_memory = 2, 0.55  # prefetching, and a bigger batch
            compute = 0.005 if self.act == 1 else 0.06
            with trainprof.step():
                self._gpu_work("forward", compute * 0.35)
                self._gpu_work("backward", compute * 0.55)
                self._gpu_work("optimizer", compute * 0.10)
                if step % 40 == 39:
                    with trainprof.phase("checkpoint"):
                        time.sleep(0.6)
            step += 1

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)


def _burn_cpu(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def _pin_to_first_cpu() -> None:
    # A busy thread that migrates between cores shows as several half-busy cores; pinned,
    # it saturates one, as a single-threaded data loader does.
    try:
        allowed = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(threading.get_native_id(), {allowed[0]})
    except (AttributeError, OSError):
        pass


class _Printer:
    def __init__(self, started: float):
        self.started = started
        self.lock = threading.Lock()

    def __call__(self, text: str) -> None:
        elapsed = int(time.monotonic() - self.started)
        with self.lock:
            print(f"[{elapsed // 60:02d}:{elapsed % 60:02d}] {text}", flush=True)


# Why an alert still fires once the job is fixed: the demo's job is fixed, not perfect.
STILL_FIRING_BECAUSE = {
    ("TrainingLowGPUUtilization", "fluctuating"): (
        "act 2 still checkpoints every 40 steps, 0.6 s with the GPU idle: the 5th "
        "percentile of its utilization sees those pauses. That is the job, not noise: the "
        "alert held through the checkpoints instead of firing and resolving with each"
    ),
    ("TrainingStepOutlier", None): (
        "it counts the slow steps since the job started, as SageMaker's rule did: the "
        "checkpoint steps are slower than the mean plus 3 standard deviations, and a count "
        "since the start never goes back down"
    ),
}


def _still_firing(
    now: dict[tuple, dict], api: PrometheusAPI, compiled: Any, act2: float, say: _Printer
) -> None:
    """Say which alerts still fire once the job is fixed, and why."""
    if not now:
        say("the fixed job ends quiet: no alert is firing")
        return
    say("still firing at the end, and why:")
    for alert in sorted(now.values(), key=lambda a: str(sorted(a["labels"].items()))):
        name, reason = alert["labels"].get("alertname", "?"), alert["labels"].get("reason")
        why = STILL_FIRING_BECAUSE.get((name, reason)) or _why(name, reason, api, compiled, act2)
        say(f"  {name}{f' ({reason})' if reason else ''}: {why}")


def _why(name: str, reason: str | None, api: PrometheusAPI, compiled: Any, act2: float) -> str:
    found = next(
        a for a in compiled.affected if a.alertname == name and a.labels.get("reason") == reason
    )
    since = time.monotonic() - act2
    if api.instant(found.selector(), time.time()):
        return (
            f"act 2 began {since:.0f}s ago and the rule's window still holds act 1's samples: "
            "its condition holds"
        )
    return (
        f"its condition ended; it holds for {found.hold:g}s (the rule's patience) so that a "
        f"short recovery does not resolve it, and act 2 began only {since:.0f}s ago"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--duration",
        type=float,
        default=150,
        help="seconds of training, half input-bound, half fixed (default 150)",
    )
    parser.add_argument(
        "--out",
        default=os.path.join("out", "demo"),
        help="where the compiled rules and the report go (default out/demo)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep Prometheus, Alertmanager and the exporter running after the demo, to "
        "explore, until Ctrl-C (make demo KEEP=1)",
    )
    args = parser.parse_args(argv)

    missing = [
        b for b in ("prometheus", "prometheus-alertmanager", "promtool") if shutil.which(b) is None
    ]
    if missing:
        print(
            f"error: {', '.join(missing)} not installed; `make demo` installs them "
            "(scripts/install-tools.sh)",
            file=sys.stderr,
        )
        return EXIT_FAILED

    import trainprof
    import trainprof.exporter
    from trainprof.engines.stack import EXPORTER_JOB, RANKS_JOB, firing, local_stack
    from trainprof.generation.render import to_yaml
    from trainprof.rules.compiler import compile_rules
    from trainprof.rules.config import load_config

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    config = load_config(DEMO_RULES, "demo rules")
    compiled = compile_rules(config)
    rules = to_yaml({"groups": compiled.groups}, "trainprof demo")
    (out / "rules.yaml").write_text(rules)
    started = time.monotonic()
    say = _Printer(started)
    loop = DemoLoop(args.duration)
    node = socket.gethostname()
    session = trainprof.start(
        port=0, addr="127.0.0.1", training_job=JOB, node=node, rank=0, local_rank=0, world_size=1
    )
    from trainprof.exporter.sources.collectors import default_sources

    exporter = trainprof.exporter.start(
        0,
        address="127.0.0.1",
        datapoint_interval=0.5,
        sources=[SimulatedGpu(loop)] + default_sources(("cpu", "memory", "disk", "network")),
        identity={JOB_LABEL: JOB, "node": node},
    )
    training_port, exporter_port = session.port, exporter.port
    if training_port is None or exporter_port is None:
        print("error: the demo could not listen on a local port", file=sys.stderr)
        exporter.stop()
        trainprof.stop()
        return EXIT_FAILED
    seen: dict[tuple, dict] = {}
    fired: dict[str, float] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="trainprof-demo-") as tmp:
            with local_stack(
                Path(tmp),
                rules,
                {EXPORTER_JOB: exporter_port, RANKS_JOB: training_port},
                say,
                scrape_interval=1.0,
            ) as stack:
                prom, am = stack.prometheus, stack.alertmanager
                print(
                    "trainprof demo: a training job whose input pipeline starves its GPU, "
                    "then is fixed"
                )
                print("  (the GPU is simulated; CPU readings are this machine's)")
                print(f"  Prometheus   {prom}   rules: SageMaker's ProfilerReport at demo speed")
                print(f"  Alertmanager {am}   routing: alerting/ (generated)")
                print(
                    f"  exporter     {exporter.url}   rank 0 "
                    f"http://127.0.0.1:{session.port}/metrics\n",
                    flush=True,
                )
                api = PrometheusAPI(prom, timeout=5.0)
                loop.start()
                say("act 1: every batch is decoded on the CPU while the GPU waits")
                act, act2 = 1, time.monotonic()
                while loop.thread.is_alive():
                    if loop.act != act:
                        act, act2 = loop.act, time.monotonic()
                        say(
                            "act 2: batches come prefetched, the batch is bigger, the GPU is "
                            "kept busy"
                        )
                    now = firing(api.alerts())
                    for key in now.keys() - seen.keys():
                        alert = now[key]
                        fired.setdefault(key[0], time.monotonic() - started)
                        labels = alert["labels"]
                        reason = f" reason={labels['reason']}" if "reason" in labels else ""
                        say(f"FIRING   {key[0]} [{labels.get('severity')}]{reason}")
                        say(f"         {alert['annotations'].get('description', '')}")
                    for key in seen.keys() - now.keys():
                        reason = seen[key]["labels"].get("reason")
                        say(f"RESOLVED {key[0]}" + (f" reason={reason}" if reason else ""))
                    seen = now
                    time.sleep(1)
                _still_firing(seen, api, compiled, act2, say)
                time.sleep(3)  # the last notifications
                report = _report(prom, config, out, say)
                if args.keep:
                    _keep_running(prom, am, exporter.url, session.port)
    finally:
        loop.stop()
        exporter.stop()
        trainprof.stop()

    print("\nSummary (first firing, seconds after the start):")
    for name, at in sorted(fired.items(), key=lambda kv: kv[1]):
        print(f"  {name:<32} {at:5.0f}s")
    print(f"\nRules:  {out / 'rules.yaml'}")
    print(f"Report: {report}  (open it in a browser: one self-contained file)")
    return 0


def _keep_running(prom: str, am: str, exporter: str | None, rank_port: int | None) -> None:
    """Print where everything answers and wait for Ctrl-C (or SIGTERM)."""
    print(
        "\nThe stack keeps running, to explore:\n"
        f"  Prometheus   {prom}/alerts   {prom}/graph?g0.expr=ALERTS\n"
        f"  Alertmanager {am}/#/alerts\n"
        f"  exporter     {exporter}   rank 0 http://127.0.0.1:{rank_port}/metrics\n"
        "The simulated GPU reads idle now that the training loop has ended: "
        "LowGPUUtilization may fire.\nPress Ctrl-C to stop it.",
        flush=True,
    )
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
    print("stopping the stack", flush=True)


def _report(prometheus_url: str, config: Any, out: Path, say: _Printer) -> Path:
    """The HTML profiling report of the demo job, from the demo's Prometheus."""
    from trainprof.report import build, from_prometheus, render

    path = out / "report.html"
    path.write_text(render(build(from_prometheus(prometheus_url, JOB, config))), encoding="utf-8")
    say(f"report written to {path}")
    return path


if __name__ == "__main__":
    sys.exit(main())
