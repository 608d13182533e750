"""How long the compiled default rules take to evaluate for 1,000 nodes x 8 GPUs.

    python benchmarks/rules_at_scale.py [--nodes 1000] [--gpus 8] [--cores 64] [--jobs 100]
        [--engine prometheus|victoriametrics] [--minutes 7]

A fake exporter serves the series of `--nodes` hosts (the real SampleAccumulator's output for
one host with `--gpus` GPUs and `--cores` cores, repeated with a different `node` label, the
nodes spread over `--jobs` training jobs), advancing by 30 samples (15 s at 0.5 s) per
scrape; a real Prometheus (or VictoriaMetrics scraping and vmalert evaluating) scrapes it
every 15 s with the default ProfilerReport rules compiled to evaluate every 15 s. After the
rules' windows have filled, it prints each group's evaluation time (Prometheus:
`evaluationTime` of /api/v1/rules; vmalert: the mean of `vmalert_iteration_duration_seconds`
over the rounds since the windows filled), the series its expressions select, and the sum,
the single-core cost of one evaluation round, with the engines' resident memory. The fake
exporter and the engine's scraping share the machine's cores with the rule evaluation, so on
a small machine those times are upper bounds. Then it stops serving (Prometheus stops
ingesting and marks the series stale) and runs every rule's expression as an instant query
at the moment serving stopped, keeping the fastest of five: the undisturbed cost (on
VictoriaMetrics, while it keeps ingesting).
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import random
import re
import shutil
import statistics
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from trainprof.durations import format_duration, parse_duration
from trainprof.localstack import get_json, prometheus, victoria_metrics, vmalert
from trainprof.render import to_yaml
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import load_config
from trainprof.sampling import GpuSample, HostSample, SampleAccumulator

RULES = {
    "scrape_interval": "15s",
    "rules": [{"rule": "ProfilerReport", "parameters": {"scan_interval_us": 15_000_000}}],
}


class Fleet:
    """The exposition of `nodes` hosts, advanced one scrape interval at every scrape."""

    def __init__(self, nodes: int, gpus: int, cores: int = 8, jobs: int = 1):
        self.nodes, self.gpus, self.cores, self.jobs = nodes, gpus, cores, jobs
        self.acc = SampleAccumulator(0.5, identity={"node": "NODE", "training_job": "JOB"})
        self.rng = random.Random(1)
        self.t = 0.0
        self.lock = threading.Lock()
        self.stopped = False

    def _advance(self) -> None:
        for _ in range(30):
            self.t += 0.5
            self.acc.observe(
                HostSample(
                    self.t,
                    cpu_utilization=[self.rng.random() for _ in range(self.cores)],
                    cpu_iowait=[self.rng.random() * 0.1 for _ in range(self.cores)],
                    memory_used_ratio=0.4,
                    gpus=[
                        GpuSample(
                            i,
                            f"GPU-{i}",
                            utilization=self.rng.random(),
                            memory_used_ratio=0.5 + 0.01 * self.rng.random(),
                        )
                        for i in range(self.gpus)
                    ],
                )
            )

    def body(self) -> bytes:
        with self.lock:
            self._advance()
            registry = CollectorRegistry(auto_describe=False)
            registry.register(type("C", (), {"collect": lambda _: self.acc.families()})())
            one = generate_latest(registry).decode()
        lines = one.splitlines(keepends=True)
        header = [ln for ln in lines if ln.startswith("#")]
        samples = [ln for ln in lines if not ln.startswith("#")]
        template = "".join(samples)
        out = ["".join(header)]
        for n in range(self.nodes):
            job = f'training_job="job{n % self.jobs:03d}"'
            out.append(
                template.replace('node="NODE"', f'node="n{n:04d}"').replace(
                    'training_job="JOB"', job
                )
            )
        return "".join(out).encode()


def serve(fleet: Fleet) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if fleet.stopped:
                self.send_error(503)
                return
            body = fleet.body()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


TRIES = 5


def _fastest(base: str, expr: str, at: float) -> float:
    """Seconds of the fastest of TRIES instant queries of `expr`: the least disturbed by the
    scrapes that share the machine's cores."""
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr, 'time': at})}"
    best = float("inf")
    for _ in range(TRIES):
        t = time.perf_counter()
        get_json(url, timeout=300)
        best = min(best, time.perf_counter() - t)
    return best


