"""Real Prometheus servers for tests: on 127.0.0.1, a free high port, killed by PID."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def query(base: str, expr: str) -> dict:
    return get_json(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")


@contextlib.contextmanager
def prometheus(binary: str, workdir: Path, config: str, rule_files: dict[str, str]):
    """Run Prometheus with `config` (YAML text; `rule_files:` may name the given files)."""
    for name, text in rule_files.items():
        (workdir / name).write_text(text)
    (workdir / "prometheus.yml").write_text(config)
    port = free_port()
    log = open(workdir / "prometheus.log", "w")
    proc = subprocess.Popen(
        [binary, f"--config.file={workdir / 'prometheus.yml'}",
         f"--storage.tsdb.path={workdir / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                log_text = (workdir / "prometheus.log").read_text()
                raise RuntimeError("prometheus exited:\n" + log_text)
            try:
                with urllib.request.urlopen(f"{base}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("prometheus did not become ready in 30s")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def wait_for_targets(base: str, count: int, timeout: float = 30.0) -> None:
    """Until `count` scrape targets are up (the first scrape comes ~5 s after start)."""
    deadline = time.monotonic() + timeout
    while True:
        targets = get_json(f"{base}/api/v1/targets")["data"]["activeTargets"]
        if sum(t["health"] == "up" for t in targets) >= count:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"targets not up after {timeout:g}s: {targets}")
        time.sleep(0.2)


def try_query(base: str, expr: str) -> tuple[list | None, str | None]:
    """(result, None) or (None, Prometheus' error message) for an instant query."""
    import urllib.error

    try:
        doc = query(base, expr)
    except urllib.error.HTTPError as e:
        body = json.loads(e.read() or b"{}")
        return None, body.get("error", str(e))
    return doc["data"]["result"], None


def wait_for_firing(base: str, rules: set[str], timeout: float = 60.0) -> set[str]:
    """Until alerts of every rule in `rules` fire; the rules firing then."""
    deadline = time.monotonic() + timeout
    while True:
        alerts = get_json(f"{base}/api/v1/alerts")["data"]["alerts"]
        firing = {a["labels"].get("rule") for a in alerts if a["state"] == "firing"}
        if rules <= firing:
            return firing
        if time.monotonic() > deadline:
            raise RuntimeError(f"after {timeout:g}s only {sorted(firing)} fire, not all of "
                               f"{sorted(rules)}")
        time.sleep(0.5)
