"""The Kubernetes path of StopTraining, against a loopback API server that records each call."""

from __future__ import annotations

import json

import pytest
import yaml

from trainprof.actions import kubernetes
from trainprof.actions.audit import history
from trainprof.actions.config import load_actions_config, read_actions_config
from trainprof.alerting import files

from servers import actions_receiver, fake_kubernetes
from webhook import TOKEN, payload, post

SA_TOKEN = "service-account-token-abc"


def k8s_config(api_url: str, token_file, resource="Job", action="suspend", **changes):
    return load_actions_config(
        {
            "token_env": "UNUSED_IN_TESTS",
            "dry_run": False,
            "allow": {"namespaces": ["team-a"], "training_jobs": ["starved"]},
            "rules": {"CPUBottleneck": "stop"},
            "kubernetes": {
                "resource": resource,
                "action": action,
                "api_url": api_url,
                "token_file": str(token_file),
                "ca_file": None,
            },
            **changes,
        }
    )


@pytest.fixture
def sa_token(tmp_path):
    path = tmp_path / "sa-token"
    path.write_text(SA_TOKEN + "\n")
    return path


def run(config, tmp_path, api_url, *bodies):
    client = kubernetes.Client(api_url, config.kubernetes.token_file, None)
    with actions_receiver(config, TOKEN, tmp_path / "audit.jsonl", client=client) as (url, _):
        return [post(url, body) for body in bodies]


@pytest.mark.parametrize(
    "resource, path, patch",
    [
        ("Job", "/apis/batch/v1/namespaces/team-a/jobs/starved", {"spec": {"suspend": True}}),
        (
            "PyTorchJob",
            "/apis/kubeflow.org/v1/namespaces/team-a/pytorchjobs/starved",
            {"spec": {"runPolicy": {"suspend": True}}},
        ),
        (
            "JobSet",
            "/apis/jobset.x-k8s.io/v1alpha2/namespaces/team-a/jobsets/starved",
            {"spec": {"suspend": True}},
        ),
    ],
)
def test_suspend_is_one_merge_patch_of_the_resource(resource, path, patch, tmp_path, sa_token):
    with fake_kubernetes() as (api, calls):
        [(status, _, body)] = run(k8s_config(api, sa_token, resource), tmp_path, api, payload())
    assert status == 200
    assert body["decisions"][0]["decision"] == "stopped"
    assert body["decisions"][0]["target"] == f"{resource} team-a/starved"
    assert calls == [
        {
            "method": "PATCH",
            "path": path,
            "content_type": "application/merge-patch+json",
            "authorization": f"Bearer {SA_TOKEN}",
            "body": patch,
        }
    ]


def test_delete_removes_the_resource_and_its_pods(tmp_path, sa_token):
    with fake_kubernetes() as (api, calls):
        run(k8s_config(api, sa_token, "PyTorchJob", "delete"), tmp_path, api, payload())
    assert calls == [
        {
            "method": "DELETE",
            "path": "/apis/kubeflow.org/v1/namespaces/team-a/pytorchjobs/starved",
            "content_type": "application/json",
            "authorization": f"Bearer {SA_TOKEN}",
            "body": {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "propagationPolicy": "Background",
            },
        }
    ]


def test_dry_run_calls_nothing(tmp_path, sa_token):
    with fake_kubernetes() as (api, calls):
        [(status, _, body)] = run(k8s_config(api, sa_token, dry_run=True), tmp_path, api, payload())
    assert (status, body["decisions"][0]["decision"]) == (200, "would_stop")
    assert calls == []


def test_refused_and_ignored_alerts_call_nothing(tmp_path, sa_token):
    with fake_kubernetes() as (api, calls):
        results = run(
            k8s_config(api, sa_token),
            tmp_path,
            api,
            payload({"training_job": "Starved_Job"}),  # not a resource name
            payload({"training_job": "starved/../../secrets"}),
            payload({"namespace": "kube-system"}),
            payload(status="resolved"),
            json.loads(json.dumps(payload()).replace('"4"', '"3"')),
        )
    assert [r[0] for r in results] == [422, 422, 200, 200, 422]
    assert calls == []


def test_a_missing_resource_is_gone_and_a_forbidden_one_is_retried(tmp_path, sa_token):
    path = "/apis/batch/v1/namespaces/team-a/jobs/starved"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with fake_kubernetes({("PATCH", path): 404}) as (api, calls):
        [(status, _, body)] = run(k8s_config(api, sa_token), tmp_path / "a", api, payload())
    assert (status, body["decisions"][0]["decision"]) == (200, "gone")
    with fake_kubernetes({("PATCH", path): 403}) as (api, calls):
        results = run(k8s_config(api, sa_token), tmp_path / "b", api, payload(), payload())
    assert [r[0] for r in results] == [502, 502]
    assert results[0][2]["decisions"][0]["reason"] == f"PATCH {path}: 403 fake answer 403"
    assert len(calls) == 2
    [audit_record] = [
        r for r in history(str(tmp_path / "b" / "audit.jsonl")) if r["event"] == "decision"
    ][:1]
    assert audit_record["decision"] == "failed"


def test_the_service_account_token_is_read_for_every_call(tmp_path, sa_token):
    config = k8s_config("http://127.0.0.1:1", sa_token)
    with fake_kubernetes() as (api, calls):
        client = kubernetes.Client(api, str(sa_token), None)
        kubernetes.stop(client, "Job", "suspend", "team-a", "a")
        sa_token.write_text("rotated-token")
        kubernetes.stop(client, "Job", "suspend", "team-a", "b")
    assert [c["authorization"] for c in calls] == [f"Bearer {SA_TOKEN}", "Bearer rotated-token"]
    assert config.kubernetes.ca_file is None


def test_an_unreachable_api_server_is_a_failure_not_a_crash(tmp_path, sa_token):
    client = kubernetes.Client("http://127.0.0.1:1", str(sa_token), None, timeout=2)
    call = kubernetes.stop(client, "Job", "suspend", "team-a", "starved")
    assert call.status == 0 and call.message.startswith("no answer from http://127.0.0.1:1")


@pytest.mark.parametrize("resource", sorted(kubernetes.KINDS))
@pytest.mark.parametrize("action", kubernetes.ACTIONS)
def test_the_rbac_grants_exactly_the_call_it_makes(resource, action, tmp_path, sa_token):
    with fake_kubernetes() as (api, calls):
        run(k8s_config(api, sa_token, resource, action), tmp_path, api, payload())
    [call] = calls
    _, _, group, version, _, namespace, plural, _ = call["path"].split("/")
    docs = kubernetes.rbac(resource, action, ["team-a", "team-b"])
    [role] = [d for d in docs if d["kind"] == "ClusterRole"]
    assert role["rules"] == [
        {"apiGroups": [group], "resources": [plural], "verbs": [call["method"].lower()]}
    ]
    bindings = [d for d in docs if d["kind"] == "RoleBinding"]
    assert [b["metadata"]["namespace"] for b in bindings] == ["team-a", "team-b"]
    assert all(b["roleRef"]["name"] == role["metadata"]["name"] for b in bindings)


def test_the_committed_rbac_is_the_example_configurations(root):
    example = read_actions_config(str(root / "alerting" / "actions" / "actions.example.yaml"))
    target = (example.kubernetes.resource, example.kubernetes.action, list(example.namespaces))
    assert target == files.EXAMPLE_ACTIONS_TARGET
    committed = list(yaml.safe_load_all((root / "alerting" / "actions" / "rbac.yaml").read_text()))
    assert committed == kubernetes.rbac(*target)