SELECTOR = re.compile(
    r"(?<![\w:])([a-zA-Z_:][\w:]*)(\{[^}]*\})?(?!\s*\()(?=\s*(?:\[|\)|$|\s|offset))"
)
NOT_METRICS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "time",
    "le",
}


def series_touched(base: str, exprs: list[str], at: float) -> int:
    """Series the expressions select: `count()` of each distinct selector in them."""
    selectors = set()
    for expr in exprs:
        for m in SELECTOR.finditer(
            re.sub(
                r"\b(by|without|on|ignoring|group_left|group_right)"
                r"\s*\([^)]*\)",
                "",
                expr,
            )
        ):
            if m.group(1) not in NOT_METRICS and not m.group(1).isdigit():
                selectors.add(m.group(1) + (m.group(2) or ""))
    total = 0
    for sel in selectors:
        query = {"query": f"count({sel})", "time": at}
        url = f"{base}/api/v1/query?{urllib.parse.urlencode(query)}"
        result = get_json(url, timeout=300)["data"]["result"]
        total += int(float(result[0]["value"][1])) if result else 0
    return total


def resident_bytes(base: str) -> float:
    """`process_resident_memory_bytes` from a server's own /metrics."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("process_resident_memory_bytes"):
                return float(line.split()[-1])
    return float("nan")


def _vmalert_means(base: str) -> dict[str, tuple[float, float]]:
    """Per group: (sum, count) of vmalert_iteration_duration_seconds."""
    out: dict[str, list[float]] = {}
    with urllib.request.urlopen(f"{base}/metrics", timeout=60) as r:
        for line in r.read().decode().splitlines():
            m = re.match(
                r'vmalert_iteration_duration_seconds_(sum|count)\{.*?group="([^"]+)".*\} (\S+)',
                line,
            )
            if m:
                pair = out.setdefault(m.group(2), [0.0, 0.0])
                pair[0 if m.group(1) == "sum" else 1] += float(m.group(3))
    return {g: (v[0], v[1]) for g, v in out.items()}


@contextlib.contextmanager
def engine(name: str, workdir: Path, target: str, rules: str):
    """(query base, rules-evaluator base or None) of a Prometheus, or of VictoriaMetrics
    scraping with vmalert evaluating, loaded with `rules`."""
    scrape = (
        "global: {scrape_interval: 15s, scrape_timeout: 14s}\nscrape_configs:\n"
        f"- job_name: fleet\n  static_configs:\n  - targets: ['{target}']\n"
    )
    if name == "prometheus":
        config = scrape.replace(
            "scrape_timeout: 14s", "scrape_timeout: 14s, evaluation_interval: 15s"
        )
        with prometheus(
            "prometheus", workdir, config + "rule_files: [rules.yaml]\n", {"rules.yaml": rules}
        ) as base:
            yield base, None
        return
    with contextlib.ExitStack() as stack:
        vm = stack.enter_context(victoria_metrics("victoria-metrics", workdir, scrape))
        sink = stack.enter_context(_sink())
        alert = stack.enter_context(
            vmalert("vmalert", workdir, {"rules.yaml": rules}, vm, sink, "15s")
        )
        yield vm, alert


@contextlib.contextmanager
def _sink():
    """A loopback notifier that accepts vmalert's alert posts."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--cores", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--engine", choices=("prometheus", "victoriametrics"), default="prometheus")
    parser.add_argument("--minutes", type=float, default=7)
    args = parser.parse_args()
    fleet = Fleet(args.nodes, args.gpus, args.cores, args.jobs)
    server = serve(fleet)
    t = time.perf_counter()
    size = len(fleet.body())
    print(f"one scrape: {size / 1e6:.1f} MB, built in {time.perf_counter() - t:.1f}s")
    groups = compile_rules(load_config(RULES)).groups
    workdir = Path(tempfile.mkdtemp(prefix="rules-at-scale-"))
    target = f"127.0.0.1:{server.server_address[1]}"
    try:
        with engine(args.engine, workdir, target, to_yaml({"groups": groups})) as (base, alert):
            started = time.monotonic()
            rounds: dict[str, list[float]] = {}
            filled: dict[str, tuple[float, float]] = {}
            while time.monotonic() - started < args.minutes * 60:
                time.sleep(15)
                up = get_json(f"{base}/api/v1/query?query=scrape_samples_scraped", timeout=120)[
                    "data"
                ]["result"]
                print(
                    f"  {time.monotonic() - started:5.0f}s: "
                    f"{up[0]['value'][1] if up else 0} series per scrape",
                    flush=True,
                )
                # Once the 4m10s windows are full, keep every round's evaluation times.
                if time.monotonic() - started > 270:
                    if alert is None:
                        for g in get_json(f"{base}/api/v1/rules", timeout=120)["data"]["groups"]:
                            rounds.setdefault(g["name"], []).append(float(g["evaluationTime"]))
                    elif not filled:
                        filled = _vmalert_means(alert)
            if alert is not None:
                now = _vmalert_means(alert)
                for g, (total, count) in now.items():
                    before = filled.get(g, (0.0, 0.0))
                    n = count - before[1]
                    rounds[g] = [(total - before[0]) / n] if n else [float("nan")]
            memory = {args.engine: resident_bytes(base)}
            # Stop serving: with ingestion and rule evaluation off the cores, the instant
            # queries below, all at the moment serving stopped, measure evaluation alone.
            # VictoriaMetrics 1.79 answered such queries with most scraped series missing,
            # so there they run while it keeps ingesting (upper bounds).
            at = time.time()
            fleet.stopped = alert is None
            if alert is not None:
                memory["vmalert"] = resident_bytes(alert)
            quiet = {
                g["name"]: sum(_fastest(base, r["expr"], at) for r in g["rules"]) for g in groups
            }
            touched = {
                g["name"]: series_touched(base, [r["expr"] for r in g["rules"]], at) for g in groups
            }
            medians = sorted(
                ((name, statistics.median(times)) for name, times in rounds.items()),
                key=lambda x: -x[1],
            )
            every = {g["name"]: parse_duration(g.get("interval", "1m")) for g in groups}
            print(
                f"  {'group':<34} {'every':>6} {'in the engine':>14} {'fastest query':>14} "
                f"{'series':>9}"
            )
            for name, d in medians:
                print(
                    f"  {name:<34} {format_duration(every.get(name, 15)):>6} {d * 1000:11.0f} ms "
                    f"{quiet.get(name, 0) * 1000:11.0f} ms {touched.get(name, 0):9d}"
                )
            # A group evaluated every 60 s costs a quarter of its time per 15 s interval.
            share = {name: 15 / every.get(name, 15) for name, _ in medians}
            total = sum(d * share[name] for name, d in medians)
            fastest = sum(q * 15 / every.get(name, 15) for name, q in quiet.items())
            print(
                f"all groups, {args.nodes} nodes x {args.gpus} GPUs x {args.cores} cores, "
                f"{args.jobs} jobs on {args.engine}, per 15 s of wall time: {total:.2f} s of "
                f"evaluation while ingesting; {fastest:.2f} s as the fastest of {TRIES} instant "
                f"queries each ({100 * fastest / 15:.1f}% of one core); resident memory "
                + ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in memory.items())
            )
    finally:
        server.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
