"""A local Prometheus and Alertmanager for the demo and the tests: the real Debian binaries,
on 127.0.0.1 and a free high port, stopped by PID when the `with` block ends; read them with
`engines.prometheus_api`.

    with prometheus("prometheus", workdir, config_text, {"rules.yaml": rules}) as base:
        PrometheusAPI(base).query("up")["result"]
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def _server(
    name: str, argv: list[str], workdir: Path, port: int, ready: str = "/-/ready"
) -> Iterator[str]:
    log_path = workdir / f"{name}.log"
    log = open(log_path, "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited:\n" + log_path.read_text())
            try:
                with urllib.request.urlopen(f"{base}{ready}", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not become ready in 30s")
            time.sleep(0.1)
        yield base
    finally:
        stop_process(proc)
        log.close()


def _prometheus_family(
    name: str, binary: str, workdir: Path, config: str, storage: str, *flags: str
) -> contextlib.AbstractContextManager[str]:
    """Prometheus or Alertmanager (one flag style) on a free loopback port: `config` written to
    `{name}.yml`, `storage` the flag that places its data, then `flags`."""
    config_file = workdir / f"{name}.yml"
    config_file.write_text(config)
    port = free_port()
    argv = [
        binary,
        f"--config.file={config_file}",
        storage,
        f"--web.listen-address=127.0.0.1:{port}",
        *flags,
        "--log.level=warn",
    ]
    return _server(name, argv, workdir, port)


@contextlib.contextmanager
def prometheus(
    binary: str, workdir: Path, config: str, rule_files: dict[str, str]
) -> Iterator[str]:
    """Run Prometheus with `config` (YAML text; `rule_files:` may name the given files)."""
    for name, text in rule_files.items():
        (workdir / name).write_text(text)
    storage = f"--storage.tsdb.path={workdir / 'data'}"
    with _prometheus_family("prometheus", binary, workdir, config, storage) as base:
        yield base


@contextlib.contextmanager
def alertmanager(binary: str, workdir: Path, config: str) -> Iterator[str]:
    """Run Alertmanager with `config` (YAML text), gossip off, on a free loopback port."""
    # An empty --cluster.listen-address turns off HA gossip, which would bind 0.0.0.0:9094.
    storage, gossip_off = f"--storage.path={workdir / 'am-data'}", "--cluster.listen-address="
    with _prometheus_family("alertmanager", binary, workdir, config, storage, gossip_off) as base:
        yield base


@contextlib.contextmanager
def victoria_metrics(binary: str, workdir: Path, scrape_config: str | None = None) -> Iterator[str]:
    """Run single-node VictoriaMetrics (scraping `scrape_config`, Prometheus YAML, if given).

    Samples become queryable at once (`-search.latencyOffset=0s`), and samples as old as the
    Unix epoch are kept (`-retentionPeriod=100y`), so backfilled timelines can be read back.
    """
    port = free_port()
    argv = [
        binary,
        f"-storageDataPath={workdir / 'vm-data'}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-retentionPeriod=100y",
        "-search.latencyOffset=0s",
        "-search.disableCache",
        "-loggerLevel=WARN",
    ]
    if scrape_config is not None:
        (workdir / "scrape.yml").write_text(scrape_config)
        argv += [
            f"-promscrape.config={workdir / 'scrape.yml'}",
            "-promscrape.config.strictParse=false",
            "-promscrape.maxScrapeSize=512MB",  # a fleet benchmark serves ~90 MB per scrape
        ]
    with _server("victoria-metrics", argv, workdir, port, ready="/health") as base:
        yield base


@contextlib.contextmanager
def vmalert(
    binary: str,
    workdir: Path,
    rule_files: dict[str, str],
    datasource: str,
    notifier: str,
    evaluation_interval: str = "1m",
) -> Iterator[str]:
    """Run vmalert on `rule_files`, reading from and writing recordings back to `datasource`."""
    for name, text in rule_files.items():
        (workdir / name).write_text(text)
    port = free_port()
    argv = [
        binary,
        *(f"-rule={workdir / name}" for name in rule_files),
        f"-datasource.url={datasource}",
        f"-remoteWrite.url={datasource}",
        "-remoteWrite.flushInterval=200ms",
        f"-notifier.url={notifier}",
        f"-evaluationInterval={evaluation_interval}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-loggerLevel=WARN",
    ]
    with _server("vmalert", argv, workdir, port, ready="/health") as base:
        yield base
