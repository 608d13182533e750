"""How long the compiled default rules take to evaluate for 1,000 nodes x 8 GPUs.

    python benchmarks/rules_at_scale.py [--nodes 1000] [--gpus 8] [--cores 64] [--jobs 100]
        [--engine prometheus|victoriametrics] [--minutes 10] [--baseline 3] [--scan 15s|60s]
        [--unhealthy 1]
        [--source trainprof|dcgm,node_exporter|dcgm|node_exporter] [--attribution pod|assignment]

A fake exporter serves the series of `--nodes` hosts (the real SampleAccumulator's output for
one host with `--gpus` GPUs and `--cores` cores, repeated with a different `node` label, the
nodes spread over `--jobs` training jobs), advancing by 30 samples (15 s at 0.5 s) per
scrape. With `--source` naming dcgm and/or node_exporter, it serves instead what those
exporters would serve for each node (source_fleet.py: the captured label sets of
tests/data/real-exporters, every core's CPU-time counters) and kube-state-metrics'
`kube_pod_labels` tying each node's worker pod to its job (`--attribution assignment`: the
ranks' `trainprof_gpu_assignment_info` instead), plus the trainprof fake for the signals the
named sources do not serve. A real Prometheus (or VictoriaMetrics scraping and vmalert
evaluating) scrapes it every 15 s with the default ProfilerReport rules compiled for that
source to evaluate every 15 s. After the
rules' windows have filled, it prints each group's evaluation time (Prometheus:
`evaluationTime` of /api/v1/rules; vmalert: the mean of `vmalert_iteration_duration_seconds`
over the rounds since the windows filled), the series its expressions select, and the sum,
the single-core cost of one evaluation round, with the engines' resident memory. The fake
exporter and the engine's scraping share the machine's cores with the rule evaluation, so on
a small machine those times wait for a core as well as compute. They also leave out what the
rules cost the engine outside a group's evaluation (Go's garbage collector, which runs on
other threads and rescans the whole heap). So it also reads the CPU time the engine
processes use from the windows filling to the end of `--minutes`, and compares it with the
CPU they used over `--baseline` minutes of ingestion alone before the rules were loaded (the
engine starts with an empty rule file; the rules come with a SIGHUP): the difference is the
rules' own CPU. Then it stops serving (Prometheus stops ingesting and marks the series
stale) and runs every rule's expression as an instant query at the moment serving stopped,
keeping the fastest of five: the undisturbed cost (on VictoriaMetrics, while it keeps
ingesting). On Prometheus it also prints the costliest rules
of the `trainprof.sources` group (the adapters' normalisation), each with its evaluation time
in the engine and its fastest query.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import http.server
import os
import random
import re
import shutil
import signal
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from _procs import cpu_seconds, serve_exposition, serve_paths
from prometheus_client import CollectorRegistry, generate_latest
from source_fleet import NAMESPACE, SourceFleet, hashmod, node_name

from trainprof.contract.durations import format_duration, parse_duration
from trainprof.contract.sampling import GpuSample, HostSample, SampleAccumulator
from trainprof.engines.localstack import prometheus, victoria_metrics, vmalert
from trainprof.engines.prometheus_api import PrometheusAPI
from trainprof.generation.render import to_yaml
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import load_config
from trainprof.sources import parse_sources
from trainprof.sources.tiers import federation_match, tier


def rules_config(scan: float) -> dict:
    """ProfilerReport with every rule scanning every `scan` seconds (SageMaker's default: 60)."""
    parameters = {"scan_interval_us": int(scan * 1e6)}
    return {
        "scrape_interval": "15s",
        "rules": [{"rule": "ProfilerReport", "parameters": parameters}],
    }


class Fleet:
    """The exposition of `nodes` hosts, advanced one scrape interval at every scrape.

    Every GPU of the first `unhealthy` share of the jobs draws its utilization uniformly
    from 0 to 1 at each sample (LowGPUUtilization's "fluctuating" case fires for each);
    the other jobs' GPUs draw from 0.75 to 1 (no rule fires for them).
    """

    def __init__(
        self,
        nodes: int,
        gpus: int,
        cores: int = 8,
        jobs: int = 1,
        namespace: str | None = None,
        unhealthy: float = 1.0,
    ):
        self.nodes, self.gpus, self.cores, self.jobs = nodes, gpus, cores, jobs
        self.unhealthy_jobs = round(jobs * unhealthy)
        identity = {"node": "NODE", "training_job": "JOB"}
        if namespace:  # as the adapters' job attribution labels the jobs
            identity["namespace"] = namespace
        self.hosts = {
            low: SampleAccumulator(0.5, identity=identity) for low in (0.0, 0.75)
        }  # by the lowest GPU utilization drawn
        self.rng = random.Random(1)
        self.t = 0.0
        self.lock = threading.Lock()
        self.stopped = False

    def _advance(self) -> None:
        for _ in range(30):
            self.t += 0.5
            for low, acc in self.hosts.items():
                acc.observe(
                    HostSample(
                        self.t,
                        cpu_utilization=[self.rng.random() for _ in range(self.cores)],
                        cpu_iowait=[self.rng.random() * 0.1 for _ in range(self.cores)],
                        memory_used_ratio=0.4,
                        gpus=[
                            GpuSample(
                                i,
                                f"GPU-{i}",
                                utilization=low + (1 - low) * self.rng.random(),
                                memory_used_ratio=0.5 + 0.01 * self.rng.random(),
                            )
                            for i in range(self.gpus)
                        ],
                    )
                )

    def _template(self, acc: SampleAccumulator) -> tuple[str, str]:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(type("C", (), {"collect": lambda _: acc.families()})())
        lines = generate_latest(registry).decode().splitlines(keepends=True)
        header = "".join(ln for ln in lines if ln.startswith("#"))
        return header, "".join(ln for ln in lines if not ln.startswith("#"))

    def body(self) -> bytes:
        with self.lock:
            self._advance()
            templates = {low: self._template(acc) for low, acc in self.hosts.items()}
        out = [templates[0.0][0]]
        for n in range(self.nodes):
            job = n % self.jobs
            _, template = templates[0.0 if job < self.unhealthy_jobs else 0.75]
            out.append(
                template.replace('node="NODE"', f'node="n{n:04d}"').replace(
                    'training_job="JOB"', f'training_job="job{job:03d}"'
                )
            )
        return "".join(out).encode()


class AdapterFleet:
    """What the exporters of `source` serve for the fleet: dcgm-exporter and/or node_exporter
    with the job attribution, and trainprof's exporter for the signals they do not serve."""

    def __init__(self, source: tuple[str, ...], args: argparse.Namespace):
        dcgm, node = "dcgm" in source, "node_exporter" in source
        # Without dcgm the GPUs' pods are unknown: jobs come from the ranks' assignment.
        attribution = args.attribution if dcgm else "assignment"
        self.adapters = SourceFleet(
            args.nodes, args.gpus, args.cores, args.jobs, dcgm, node, attribution
        )
        self.trainprof = None
        if not (dcgm and node):
            gpus, cores = 0 if dcgm else args.gpus, 0 if node else args.cores
            self.trainprof = Fleet(args.nodes, gpus, cores, args.jobs, NAMESPACE)
        self.stopped = False

    def body(self) -> bytes:
        body = self.adapters.body()
        if self.trainprof is not None:
            body += self.trainprof.body().decode()
        return body.encode()


class ShardedFleet:
    """The fleet of `AdapterFleet` for `shards` Prometheus servers sharded by node, with a
    global one over them: node_exporter's series of the nodes each shard's `hashmod` keeps
    (`/shard/<i>`, one body per shard standing for its nodes' targets), and everything else
    (dcgm-exporter, the job attribution, trainprof's exporter) for the global server
    (`/global`)."""

    def __init__(self, source: tuple[str, ...], args: argparse.Namespace, shards: int):
        dcgm = "dcgm" in source
        attribution = args.attribution if dcgm else "assignment"
        common = (args.nodes, args.gpus, args.cores, args.jobs)
        self.hosts = SourceFleet(*common, False, True, "none")
        self.rest = SourceFleet(*common, dcgm, False, attribution)
        self.trainprof = None
        if not dcgm:
            self.trainprof = Fleet(args.nodes, args.gpus, 0, args.jobs, NAMESPACE)
        names = {n: node_name(n) for n in range(args.nodes)}
        self.shards = [
            [n for n, name in names.items() if hashmod(name, shards) == i] for i in range(shards)
        ]
        self.lock = threading.Lock()
        self.host_body = ""
        self.scrapes = [0] * shards
        self.stopped = False

    def shard_body(self, shard: int) -> bytes | None:
        if self.stopped:
            return None
        with self.lock:
            # Every shard scrapes once per interval: advance the hosts at the first of them.
            self.scrapes[shard] += 1
            if self.scrapes[shard] > min(self.scrapes) or not self.host_body:
                self.host_body = self.hosts.one_node()
            one = self.host_body
        return self.hosts.body(one, self.shards[shard]).encode()

    def global_body(self) -> bytes | None:
        if self.stopped:
            return None
        body = self.rest.body()
        if self.trainprof is not None:
            body += self.trainprof.body().decode()
        return body.encode()

    def body(self) -> bytes:
        """Everything, as one server would scrape it (for its size)."""
        shards = b"".join(self.shard_body(i) or b"" for i in range(len(self.shards)))
        return shards + (self.global_body() or b"")


def serve(fleet: Fleet | AdapterFleet | ShardedFleet) -> http.server.ThreadingHTTPServer:
    if isinstance(fleet, ShardedFleet):
        return serve_paths(
            {
                "/global": fleet.global_body,
                **{
                    f"/shard/{i}": functools.partial(fleet.shard_body, i)
                    for i in range(len(fleet.shards))
                },
            }
        )
    return serve_exposition(lambda: None if fleet.stopped else fleet.body())


TRIES = 5


def _fastest(base: str, expr: str, at: float) -> float:
    """Seconds of the fastest of TRIES instant queries of `expr`: the least disturbed by the
    scrapes that share the machine's cores. An answer may hold a recording's every series
    (192,000 at 1,000 nodes): the client's cap is raised to 1 GiB."""
    api = PrometheusAPI(base, timeout=300, max_bytes=2**30)
    best = float("inf")
    for _ in range(TRIES):
        t = time.perf_counter()
        api.query(expr, at)
        best = min(best, time.perf_counter() - t)
    return best


SELECTOR = re.compile(
    r"(?<![\w:])([a-zA-Z_:][\w:]*)(\{[^}]*\})?(?!\s*\()(?=\s*(?:\[|\)|,|$|\s|offset))"
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


def _outside_strings(expr: str) -> str:
    """`expr` without the string arguments of functions (label_replace's), keeping the
    strings of label matchers."""
    out, depth, i = [], 0, 0
    while i < len(expr):
        c = expr[i]
        if c == '"':
            end = i + 1
            while expr[end] != '"':
                end += 2 if expr[end] == "\\" else 1
            out.append(expr[i : end + 1] if depth else '""')
            i = end + 1
            continue
        depth += {"{": 1, "}": -1}.get(c, 0)
        out.append(c)
        i += 1
    return "".join(out)


def series_touched(base: str, exprs: list[str], at: float) -> int:
    """Series the expressions select: `count()` of each distinct selector in them."""
    selectors = set()
    for expr in exprs:
        for m in SELECTOR.finditer(
            re.sub(
                r"\b(by|without|on|ignoring|group_left|group_right)"
                r"\s*\([^)]*\)",
                "",
                _outside_strings(expr),
            )
        ):
            if m.group(1) not in NOT_METRICS and not m.group(1).isdigit():
                selectors.add(m.group(1) + (m.group(2) or ""))
    api = PrometheusAPI(base, timeout=300)
    total = 0
    for sel in selectors:
        result = api.query(f"count({sel})", at)["result"]
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


SOURCES_GROUP = "trainprof.sources"
NO_RULES = "groups: []\n"
WARM_UP = 60  # seconds of ingestion before the baseline: every series created
FILL = 270  # seconds after the rules load before their longest window (4m10s) is full
ENGINES = ("prometheus", "victoria-metrics", "vmalert")


def engine_pids(workdir: Path) -> list[int]:
    """The engine processes started on `workdir` (Prometheus; or VictoriaMetrics and vmalert)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # Each engine's files lie in its own folder: shard1/ is not shard10/.
        if Path(argv[0].decode()).name in ENGINES and f"{workdir}/".encode() in b" ".join(argv):
            pids.append(int(entry))
    return pids


def engine_cpu(pids: list[int]) -> float:
    """CPU seconds (user + system) the engine processes have used so far."""
    return sum(cpu_seconds(pid) for pid in pids)


def load_rules(workdir: Path, pids: list[int], rules: str) -> None:
    """Write the rule file and have the evaluator (Prometheus or vmalert) reload it."""
    (workdir / "rules.yaml").write_text(rules)
    for pid in pids:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if Path(argv[0].decode()).name in ("prometheus", "vmalert"):
            os.kill(pid, signal.SIGHUP)


def _source(text: str) -> tuple[str, ...]:
    try:
        return parse_sources(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _print_rules(
    group: dict,
    per_rule: dict[tuple[str, int], list[float]],
    fastest: dict[tuple[str, int], float],
) -> None:
    """The group's rules, costliest first: in the engine (median round) and fastest query."""
    rows = []
    for i, rule in enumerate(group["rules"]):
        times = per_rule.get((group["name"], i))
        engine_s = statistics.median(times) if times else float("nan")
        name = rule.get("record") or f"{rule['alert']} ({rule['labels'].get('scope', '')})"
        rows.append((name, engine_s, fastest[group["name"], i]))
    rows.sort(key=lambda r: -max(r[1] if r[1] == r[1] else 0, r[2]))
    print(f"  {group['name']}, by rule:")
    print(f"    {'rule':<52} {'in the engine':>14} {'fastest query':>14}")
    for name, engine_s, quick in rows:
        # vmalert times groups, not rules.
        engine = f"{engine_s * 1000:11.1f} ms" if engine_s == engine_s else f"{'-':>14}"
        print(f"    {name:<52} {engine} {quick * 1000:11.1f} ms")


@dataclasses.dataclass
class Server:
    """One engine of the run: where to query it, its rules and its processes."""

    name: str
    base: str  # where its series are queried
    alert: str | None  # vmalert, which evaluates the rules, or None: the engine does
    workdir: Path
    groups: list[dict]  # the rule groups it evaluates
    pids: list[int] = dataclasses.field(default_factory=list)


@contextlib.contextmanager
def sharded(workdir: Path, target: str, fleet: ShardedFleet, groups: list[dict]):
    """Prometheus servers sharded by node and a global one over them (docs/sources.md):
    each shard scrapes its nodes' node_exporter series and records the `shard` tier; the
    global server scrapes the rest, federates the shards' per-node recordings and evaluates
    the `global` tier. All start with no rules."""
    head = "global: {scrape_interval: 15s, scrape_timeout: 14s, evaluation_interval: 15s}\n"
    servers = []
    with contextlib.ExitStack() as stack:
        for i in range(len(fleet.shards)):
            home = workdir / f"shard{i}"
            home.mkdir()
            config = head.replace("global: {", f"global: {{external_labels: {{shard: '{i}'}}, ")
            config += (
                f"scrape_configs:\n- job_name: node\n  metrics_path: /shard/{i}\n"
                f"  static_configs:\n  - targets: ['{target}']\nrule_files: [rules.yaml]\n"
            )
            base = stack.enter_context(
                prometheus("prometheus", home, config, {"rules.yaml": NO_RULES})
            )
            servers.append(Server(f"shard {i}", base, None, home, tier(groups, "shard")))
        home = workdir / "global"
        home.mkdir()
        shards = ", ".join(f"'{s.base.removeprefix('http://')}'" for s in servers)
        config = head + (
            f"scrape_configs:\n- job_name: fleet\n  metrics_path: /global\n"
            f"  static_configs:\n  - targets: ['{target}']\n"
            "- job_name: federate\n  honor_labels: true\n  metrics_path: /federate\n"
            f"  params: {{'match[]': ['{federation_match()}']}}\n"
            f"  static_configs:\n  - targets: [{shards}]\nrule_files: [rules.yaml]\n"
        )
        base = stack.enter_context(prometheus("prometheus", home, config, {"rules.yaml": NO_RULES}))
        servers.append(Server("global", base, None, home, tier(groups, "global")))
        yield servers


@contextlib.contextmanager
def one_engine(name: str, workdir: Path, target: str, groups: list[dict]):
    with engine(name, workdir, target, NO_RULES) as (base, alert):
        yield [Server(name, base, alert, workdir, groups)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--cores", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--engine", choices=("prometheus", "victoriametrics"), default="prometheus")
    parser.add_argument(
        "--minutes",
        type=float,
        default=10,
        help="how long to run with the rules loaded; the CPU they use is measured from the "
        "moment their windows fill (4.5 min) to the end: leave at least 5 min, the longest "
        "group interval",
    )
    parser.add_argument(
        "--baseline",
        type=float,
        default=3,
        help="minutes of ingestion alone, before the rules are loaded, to measure the engine's "
        "CPU without them",
    )
    parser.add_argument(
        "--unhealthy",
        type=float,
        default=1.0,
        help="the share of jobs whose GPUs fluctuate, so that LowGPUUtilization fires for "
        "each of their GPUs (trainprof source; default 1: every GPU of the fleet)",
    )
    parser.add_argument(
        "--scan",
        type=parse_duration,
        default=15.0,
        help="the rules' scan interval, how often the alerting groups run (default 15s; "
        "the compiled default is SageMaker's 60s)",
    )
    parser.add_argument(
        "--source",
        type=_source,
        default=("trainprof",),
        help="the rules' source setting: trainprof, dcgm, node_exporter or a combination",
    )
    parser.add_argument(
        "--attribution",
        choices=("pod", "assignment"),
        default="pod",
        help="how the adapters find each GPU's job: kube-state-metrics' kube_pod_labels "
        "(pod) or the ranks' trainprof_gpu_assignment_info",
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=0,
        help="Prometheus servers sharded by node (hashmod of the node's name) recording "
        "node_exporter's per-core reduction, with a global server federating them and "
        "evaluating the rest (`trainprof rules compile --tier`); 0: one server (default)",
    )
    args = parser.parse_args()
    if args.minutes * 60 < FILL + 60:
        parser.error(
            f"--minutes {args.minutes:g} leaves no time to measure after the rules' windows "
            f"fill ({FILL / 60:g} min): give at least {FILL / 60 + 1:g}"
        )
    if args.shards and ("node_exporter" not in args.source or args.engine != "prometheus"):
        parser.error(
            "--shards shards node_exporter's series over Prometheus servers: give "
            "a --source naming node_exporter, on --engine prometheus"
        )
    if args.shards == 1 or args.shards < 0:
        parser.error("--shards: give 2 or more, or 0 for one server")
    if args.source == ("trainprof",):
        fleet: Fleet | AdapterFleet | ShardedFleet = Fleet(
            args.nodes, args.gpus, args.cores, args.jobs, unhealthy=args.unhealthy
        )
        rules = rules_config(args.scan)
    else:
        fleet = (
            ShardedFleet(args.source, args, args.shards)
            if args.shards
            else AdapterFleet(args.source, args)
        )
        rules = {**rules_config(args.scan), "source": ",".join(args.source)}
    server = serve(fleet)
    t = time.perf_counter()
    size = len(fleet.body())
    print(f"one scrape: {size / 1e6:.1f} MB, built in {time.perf_counter() - t:.1f}s")
    groups = compile_rules(load_config(rules)).groups
    workdir = Path(tempfile.mkdtemp(prefix="rules-at-scale-"))
    target = f"127.0.0.1:{server.server_address[1]}"
    try:
        # Started with no rules: first the engines' CPU while they only ingest, then the rules.
        engines = (
            sharded(workdir, target, fleet, groups)
            if isinstance(fleet, ShardedFleet)
            else one_engine(args.engine, workdir, target, groups)
        )
        with engines as servers:
            measure(servers, fleet, args)
    finally:
        server.shutdown()
        shutil.rmtree(workdir, ignore_errors=True)


def measure(servers: list[Server], fleet, args: argparse.Namespace) -> None:
    """Ingestion alone, then the rules: each server's CPU, group times and fastest queries."""
    started = time.monotonic()
    for s in servers:
        s.pids = engine_pids(s.workdir)

    def poll() -> None:
        counts = []
        for s in servers:
            up = PrometheusAPI(s.base, timeout=120).query("sum(scrape_samples_scraped)")["result"]
            counts.append(f"{s.name} {up[0]['value'][1] if up else 0}")
        print(
            f"  {time.monotonic() - started:5.0f}s: series per scrape: " + ", ".join(counts),
            flush=True,
        )

    while time.monotonic() - started < WARM_UP:
        time.sleep(15)
        poll()
    quiet_from = (time.monotonic(), [engine_cpu(s.pids) for s in servers])
    while time.monotonic() - quiet_from[0] < args.baseline * 60:
        time.sleep(15)
        poll()
    elapsed = time.monotonic() - quiet_from[0]
    without = [(engine_cpu(s.pids) - c) / elapsed for s, c in zip(servers, quiet_from[1])]
    for s in servers:
        load_rules(s.workdir, s.pids, to_yaml({"groups": s.groups}))
    started = time.monotonic()
    cpu_from: tuple[float, list[float]] | None = None
    rounds: list[dict[str, list[float]]] = [{} for _ in servers]
    # the adapter groups' rules, by group and position
    per_rule: list[dict[tuple[str, int], list[float]]] = [{} for _ in servers]
    filled: dict[str, tuple[float, float]] = {}
    alert = servers[0].alert
    while time.monotonic() - started < args.minutes * 60:
        time.sleep(15)
        poll()
        # Once the 4m10s windows are full, keep every round's evaluation times.
        if time.monotonic() - started > FILL:
            if cpu_from is None:
                cpu_from = (time.monotonic(), [engine_cpu(s.pids) for s in servers])
            if alert is None:
                for k, s in enumerate(servers):
                    for g in PrometheusAPI(s.base, timeout=120).rule_groups():
                        rounds[k].setdefault(g["name"], []).append(float(g["evaluationTime"]))
                        if g["name"].startswith(SOURCES_GROUP):
                            for i, r in enumerate(g["rules"]):
                                times = per_rule[k].setdefault((g["name"], i), [])
                                times.append(float(r["evaluationTime"]))
            elif not filled:
                filled = _vmalert_means(alert)
    if alert is not None:
        now = _vmalert_means(alert)
        for g, (total, count) in now.items():
            before = filled.get(g, (0.0, 0.0))
            n = count - before[1]
            if n:
                rounds[0][g] = [(total - before[0]) / n]
            else:
                # A 5 m group may not run between the windows filling and the end:
                # its mean over the whole run, first (smaller) evaluations included.
                rounds[0][g] = [total / count] if count else [float("nan")]
    memory = {s.name: resident_bytes(s.base) for s in servers}
    if alert is not None:
        memory["vmalert"] = resident_bytes(alert)
    assert cpu_from is not None  # --minutes is checked to outlast FILL
    # The same engine ingesting the same series, with and without the rules: the
    # difference is the rules' own CPU (evaluation, the recordings' writes, alert
    # templates, and the garbage collection all of that causes, which a group's
    # evaluation time leaves out).
    elapsed = time.monotonic() - cpu_from[0]
    with_rules = [(engine_cpu(s.pids) - c) / elapsed for s, c in zip(servers, cpu_from[1])]
    at = time.time()
    # Stop serving: with ingestion and rule evaluation off the cores, the instant
    # queries below, all at the moment serving stopped, measure evaluation alone.
    # VictoriaMetrics 1.79 answered such queries with most scraped series missing,
    # so there they run while it keeps ingesting (upper bounds).
    fleet.stopped = alert is None
    totals = []
    for k, s in enumerate(servers):
        if len(servers) > 1:
            print(f"{s.name}:")
        totals.append(_report(s, rounds[k], per_rule[k], at))
    for k, s in enumerate(servers):
        rules_cpu = (with_rules[k] - without[k]) * 15
        ratio = f"{rules_cpu / (without[k] * 15):.2f}x" if without[k] else "-"
        print(
            f"{s.name} CPU, still ingesting: {with_rules[k] * 100:.1f}% of one core with the "
            f"rules loaded, {without[k] * 100:.1f}% without (its ingestion: "
            f"{without[k] * 15:.2f} s per 15 s); the rules' own: {rules_cpu:.2f} s per 15 s "
            f"({100 * rules_cpu / 15:.1f}% of one core, {ratio} its ingestion)"
        )
    if len(servers) > 1:
        rules_cpu = sum(w - o for w, o in zip(with_rules, without)) * 15
        ingest = sum(without) * 15
        print(
            f"all servers: ingestion {ingest:.2f} s per 15 s, the rules' own {rules_cpu:.2f} s "
            f"({rules_cpu / ingest:.2f}x)"
        )
    total = sum(t[0] for t in totals)
    fastest = sum(t[1] for t in totals)
    where = args.engine if len(servers) == 1 else f"{len(servers) - 1} shards + a global server"
    print(
        f"all groups, {args.nodes} nodes x {args.gpus} GPUs x {args.cores} cores, "
        f"{args.jobs} jobs, source {','.join(args.source)}, "
        f"scan {format_duration(args.scan)}, on {where}, "
        f"per 15 s of wall time: {total:.2f} s of "
        f"evaluation while ingesting; {fastest:.2f} s as the fastest of {TRIES} instant "
        f"queries each ({100 * fastest / 15:.1f}% of one core); resident memory "
        + ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in memory.items())
    )


def _report(
    s: Server,
    rounds: dict[str, list[float]],
    per_rule: dict[tuple[str, int], list[float]],
    at: float,
) -> tuple[float, float]:
    """Print one server's groups; its (evaluation, fastest queries) per 15 s."""
    groups = s.groups
    fastest_rule = {
        (g["name"], i): _fastest(s.base, r["expr"], at)
        for g in groups
        for i, r in enumerate(g["rules"])
    }
    quiet = {
        g["name"]: sum(fastest_rule[g["name"], i] for i in range(len(g["rules"]))) for g in groups
    }
    touched = {
        g["name"]: series_touched(s.base, [r["expr"] for r in g["rules"]], at) for g in groups
    }
    medians = sorted(
        ((name, statistics.median(times)) for name, times in rounds.items()),
        key=lambda x: -x[1],
    )
    every = {g["name"]: parse_duration(g.get("interval", "1m")) for g in groups}
    print(f"  {'group':<34} {'every':>6} {'in the engine':>14} {'fastest query':>14} {'series':>9}")
    for name, d in medians:
        print(
            f"  {name:<34} {format_duration(every.get(name, 15)):>6} {d * 1000:11.0f} ms "
            f"{quiet.get(name, 0) * 1000:11.0f} ms {touched.get(name, 0):9d}"
        )
    for group in groups:
        if group["name"].startswith(SOURCES_GROUP):
            _print_rules(group, per_rule, fastest_rule)
    # A group evaluated every 60 s costs a quarter of its time per 15 s interval.
    share = {name: 15 / every.get(name, 15) for name, _ in medians}
    total = sum(d * share[name] for name, d in medians)
    fastest = sum(q * 15 / every.get(name, 15) for name, q in quiet.items())
    return total, fastest


if __name__ == "__main__":
    main()
