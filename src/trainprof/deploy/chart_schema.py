"""`helm/trainprof/values.schema.json`: what every chart value may be.

Objects are closed (`additionalProperties: false`) wherever the chart owns the keys, so a
misspelled key fails `helm lint` / `helm install` instead of being silently ignored; the
Kubernetes pass-through values (tolerations, affinity, securityContext, relabelings ...) are
open objects that the API server validates. The rule switches are the catalog's rule groups.
Names, namespaces, label keys and values, and annotation keys follow Kubernetes' own rules
(`deploy.kubernetes_names`), so a value the API server would refuse (a label value with a line
break, `{{ }}` or megabytes of text; a namespace with capitals) fails `helm install` naming
the key, before anything is applied.
"""

from __future__ import annotations

from typing import Any

from trainprof.deploy import kubernetes_names as k8s

DURATION = {"type": "string", "pattern": r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"}
PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
LABEL_KEY = {"type": "string", "maxLength": k8s.LABEL_KEY_MAX, "pattern": k8s.LABEL_KEY_PATTERN}
LABEL_VALUE = {
    "type": "string",
    "maxLength": k8s.LABEL_VALUE_MAX,
    "pattern": k8s.LABEL_VALUE_PATTERN,
}
LABELS = {"type": "object", "propertyNames": LABEL_KEY, "additionalProperties": LABEL_VALUE}
ANNOTATIONS = {
    "type": "object",
    "propertyNames": LABEL_KEY,
    "additionalProperties": {"type": "string", "maxLength": k8s.ANNOTATIONS_MAX_BYTES},
}
NAMESPACE = {"type": "string", "pattern": k8s.DNS_LABEL_PATTERN}
NAMESPACES = {"type": "array", "items": NAMESPACE}
OPTIONAL_NAMESPACE = {"type": "string", "pattern": f"^$|{k8s.DNS_LABEL_PATTERN}"}
OPTIONAL_NAME = {
    "type": "string",
    "maxLength": k8s.DNS_SUBDOMAIN_MAX,
    "pattern": f"^$|{k8s.DNS_SUBDOMAIN_PATTERN}",
}
OPEN = {"type": "object"}
LIST = {"type": "array"}
STRING = {"type": "string"}
BOOL = {"type": "boolean"}


def _closed(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
    }
    if required:
        out["required"] = required
    return out


def _image() -> dict[str, Any]:
    return _closed(
        {
            "repository": {"type": "string", "minLength": 1},
            "tag": STRING,
            "pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
        }
    )


def _monitor(extra: dict[str, Any]) -> dict[str, Any]:
    return _closed(
        {
            "enabled": BOOL,
            "interval": DURATION,
            "scrapeTimeout": DURATION,
            "relabelings": LIST,
            "metricRelabelings": LIST,
            **extra,
        }
    )


def schema(rule_keys: list[str], action_kinds: list[str]) -> dict[str, Any]:
    exporter = _closed(
        {
            "enabled": BOOL,
            "image": _image(),
            "imagePullSecrets": LIST,
            "port": PORT,
            "nodeSelector": LABELS,
            "tolerations": LIST,
            "affinity": OPEN,
            "priorityClassName": OPTIONAL_NAME,
            "hostProc": {"type": "string", "pattern": "^/"},
            "hostNetwork": BOOL,
            "nvidia": _closed(
                {"enabled": BOOL, "visibleDevices": STRING, "runtimeClassName": OPTIONAL_NAME}
            ),
            "datapointInterval": DURATION,
            "dcgmExporter": _closed(
                {
                    "enabled": BOOL,
                    "url": {"type": "string", "pattern": "^(https?://.+)?$"},
                    "pollInterval": DURATION,
                    "localService": _closed(
                        {
                            "namespace": NAMESPACE,
                            "selector": {**LABELS, "minProperties": 1},
                            "port": PORT,
                            "targetPort": {"type": ["string", "integer"]},
                        }
                    ),
                }
            ),
            "extraArgs": {"type": "array", "items": STRING},
            "resources": OPEN,
            "securityContext": OPEN,
            "podSecurityContext": OPEN,
            "podAnnotations": ANNOTATIONS,
            "podLabels": LABELS,
            "updateStrategy": OPEN,
            "service": _closed(
                {
                    "type": {"enum": ["ClusterIP", "NodePort", "LoadBalancer"]},
                    "annotations": ANNOTATIONS,
                }
            ),
            "serviceMonitor": _monitor({}),
        }
    )
    ranks = _closed(
        {
            "podMonitor": _monitor(
                {
                    "selector": OPEN,
                    "namespaces": NAMESPACES,
                    "portNamePattern": {"type": "string", "minLength": 1},
                }
            )
        }
    )
    rules = _closed(
        {
            "enabled": BOOL,
            "groups": {
                "type": "array",
                "items": {"type": "object", "required": ["name", "rules"]},
            },
            "rules": _closed({key: BOOL for key in rule_keys}),
        }
    )
    dashboards = _closed(
        {
            "enabled": BOOL,
            "label": LABEL_KEY,
            "labelValue": LABEL_VALUE,
            "folderAnnotation": LABEL_KEY,
            "folder": {"type": "string", "maxLength": k8s.ANNOTATIONS_MAX_BYTES},
            "namespace": OPTIONAL_NAMESPACE,
            "files": {
                "type": "object",
                "propertyNames": {"pattern": "^[a-z0-9][a-z0-9-]*[.]json$"},
                "additionalProperties": {"type": "string", "minLength": 2},
            },
        }
    )
    alertmanager = _closed(
        {
            "enabled": BOOL,
            "receivers": {"type": "array", "items": {"type": "object", "required": ["name"]}},
        }
    )
    actions = _closed(
        {
            "enabled": BOOL,
            "image": _image(),
            "port": PORT,
            "dryRun": BOOL,
            "kubernetes": _closed(
                {
                    "resource": {"enum": action_kinds},
                    "action": {"enum": ["suspend", "delete"]},
                    "nameLabel": {"type": "string", "minLength": 1},
                }
            ),
            "allow": _closed(
                {
                    "namespaces": NAMESPACES,
                    "trainingJobs": {"type": "array", "items": STRING},
                }
            ),
            "rules": {"type": "object", "additionalProperties": {"enum": ["stop", "notify"]}},
            "cooldown": DURATION,
            "token": STRING,
            "existingSecret": OPTIONAL_NAME,
            "auditLog": _closed({"existingClaim": OPTIONAL_NAME}),
            "networkPolicy": _closed(
                {
                    "enabled": BOOL,
                    "alertmanagerNamespaceSelector": OPEN,
                    "alertmanagerPodSelector": OPEN,
                }
            ),
            "resources": OPEN,
            "securityContext": OPEN,
            "podSecurityContext": OPEN,
        }
    )
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "trainprof chart values. Code generated by make generate. DO NOT EDIT.",
        **_closed(
            {
                "global": OPEN,
                "commonLabels": LABELS,
                "monitoring": _closed({"release": LABEL_VALUE, "labels": LABELS}),
                "exporter": exporter,
                "ranks": ranks,
                "prometheusRule": rules,
                "dashboards": dashboards,
                "alertmanagerConfig": alertmanager,
                "actions": actions,
            }
        ),
    }
