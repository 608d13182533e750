"""What to do with each alert of a delivery, and doing it at most once.

`plan` is pure: it reads one alert against the configuration and says stop, notify, ignore
(resolved, not opted in, missing labels, not allow-listed) or refuse (a label value that
cannot be a job's name: the request is rejected whole). `Actions.handle` then applies the
plans with memory: an alert firing since the same `startsAt` is handled once however often
Alertmanager re-delivers it, and a job stopped less than `cooldown` ago is not stopped again.

Decisions, as the audit log spells them:

    stopped      the job was stopped (signal sent, resource suspended or deleted)
    would_stop   dry run: the job would have been stopped
    notified     the rule is notify-only: audit-logged, nothing stopped
    ignored      not for this receiver (the reason says why)
    duplicate    already handled: the same firing, or the job was stopped moments ago
    gone         nothing to stop: the process or resource no longer exists
    refused      a label value that is not a valid name; the whole request is refused
    failed       the stop did not happen (the reason says why); Alertmanager will retry
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

from trainprof.actions import kubernetes, local
from trainprof.actions.config import ActionsConfig
from trainprof.actions.payload import Alert
from trainprof.contract.names import JOB_LABEL

K = TypeVar("K")

_LOCAL_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$")
_MEMORY_SECONDS = 7 * 86400


@dataclasses.dataclass(frozen=True)
class Plan:
    alert: Alert
    decision: str  # stop | notify | ignored | refused
    reason: str
    namespace: str = ""
    name: str = ""
    target: str = ""  # what would be stopped: "Job team-a/bert"; also its key


@dataclasses.dataclass(frozen=True)
class Decision:
    alert: Alert
    decision: str
    reason: str
    target: str = ""


def _shown(value: str) -> str:
    # repr() escapes newlines and quotes, so a hostile value cannot forge a log line.
    return repr(value[:80] + ("..." if len(value) > 80 else ""))


def plan(config: ActionsConfig, alert: Alert) -> Plan:
    labels = alert.labels
    rule = labels.get("rule", "")
    if alert.status != "firing":
        return Plan(alert, "ignored", "resolved alerts are never acted on")
    # A rule configured with SageMaker's StopTraining action carries action="stop"; the
    # receiver's own configuration still decides where it may act (allow lists, dry run)
    # and can demote the rule to notify.
    action = config.rules.get(rule) or ("stop" if labels.get("action") == "stop" else None)
    if action is None:
        return Plan(alert, "ignored", f"rule {_shown(rule)} is not opted in")
    k8s = config.kubernetes
    name_label = k8s.name_label if k8s else JOB_LABEL
    name, namespace = labels.get(name_label, ""), labels.get("namespace", "")
    if not name:
        return Plan(alert, "ignored", f"the alert has no {name_label} label")
    if not namespace and (k8s or config.namespaces):
        return Plan(alert, "ignored", "the alert has no namespace label")
    if namespace and not kubernetes.valid_namespace(namespace):
        return Plan(
            alert, "refused", f"label namespace {_shown(namespace)} is not a namespace name"
        )
    valid = kubernetes.valid_name if k8s else _LOCAL_NAME.match
    if not valid(name):
        return Plan(alert, "refused", f"label {name_label} {_shown(name)} is not a valid job name")
    if config.namespaces and namespace not in config.namespaces:
        return Plan(alert, "ignored", f"namespace {namespace} is not allow-listed")
    if not any(p.fullmatch(name) for p in config.training_jobs):
        return Plan(alert, "ignored", f"training job {name} is not allow-listed")
    if k8s:
        target = f"{k8s.resource} {namespace}/{name}"
    elif name in config.local_jobs:
        target = f"local job {name}"
    elif action == "stop":
        return Plan(alert, "ignored", f"no local job {name} is configured")
    else:
        target = f"job {name}"
    why = f"{rule} is set to {action}" if rule in config.rules else f"{rule} has action=stop"
    return Plan(alert, action, why, namespace, name, target)


Stopper = Callable[[Plan], local.Outcome]


def stopper(config: ActionsConfig, client: kubernetes.Client | None) -> Stopper:
    """The function that really stops a planned target."""
    if config.kubernetes:
        k8s = config.kubernetes

        def stop_resource(p: Plan) -> local.Outcome:
            # A dry run never calls this; a real one without a client says so per stop.
            if client is None:
                return local.Outcome("failed", "no Kubernetes API client is configured")
            call = kubernetes.stop(client, k8s.resource, k8s.action, p.namespace, p.name)
            what = f"{call.method} {call.path}"
            if 200 <= call.status < 300:
                return local.Outcome("stopped", f"{what}: {call.status}")
            if call.status == 404:
                return local.Outcome("gone", f"{what}: 404 {call.message}")
            return local.Outcome(
                "failed", f"{what}: {call.status or 'no answer'} {call.message}".rstrip()
            )

        return stop_resource

    def stop_process(p: Plan) -> local.Outcome:
        return local.stop(config.local_jobs[p.name], config.signal)

    return stop_process


class Actions:
    """Applies plans at most once per firing and once per cooldown per job. Thread-safe."""

    def __init__(
        self, config: ActionsConfig, stop: Stopper, clock: Callable[[], float] = time.time
    ):
        self.config, self.stop, self.clock = config, stop, clock
        self._handled: dict[tuple[str, str], float] = {}
        self._stopped: dict[str, float] = {}
        self._lock = threading.Lock()

    def remember(self, records: Iterable[dict]) -> int:
        """Restore what earlier runs stopped from their audit records; returns how many."""
        n = 0
        for r in records:
            if r.get("decision") == "stopped" and isinstance(r.get("ts"), (int, float)):
                self._handled[(str(r.get("fingerprint")), str(r.get("starts_at")))] = r["ts"]
                self._stopped[str(r.get("target"))] = r["ts"]
                n += 1
        return n

    def handle(self, plans: list[Plan]) -> list[Decision]:
        with self._lock:
            self._forget_old()
            return [self._one(p) for p in plans]

    def _one(self, p: Plan) -> Decision:
        if p.decision in ("ignored", "refused"):
            return Decision(p.alert, p.decision, p.reason)
        now = self.clock()
        key = p.alert.key
        if key in self._handled:
            return Decision(p.alert, "duplicate", "this firing was already handled", p.target)
        if p.decision == "notify":
            self._handled[key] = now
            return Decision(p.alert, "notified", p.reason, p.target)
        last = self._stopped.get(p.target)
        if last is not None and now - last < self.config.cooldown:
            self._handled[key] = now
            return Decision(
                p.alert, "duplicate", f"{p.target} was stopped {now - last:.0f}s ago", p.target
            )
        if self.config.dry_run:
            self._handled[key] = now
            return Decision(p.alert, "would_stop", f"dry run: {p.reason}", p.target)
        outcome = self.stop(p)
        if outcome.result != "failed":
            self._handled[key] = now
        if outcome.result == "stopped":
            self._stopped[p.target] = now
        return Decision(p.alert, outcome.result, outcome.detail, p.target)

    def _forget_old(self) -> None:
        horizon = self.clock() - max(_MEMORY_SECONDS, self.config.cooldown)
        _forget_before(self._handled, horizon)
        _forget_before(self._stopped, horizon)


def _forget_before(table: dict[K, float], horizon: float) -> None:
    for k in [k for k, t in table.items() if t < horizon]:
        del table[k]
