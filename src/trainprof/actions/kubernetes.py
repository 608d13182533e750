"""Stopping a Kubernetes training job through the API server's REST interface.

Suspend is a merge patch of the resource's suspend field (the Job controller, the training
operator and JobSet then delete the pods and keep the object, so the job can be resumed);
delete removes the object with background propagation, so its pods go too:

    PATCH  /apis/batch/v1/namespaces/team-a/jobs/bert-large
           Content-Type: application/merge-patch+json
           {"spec": {"suspend": true}}
    DELETE /apis/kubeflow.org/v1/namespaces/team-a/pytorchjobs/bert-large
           {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}

Names reach the URL only after `valid_name` accepted them, and are percent-quoted anyway.
`rbac()` writes the least-privilege ServiceAccount, ClusterRole and RoleBindings for one
resource kind and action.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

IN_CLUSTER_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
IN_CLUSTER_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
ACTIONS = ("suspend", "delete")
VERB = {"suspend": "patch", "delete": "delete"}

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclasses.dataclass(frozen=True)
class Kind:
    """A workload resource trainprof can stop."""

    group: str
    version: str
    plural: str
    suspend: dict[str, Any]  # the merge patch that suspends it

    def path(self, namespace: str, name: str) -> str:
        quote = lambda s: urllib.parse.quote(s, safe="")
        return (
            f"/apis/{self.group}/{self.version}/namespaces/{quote(namespace)}/"
            f"{self.plural}/{quote(name)}"
        )


KINDS = {
    "Job": Kind("batch", "v1", "jobs", {"spec": {"suspend": True}}),
    # Kubeflow training-operator; runPolicy.suspend since v1.7.
    "PyTorchJob": Kind(
        "kubeflow.org", "v1", "pytorchjobs", {"spec": {"runPolicy": {"suspend": True}}}
    ),
    "JobSet": Kind("jobset.x-k8s.io", "v1alpha2", "jobsets", {"spec": {"suspend": True}}),
}


def valid_namespace(value: str) -> bool:
    return bool(_DNS_LABEL.match(value))


def valid_name(value: str) -> bool:
    return len(value) <= 253 and bool(_DNS_SUBDOMAIN.match(value))


def in_cluster_url() -> str | None:
    host, port = (
        os.environ.get("KUBERNETES_SERVICE_HOST"),
        os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
    )
    if not host:
        return None
    if ":" in host:  # IPv6 service address
        host = f"[{host}]"
    return f"https://{host}:{port}"


@dataclasses.dataclass(frozen=True)
class Call:
    """One request to the API server, and what came back."""

    method: str
    path: str
    body: dict[str, Any] | None
    status: int = 0  # 0: no HTTP answer (connection refused, timeout, TLS)
    message: str = ""


class Client:
    """Just enough of a Kubernetes client: one authenticated JSON request at a time."""

    def __init__(self, api_url: str, token_file: str, ca_file: str | None, timeout: float = 10.0):
        self.api_url = api_url.rstrip("/")
        self.token_file = token_file
        self.timeout = timeout
        self._tls = None
        if self.api_url.startswith("https://"):
            self._tls = ssl.create_default_context(cafile=ca_file)

    def _token(self) -> str:
        # Projected service-account tokens rotate: read the file on every call.
        with open(self.token_file, encoding="utf-8") as f:
            return f.read().strip()

    def send(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        content_type: str = "application/json",
    ) -> Call:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.api_url + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            request.add_header("Authorization", f"Bearer {self._token()}")
        except OSError as e:
            return Call(method, path, body, 0, f"cannot read the token: {e.strerror or e}")
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout, context=self._tls
            ) as response:
                return Call(method, path, body, response.status, "")
        except urllib.error.HTTPError as e:
            return Call(method, path, body, e.code, _status_message(e))
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            return Call(method, path, body, 0, f"no answer from {self.api_url}: {reason}")


def _status_message(error: urllib.error.HTTPError) -> str:
    """The `message` of a Kubernetes Status object, or the HTTP reason."""
    try:
        status = json.loads(error.read(4096) or b"{}")
        message = status.get("message") if isinstance(status, dict) else None
    except (OSError, ValueError):
        message = None
    return str(message or error.reason)[:300]


def stop(client: Client, kind_name: str, action: str, namespace: str, name: str) -> Call:
    """Suspend or delete one resource; the Call says how it went."""
    kind = KINDS[kind_name]
    path = kind.path(namespace, name)
    if action == "suspend":
        return client.send("PATCH", path, kind.suspend, "application/merge-patch+json")
    return client.send(
        "DELETE",
        path,
        {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
    )


def rbac(
    kind_name: str,
    action: str,
    namespaces: list[str],
    service_account: str = "trainprof-actions",
    namespace: str = "trainprof",
) -> list[dict[str, Any]]:
    """ServiceAccount, a ClusterRole with the one verb on the one resource, and a RoleBinding
    in each allowed namespace (a ClusterRole bound per namespace grants nothing elsewhere)."""
    kind = KINDS[kind_name]
    role = f"trainprof-actions-{action}-{kind.plural}"
    labels = {"app.kubernetes.io/name": "trainprof", "app.kubernetes.io/component": "actions"}
    docs: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": service_account, "namespace": namespace, "labels": labels},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role, "labels": labels},
            "rules": [
                {"apiGroups": [kind.group], "resources": [kind.plural], "verbs": [VERB[action]]}
            ],
        },
    ]
    for ns in namespaces:
        docs.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "trainprof-actions", "namespace": ns, "labels": labels},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": service_account, "namespace": namespace}
                ],
            }
        )
    return docs
