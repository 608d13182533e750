"""The generated Alertmanager routing, checked by the real amtool, and the templates rendered."""

from __future__ import annotations

import json
import subprocess

import yaml

from trainprof.alerting import files, routing
from trainprof.contract.names import HEALTH_RULE, STATE_RULE
from trainprof.rules import catalog
from trainprof.rules.model import FAMILIES, SEVERITIES

CASES = routing.route_cases(files.compiled_alerts())


def amtool_routes(amtool: str, config, labels: dict[str, str], expect: list[str]):
    args = [f"{k}={v}" for k, v in labels.items()]
    # amtool warns on stderr that --config.file overrides --alertmanager.url: read stdout only.
    result = subprocess.run(
        [
            amtool,
            "config",
            "routes",
            "test",
            f"--config.file={config}",
            f"--verify.receivers={','.join(expect)}",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return result.returncode, result.stdout.strip()


def check_config(amtool: str, path) -> subprocess.CompletedProcess:
    return subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True)


# --- the policy, from the catalog ----------------------------------------------------------


def test_every_rule_and_severity_has_a_route_case():
    covered = {(c.labels["rule"], c.labels.get("severity")) for c in CASES}
    for rule in catalog.alerting_rules():
        for severity in SEVERITIES + (None,):
            assert (rule.name, severity) in covered, (rule.name, severity)
    assert {c.labels["rule"] for c in CASES} == set(routing.trainprof_rules())


def test_route_cases_expect_page_for_critical_ticket_for_warning_low_priority_for_info():
    for case in CASES:
        if case.labels["rule"] == HEALTH_RULE:
            assert case.receivers == (routing.NOTIFY,)
            continue
        if case.labels["rule"] == STATE_RULE:
            assert case.receivers == (routing.INFO,)
            continue
        expected = {
            "critical": routing.PAGE,
            "warning": routing.NOTIFY,
            "info": routing.INFO,
            None: routing.NOTIFY,
        }[case.labels.get("severity")]
        assert case.receivers == (routing.ACTIONS, expected)


def test_default_severities_page_on_bottlenecks_and_notify_on_advice():
    by_name = catalog.BY_NAME
    assert {r.name for r in catalog.alerting_rules() if r.severity == "critical"} == {
        "CPUBottleneck",
        "IOBottleneck",
        "MaxInitializationTime",
        # a diverged (NaN) or hung job burns its GPUs for nothing until someone acts
        "ExplodingTensor",
        "StalledTrainingRule",
    }
    assert routing.RECEIVER_BY_SEVERITY[by_name["LowGPUUtilization"].severity] == routing.NOTIFY


def test_every_catalog_rule_has_a_family_and_inhibits_only_known_names():
    names = {r.name for r in catalog.alerting_rules()}
    for rule in catalog.CATALOG:
        assert rule.family in FAMILIES, rule.name
        for entry in rule.inhibits:
            assert entry in FAMILIES or entry in names, (rule.name, entry)
        assert rule.name not in routing.inhibited_by(rule)


def test_a_job_that_never_started_silences_its_host_and_gpu_verdicts():
    silenced = routing.inhibited_by(catalog.BY_NAME["MaxInitializationTime"])
    assert set(silenced) == set(
        routing.family_members("bottleneck") + routing.family_members("gpu")
    )


def test_inhibitions_compare_only_the_job_labels_the_sources_carry():
    for rule in routing.inhibit_rules():
        assert set(rule.equal) - {"rule"} == {"namespace", "training_job"}
    assert routing.inhibit_rules(["cluster", "training_job"])[0].equal == (
        "cluster",
        "training_job",
    )


def test_the_tree_names_exactly_the_documented_receivers():
    assert set(routing.tree().receivers()) == set(routing.RECEIVERS)


# --- the real amtool -----------------------------------------------------------------------


def test_amtool_accepts_the_example_configuration(amtool, root):
    result = check_config(amtool, root / "alerting" / "alertmanager.example.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{len(routing.inhibit_rules())} inhibit rules" in result.stdout
    assert "1 templates" in result.stdout


def test_amtool_accepts_the_fragment_merged_into_a_minimal_configuration(amtool, root, tmp_path):
    fragment = yaml.safe_load((root / "alerting" / "trainprof.routes.yaml").read_text())
    merged = {
        "route": {"receiver": "ops", "routes": [fragment["route"]]},
        "inhibit_rules": fragment["inhibit_rules"],
        "receivers": [{"name": "ops"}] + fragment["receivers"],
    }
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(merged))
    result = check_config(amtool, path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_route_case_reaches_its_receivers_in_the_example(amtool, root):
    committed = yaml.safe_load((root / "alerting" / "route-tests.yaml").read_text())["cases"]
    assert committed == [c.as_dict() for c in CASES]
    config = root / "alerting" / "alertmanager.example.yml"
    failures = []
    for case in CASES:
        rc, out = amtool_routes(amtool, config, case.labels, list(case.receivers))
        if rc != 0:
            failures.append(f"{case.labels} -> {out}, expected {','.join(case.receivers)}")
    assert not failures, "\n".join(failures)
    print(f"{len(CASES)} route cases passed")


def test_alerts_that_are_not_trainprofs_keep_their_own_route(amtool, root):
    config = root / "alerting" / "alertmanager.example.yml"
    rc, out = amtool_routes(
        amtool, config, {"alertname": "KubeNodeNotReady", "severity": "critical"}, ["default"]
    )
    assert (rc, out) == (0, "default")
    # A `rule` label of another project's alert is not one of the catalog's names.
    rc, out = amtool_routes(
        amtool,
        config,
        {"alertname": "X", "rule": "CPUBottleneckish", "severity": "critical"},
        ["default"],
    )
    assert (rc, out) == (0, "default")


def operator_view(resource: dict, namespace: str) -> dict:
    """The configuration prometheus-operator builds from an AlertmanagerConfig with the
    default `alertmanagerConfigMatcherStrategy: OnNamespace`: receivers prefixed with
    `<namespace>/<name>/`, the top route matching the namespace and continuing, and both
    sides of every inhibit rule restricted to the namespace."""
    prefix = f"{namespace}/{resource['metadata']['name']}/"
    ns = f'namespace="{namespace}"'

    def matchers(items):
        return [f"{m['name']}{m['matchType']}{json.dumps(m['value'])}" for m in items]

    def route(r: dict) -> dict:
        out = {"receiver": prefix + r["receiver"], "matchers": matchers(r.get("matchers", []))}
        for camel, snake in (
            ("groupBy", "group_by"),
            ("groupWait", "group_wait"),
            ("groupInterval", "group_interval"),
            ("repeatInterval", "repeat_interval"),
            ("continue", "continue"),
        ):
            if camel in r:
                out[snake] = r[camel]
        if r.get("routes"):
            out["routes"] = [route(child) for child in r["routes"]]
        return out

    spec = resource["spec"]
    top = route(spec["route"])
    top["matchers"] = [ns] + top["matchers"]
    top["continue"] = True
    return {
        "route": {"receiver": "null", "routes": [top]},
        "inhibit_rules": [
            {
                "source_matchers": matchers(r["sourceMatch"]) + [ns],
                "target_matchers": matchers(r["targetMatch"]) + [ns],
                "equal": r["equal"],
            }
            for r in spec["inhibitRules"]
        ],
        "receivers": [{"name": "null"}] + [{"name": prefix + r["name"]} for r in spec["receivers"]],
    }


def test_the_alertmanagerconfig_routes_like_the_plain_configuration(amtool, root, tmp_path):
    resource = yaml.safe_load((root / "alerting" / "trainprof.alertmanagerconfig.yaml").read_text())
    assert resource["kind"] == "AlertmanagerConfig"
    assert "namespace" not in resource["metadata"]  # applied per training namespace
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(operator_view(resource, "team-a")))
    result = check_config(amtool, path)
    assert result.returncode == 0, result.stdout + result.stderr
    for case in CASES[::5]:
        expected = [f"team-a/trainprof/{r}" for r in case.receivers]
        assert amtool_routes(amtool, path, case.labels, expected)[0] == 0, case
        elsewhere = {**case.labels, "namespace": "team-b"}
        assert amtool_routes(amtool, path, elsewhere, ["null"]) == (0, "null"), case


# --- templates -----------------------------------------------------------------------------


def render(amtool: str, root, data_path, text: str) -> str:
    result = subprocess.run(
        [
            amtool,
            "template",
            "render",
            f"--template.glob={root}/alerting/templates/*.tmpl",
            f"--template.data={data_path}",
            f"--template.text={text}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_notification_names_where_what_and_what_to_do(amtool, root, tmp_path):
    payload = json.loads((root / "tests" / "fixtures" / "webhook-v4-idle.json").read_text())
    outlier = json.loads(json.dumps(payload["alerts"][0]))
    outlier["labels"].update(
        alertname="TrainingSlowRank", rule="SlowRank", node="n3", rank="3", mode="train"
    )
    del outlier["labels"]["reason"]
    payload["alerts"].append(outlier)
    data = tmp_path / "data.json"
    data.write_text(json.dumps(payload))

    title = render(amtool, root, data, '{{ template "trainprof.title" . }}')
    assert title.strip() == (
        "[FIRING:2] warning job idle (team-a): TrainingLowGPUUtilization TrainingSlowRank"
    )
    text = render(amtool, root, data, '{{ template "trainprof.text" . }}')
    low_gpu = payload["alerts"][0]
    # one alert for the job: the GPUs it found are in its description
    assert "Where: job idle in team-a\n" in text
    assert "Found: Job idle: 1 of 1 GPUs were underutilized" in text
    assert f"Found: {low_gpu['annotations']['description']}\n" in text
    # a custom rule's alert may still name a unit
    assert "Where: job idle in team-a, node n3, rank 3, mode train\n" in text
    assert f"Recommendation: {low_gpu['annotations']['recommendation']}\n" in text
    assert f"Dashboard: {low_gpu['annotations']['dashboard_url']}\n" in text
    assert f"Runbook: {low_gpu['annotations']['runbook_url']}" in text


def test_resolved_and_health_notifications_say_so(amtool, root, tmp_path):
    payload = json.loads((root / "tests" / "fixtures" / "webhook-v4-starved.json").read_text())
    payload["status"] = "resolved"
    for alert in payload["alerts"]:
        alert["status"] = "resolved"
    data = tmp_path / "resolved.json"
    data.write_text(json.dumps(payload))
    title = render(amtool, root, data, '{{ template "trainprof.title" . }}')
    assert title.strip() == (
        "[RESOLVED] critical job starved (team-a): TrainingCPUBottleneck TrainingIOBottleneck"
    )
    text = render(amtool, root, data, '{{ template "trainprof.text" . }}')
    assert text.strip() == (
        "Resolved:\n- TrainingCPUBottleneck: job starved in team-a\n"
        "- TrainingIOBottleneck: job starved in team-a"
    )

    health = {
        **payload,
        "status": "firing",
        "alerts": [
            {
                **payload["alerts"][0],
                "status": "firing",
                "labels": {
                    "alertname": "TrainprofRuleInputMissing",
                    "rule": HEALTH_RULE,
                    "affects": "CPUBottleneck",
                    "severity": "warning",
                    "namespace": "team-a",
                    "training_job": "starved",
                },
                "annotations": {
                    "summary": "Exporters do not serve a series a rule needs.",
                    "description": "The exporters of job starved do not count ...",
                },
            }
        ],
    }
    data.write_text(json.dumps(health))
    text = render(amtool, root, data, '{{ template "trainprof.text" . }}')
    assert "Affects: CPUBottleneck (cannot fire for this job until this is fixed)" in text
    assert "Recommendation" not in text and "Dashboard" not in text
