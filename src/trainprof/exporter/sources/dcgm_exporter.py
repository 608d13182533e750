"""GPU readings from the node's NVIDIA dcgm-exporter instead of NVML.

On a cluster that already runs dcgm-exporter (the GPU Operator's), the exporter can take its
GPU readings from dcgm-exporter's `/metrics` on the same node rather than poll the GPUs a
second time. Everything downstream is the `trainprof` source: the exporter folds the readings
into its sampled histograms and bottleneck counters, so the rules read a few series per GPU
instead of normalising dcgm-exporter's series at every scrape (docs/sources.md has the cost of
each way on a 1,000-node fleet).

    exporter --collector.gpu.dcgm-exporter=http://127.0.0.1:9400/metrics
        fetch thread: GET every poll interval -> parse -> latest DcgmReading
        sampler:      read() takes the latest reading (never waits on the network)

The units and label spellings are dcgm-exporter's (`trainprof.sources.dcgm` has the same
table in PromQL): `DCGM_FI_DEV_GPU_UTIL` is a percent (the graphics engine's activity when it
is not served), framebuffer fields are MiB, energy mJ, the SM clock MHz; the GPU is `gpu`
(its index) and `UUID` (or `gpu_uuid`), its model `modelName`. A GPU's value only changes
when dcgm-exporter collects (every 30 s in the GPU Operator's default): each sample takes the
latest collected value, as each scrape of dcgm-exporter does.

Failures: a body that cannot be fetched fails the collector
(`trainprof_collector_success{collector="gpu"} 0`) until a fetch succeeds; the last readings
are served meanwhile for at most `stale_after` seconds, then no GPU series. Lines that do not
parse, values that are not numbers in range, GPUs past `MAX_GPUS` and MIG instances
(`GPU_I_ID` set: their rows are not whole GPUs) are skipped, counted and said once; the rest
of the body is used, and a reading that skipped lines marks the sample partial (success 0).
The URL's user and password, if any, are sent as basic authentication, only to that server
(a redirect to another host is refused, so neither the password nor another host's GPUs get
in: `contract.httpget`), and never logged.
"""

from __future__ import annotations

import base64
import dataclasses
import logging
import math
import re
import threading
import time
import urllib.parse
from collections.abc import Callable

from trainprof.contract import httpget
from trainprof.contract.sampling import GpuSample, HostSample
from trainprof.exporter.once import Once
from trainprof.sources.dcgm import ACTIVITIES, MIB

log = logging.getLogger("trainprof.exporter")

MAX_BODY_BYTES = 8 * 1024 * 1024  # 8 GPUs serve about 60 KB; a body past this is not dcgm's
# No node has more; each GPU becomes a few dozen series of the exporter, so a broken or
# hostile endpoint must not make it serve thousands.
MAX_GPUS = 256

