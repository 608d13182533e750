"""The local stack of `make demo` and `trainprof stack`: Alertmanager with trainprof's
generated routing, delivering to a webhook that prints each notification, and Prometheus
scraping the exporter and the training ranks every second or so, with compiled rules; the
real Debian binaries on 127.0.0.1 (trainprof.engines.localstack), stopped when the `with`
block ends.

The ranks are found through Prometheus `file_sd`: a process started with
`TRAINPROF_FILE_SD_DIR=<stack.targets>` writes its target there when it calls
`trainprof.start()` (trainprof.deploy.file_sd), so any number of ranks, on any port, are
scraped within a second.

    with local_stack(workdir, rules_text, {"trainprof": 9945}, say=print) as stack:
        print(stack.prometheus, stack.alertmanager)
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import json
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from trainprof.contract.names import JOB_LABEL

RANKS_JOB = "trainprof-training"
EXPORTER_JOB = "trainprof"


@dataclasses.dataclass
class Stack:
    """Where the running stack answers."""

    prometheus: str
    alertmanager: str
    targets: Path  # the file_sd directory of the ranks (TRAINPROF_FILE_SD_DIR)
    notifications: list[dict[str, Any]]  # what Alertmanager delivered, in order

    def environment(self, training_job: str, node: str) -> dict[str, str]:
        """What a training process needs to be scraped by this stack with these labels."""
        return {
            "TRAINPROF_JOB": training_job,
            "TRAINPROF_NODE": node,
            "TRAINPROF_FILE_SD_DIR": str(self.targets),
            "TRAINPROF_FILE_SD_ADDRESS": "127.0.0.1",
            "TRAINPROF_PROMETHEUS_URL": self.prometheus,
            "TRAINPROF_ALERTMANAGER_URL": self.alertmanager,
        }


def webhook(
    say: Callable[[str], None], received: list[dict[str, Any]]
) -> tuple[http.server.ThreadingHTTPServer, str]:
    """A receiver that prints what Alertmanager delivers, as a pager or chat would show it,
    and keeps each payload in `received`."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.end_headers()
            try:
                payload = json.loads(body)
            except json.JSONDecodeError:
                return
            received.append(payload)
            receiver = payload.get("receiver", "?").removeprefix("trainprof-")
            names = sorted({a["labels"].get("alertname", "?") for a in payload.get("alerts", [])})
            say(
                f"  -> {receiver:<7} {payload.get('status', '?').upper():<8} "
                f"{', '.join(names)} (job {payload.get('groupLabels', {}).get(JOB_LABEL)})"
            )

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def alertmanager_config(hook: str) -> str:
    """trainprof's routing and inhibitions, at local speed, every receiver the webhook."""
    from trainprof.alerting import files, routing
    from trainprof.alerting.model import Timing
    from trainprof.generation.render import to_yaml

    # Pages go out at once; tickets wait 10 s for the pages that may inhibit them (two
    # minutes in the generated routing).
    fast, ticket = Timing("1s", "5s", "1h"), Timing("10s", "5s", "1h")
    tree = routing.tree(
        timing={
            "subtree": fast,
            routing.PAGE: fast,
            routing.NOTIFY: ticket,
            routing.INFO: ticket,
            routing.ACTIONS: ticket,
            "health": ticket,
        }
    )
    sink = {"webhook_configs": [{"url": hook, "send_resolved": True}]}
    receivers = {
        "default": {},
        routing.PAGE: sink,
        routing.NOTIFY: sink,
        routing.INFO: sink,
        routing.ACTIONS: {},
    }
    return to_yaml(files.example_config(tree, routing.inhibit_rules(), receivers))


def prometheus_config(
    targets: Mapping[str, int], alertmanager: str, scrape_interval: float, file_sd: Path
) -> str:
    """Static `targets` (job -> port on 127.0.0.1) and, unless `targets` names the ranks' job,
    the ranks' file_sd directory."""
    ms = lambda seconds: f"{max(int(round(seconds * 1000)), 1)}ms"  # Prometheus: no fractions
    every, timeout = ms(scrape_interval), ms(scrape_interval * 0.9)
    jobs = "".join(
        f"  - job_name: {name}\n    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n"
        for name, port in targets.items()
    )
    if RANKS_JOB not in targets:
        # As trainprof.deploy.relabel.file_sd_scrape_configs: the files' labels are the
        # ranks' own identity, so the scraped ones are honoured (one copy, and on `up`).
        jobs += (
            f"  - job_name: {RANKS_JOB}\n    honor_labels: true\n"
            f"    file_sd_configs: [{{files: ['{file_sd}/*.json'], refresh_interval: 5s}}]\n"
        )
    host = alertmanager.removeprefix("http://")
    return (
        f"global: {{scrape_interval: {every}, scrape_timeout: {timeout}, "
        f"evaluation_interval: {every}}}\n"
        "rule_files: [rules.yaml]\n"
        f"alerting:\n  alertmanagers:\n  - static_configs: [{{targets: ['{host}']}}]\n"
        f"scrape_configs:\n{jobs}"
    )


@contextlib.contextmanager
def local_stack(
    workdir: Path,
    rules: str,
    targets: Mapping[str, int],
    say: Callable[[str], None],
    scrape_interval: float = 1.0,
    prometheus_bin: str = "prometheus",
    alertmanager_bin: str = "prometheus-alertmanager",
) -> Iterator[Stack]:
    """Alertmanager, its webhook and Prometheus (with `rules`) in `workdir`, until the
    block ends. Raises RuntimeError naming the server that did not start."""
    from trainprof.engines.localstack import alertmanager, prometheus

    am_dir, prom_dir, file_sd = workdir / "am", workdir / "prom", workdir / "targets"
    for d in (am_dir, prom_dir, file_sd):
        d.mkdir(parents=True, exist_ok=True)
    received: list[dict[str, Any]] = []
    hook, hook_url = webhook(say, received)
    try:
        with (
            alertmanager(alertmanager_bin, am_dir, alertmanager_config(hook_url)) as am,
            prometheus(
                prometheus_bin,
                prom_dir,
                prometheus_config(targets, am, scrape_interval, file_sd),
                {"rules.yaml": rules},
            ) as prom,
        ):
            yield Stack(prom, am, file_sd, received)
    finally:
        hook.shutdown()
        hook.server_close()


def firing(alerts: list[dict[str, Any]]) -> dict[tuple, dict]:
    """Prometheus' firing alerts (`/api/v1/alerts`' list) by (alertname, gpu, reason, rank).

    >>> firing([{"state": "pending", "labels": {"alertname": "A"}},
    ...         {"state": "firing", "labels": {"alertname": "B", "gpu": "0"}}])
    {('B', '0', None, None): {'state': 'firing', 'labels': {'alertname': 'B', 'gpu': '0'}}}
    """
    out = {}
    for alert in alerts:
        if alert["state"] != "firing":
            continue
        labels = alert["labels"]
        key = (labels.get("alertname"), labels.get("gpu"), labels.get("reason"), labels.get("rank"))
        out[key] = alert
    return out