# dcgm-exporter field -> (GpuSample attribute, factor to trainprof's unit). Utilization and
# memory combine several fields and are read apart.
_SCALED = {
    "DCGM_FI_DEV_POWER_USAGE": ("power_watts", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_joules", 1e-3),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_celsius", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_hertz", 1e6),
}
_RATIOS = {field: name for field, name in ACTIVITIES.items() if name != "gr_engine_active"}
_READ = {
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_RESERVED",
    *_SCALED,
    *_RATIOS,
}

_SAMPLE = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


class FetchError(Exception):
    """dcgm-exporter could not be read (refused, timed out, an HTTP error, too large)."""


@dataclasses.dataclass
class DcgmReading:
    """One dcgm-exporter body, as GPU samples.

    >>> from pathlib import Path
    >>> capture = Path("tests/data/real-exporters/dcgm-exporter-rtx4000ada-gpu-operator.prom")
    >>> gpu = parse(capture.read_text()).gpus[0]
    >>> gpu.index, gpu.uuid, gpu.name, gpu.utilization, gpu.memory_used_bytes / 2**20
    (0, 'GPU-a8394b51-c086-568a-9f1a-c1e1c934c44c', 'NVIDIA RTX 4000 Ada Generation', 0.0, 1.0)
    >>> gpu.memory_total_bytes / 2**20, gpu.power_watts, gpu.sm_clock_hertz, gpu.dram_active
    (20473.0, 40.979, 2310000000.0, 0.003074)
    """

    gpus: list[GpuSample]
    skipped: list[str] = dataclasses.field(default_factory=list)  # why each skipped line was
    mig_lines: int = 0

    @property
    def complete(self) -> bool:
        return not self.skipped


def parse(text: str) -> DcgmReading:
    """The whole GPUs of a dcgm-exporter body; damaged lines are skipped and said why."""
    fields: dict[tuple[int, str], dict[str, float]] = {}
    facts: dict[tuple[int, str], tuple[str, str]] = {}
    skipped: list[str] = []
    mig = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("DCGM_FI_"):
            continue
        name = line.partition("{")[0].partition(" ")[0]
        if name not in _READ:
            continue
        parsed = _parse_line(line)
        if isinstance(parsed, str):
            skipped.append(f"line {number}: {parsed}")
            continue
        labels, value = parsed
        if labels.get("GPU_I_ID"):
            mig += 1
            continue
        try:
            index = int(labels.get("gpu", ""))
        except ValueError:
            skipped.append(f"line {number}: {name} has no GPU index (gpu={labels.get('gpu')!r})")
            continue
        uuid = labels.get("UUID") or labels.get("gpu_uuid") or ""
        if not math.isfinite(value) or value < 0:
            skipped.append(f"line {number}: {name} of GPU {index} is {value}")
            continue
        key = (index, uuid)
        if key not in fields and len(fields) >= MAX_GPUS:
            skipped.append(f"line {number}: more than {MAX_GPUS} GPUs; GPU {index} left out")
            continue
        fields.setdefault(key, {})[name] = value
        facts.setdefault(
            key, (labels.get("modelName", ""), labels.get("DCGM_FI_DRIVER_VERSION", ""))
        )
    gpus = [
        _gpu(index, uuid, fields[(index, uuid)], *facts[(index, uuid)])
        for index, uuid in sorted(fields)
    ]
    return DcgmReading(gpus, skipped, mig)


def _parse_line(line: str) -> tuple[dict[str, str], float] | str:
    match = _SAMPLE.fullmatch(line)
    if match is None:
        return "not a sample line"
    labels: dict[str, str] = {}
    body = match.group(2) or ""
    position = 0
    while position < len(body):
        label = _LABEL.match(body, position)
        if label is None:
            return f"labels do not parse at {body[position : position + 20]!r}"
        labels[label.group(1)] = re.sub(r'\\[\\"n]', lambda m: _UNESCAPE[m.group()], label.group(2))
        position = label.end()
    try:
        return labels, float(match.group(3))
    except ValueError:
        return f"value {match.group(3)!r} is not a number"


def _gpu(index: int, uuid: str, values: dict[str, float], model: str, driver: str) -> GpuSample:
    gpu = GpuSample(index, uuid, name=model, driver_version=driver)
    if "DCGM_FI_DEV_GPU_UTIL" in values:
        gpu.utilization = min(values["DCGM_FI_DEV_GPU_UTIL"] / 100, 1.0)
    elif "DCGM_FI_PROF_GR_ENGINE_ACTIVE" in values:
        gpu.utilization = min(values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"], 1.0)
    used = values.get("DCGM_FI_DEV_FB_USED")
    if used is not None:
        gpu.memory_used_bytes = used * MIB
        free = values.get("DCGM_FI_DEV_FB_FREE")
        if free is not None:
            # NVML's total includes the driver's reservation, which dcgm reports apart.
            reserved = values.get("DCGM_FI_DEV_FB_RESERVED", 0.0)
            gpu.memory_total_bytes = (used + free + reserved) * MIB
    for field, (attribute, factor) in _SCALED.items():
        if field in values:
            setattr(gpu, attribute, values[field] * factor)
    for field, attribute in _RATIOS.items():
        if field in values:
            setattr(gpu, attribute, min(values[field], 1.0))
    return gpu


def redact(url: str) -> str:
    """`url` without its password, for logs.

    >>> redact("http://trainprof:s3cret@10.0.0.7:9400/metrics")
    'http://trainprof:***@10.0.0.7:9400/metrics'
    """
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = f"{parts.username}:***@{parts.netloc.rpartition('@')[2]}"
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def check_url(url: str) -> str:
    """`url` if the exporter can fetch it; ValueError naming what is wrong otherwise."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"{redact(url)!r} is not an http:// or https:// URL "
            "(dcgm-exporter's is http://<host>:9400/metrics)"
        )
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as e:
        raise ValueError(f"{redact(url)!r}: {e}") from None
    return url


def http_fetch(url: str, timeout: float) -> str:
    """GET `url` within `timeout` seconds in all (a server that trickles is cut off too),
    directly (dcgm-exporter is on the same node: never through an HTTP_PROXY the pod's
    environment sets), following a redirect only within the same server: the exporter
    neither sends the URL's credentials elsewhere nor serves another host's GPUs."""
    parts = urllib.parse.urlsplit(url)
    headers = {"Accept": "text/plain"}
    if parts.username is not None:
        credentials = f"{urllib.parse.unquote(parts.username)}:"
        credentials += urllib.parse.unquote(parts.password or "")
        headers["Authorization"] = "Basic " + base64.b64encode(credentials.encode()).decode()
        url = urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
    try:
        body = httpget.get(url, headers, timeout, MAX_BODY_BYTES, proxies=False)
    except httpget.FetchError as e:
        raise FetchError(str(e)) from None
    return body.decode("utf-8", "replace")


class DcgmExporterSource:
    """The `gpu` collector, read from dcgm-exporter: same GPU samples as `GpuSource` serves.

    # trainprof exporter --collector.gpu.dcgm-exporter=http://127.0.0.1:9400/metrics
    trainprof_gpu_utilization_ratio{gpu="0",node="n1",uuid="GPU-a8394b51-..."} 0.0
    trainprof_gpu_info{driver_version="580.95.05",gpu="0",
                       name="NVIDIA RTX 4000 Ada Generation",node="n1",uuid="GPU-..."} 1.0
    """

    name = "gpu"

    def __init__(
        self,
        url: str,
        poll_interval: float = 1.0,
        timeout: float = 2.0,
        stale_after: float = 10.0,
        fetch: Callable[[str, float], str] = http_fetch,
        clock: Callable[[], float] = time.monotonic,
    ):
        """`fetch(url, timeout)` returns the body or raises FetchError (tests replace it)."""
        self.url = check_url(url)
        self.poll_interval = poll_interval
        self.timeout = timeout
        self.stale_after = max(stale_after, poll_interval + timeout)
        self._fetch = fetch
        self._clock = clock
        self._lock = threading.Lock()
        self._reading: DcgmReading | None = None
        self._fetched_at = 0.0
        self._error = "no fetch has finished yet"
        self._failing = False  # the latest fetch failed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._polled = threading.Event()  # the first fetch has finished, well or not
        self._once = Once(log)

    def poll_once(self) -> None:
        """Fetch and parse one body now (the thread's body; tests call it directly)."""
        where = redact(self.url)
        try:
            reading = parse(self._fetch(self.url, self.timeout))
        except FetchError as e:
            with self._lock:
                self._error, self._failing = f"{where}: {e}", True
            self._once.start("fetch", "dcgm-exporter at %s could not be read: %s", where, e)
            return
        with self._lock:
            self._reading, self._fetched_at, self._failing = reading, self._clock(), False
        self._once.end("fetch", "dcgm-exporter at %s answers again", where)
        if reading.skipped:
            self._once.start(
                "damaged",
                "dcgm-exporter at %s: skipped %d damaged line(s), the rest is used; first: %s",
                where,
                len(reading.skipped),
                reading.skipped[0],
            )
        else:
            self._once.end("damaged", "dcgm-exporter at %s serves no damaged line again", where)
        if reading.mig_lines:
            self._once.start(
                "mig",
                "dcgm-exporter at %s serves MIG instances (%d series): left out, the exporter "
                "reads whole GPUs; compile the rules with --source dcgm for MIG",
                where,
                reading.mig_lines,
            )
        if not reading.gpus:
            self._once.start("none", "dcgm-exporter at %s serves no whole GPU", where)
        else:
            self._once.end("none", "dcgm-exporter at %s serves GPUs again", where)

    def _run(self) -> None:
        while True:
            started = self._clock()
            try:
                self.poll_once()
            except Exception as e:  # noqa: BLE001 - the thread must outlive a bad body
                self._once.start(
                    "poll", "reading dcgm-exporter failed: %s: %s", type(e).__name__, e
                )
            self._polled.set()
            if self._stop.wait(max(self.poll_interval - (self._clock() - started), 0.0)):
                return

    def read(self, sample: HostSample) -> bool:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="trainprof-dcgm-fetch", daemon=True
            )
            self._thread.start()
            # The first read primes the sources: give it the first body, not an error.
            self._polled.wait(self.timeout + 1.0)
        with self._lock:
            reading, fetched_at, error = self._reading, self._fetched_at, self._error
            failing = self._failing
        if reading is None:
            raise FetchError(error)
        age = self._clock() - fetched_at
        if age > self.stale_after:
            raise FetchError(f"no answer for {age:.0f}s (last: {error})")
        # Until `stale_after`, a failed fetch keeps the last readings but marks the sample
        # partial: success 0 says they are not fresh.
        sample.gpus = list(reading.gpus)
        return reading.complete and bool(reading.gpus) and not failing

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout + 1.0)
