"""Names Kubernetes would refuse are refused where they are given: the chart's values (the
real helm, against the generated values.schema.json) and `rules compile --format
prometheusrule`'s --name, --namespace and --label. What Kubernetes accepts still goes through.
"""

from __future__ import annotations

import pytest
import yaml

from trainprof.cli import main

from helm_render import CHART, objects, run_helm


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory, helm):
    from helm_render import helm_env

    return helm_env(tmp_path_factory.mktemp("helm"))


REFUSED = {
    "a label value with a line break": ({"commonLabels": {"team": "a\nb"}}, "/commonLabels/team"),
    "a label value with a template": (
        {"monitoring": {"labels": {"team": "{{ .Release.Name }}"}}},
        "/monitoring/labels/team",
    ),
    "2 MB of label value": ({"exporter": {"podLabels": {"big": "x" * 2_000_000}}}, "maxLength"),
    "a Prometheus-only label key": ({"commonLabels": {"__name__": "x"}}, "__name__"),
    "a node selector value with a space": (
        {"exporter": {"nodeSelector": {"gpu": "a b"}}},
        "/exporter/nodeSelector/gpu",
    ),
    "a release label with a line break": (
        {"monitoring": {"release": "kube-prometheus-stack\n"}},
        "/monitoring/release",
    ),
    "a namespace in capitals": (
        {"exporter": {"dcgmExporter": {"localService": {"namespace": "GPU-Operator"}}}},
        "/exporter/dcgmExporter/localService/namespace",
    ),
    "a dashboards namespace with a line break": (
        {"dashboards": {"namespace": "monitoring\nx"}},
        "/dashboards/namespace",
    ),
    "a scraped namespace with an underscore": (
        {"ranks": {"podMonitor": {"namespaces": ["team_a"]}}},
        "/ranks/podMonitor/namespaces/0",
    ),
    "an allowed namespace with a slash": (
        {"actions": {"allow": {"namespaces": ["a/b"]}}},
        "/actions/allow/namespaces/0",
    ),
    "an annotation key with two slashes": (
        {"exporter": {"podAnnotations": {"a/b/c": "x"}}},
        "a/b/c",
    ),
    "a dashboard label key with a space": (
        {"dashboards": {"label": "grafana dashboard"}},
        "/dashboards/label",
    ),
    "a dashboard label value with a template": (
        {"dashboards": {"labelValue": "{{ 1 }}"}},
        "/dashboards/labelValue",
    ),
    "a secret name in capitals": (
        {"actions": {"existingSecret": "Token"}},
        "/actions/existingSecret",
    ),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
def test_chart_values_kubernetes_would_refuse_fail_helm_naming_the_key(
    case, helm, helm_home, tmp_path
):
    values, where = REFUSED[case]
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    result = run_helm(helm, helm_home, "template", "t", str(CHART), "-f", str(path))
    assert result.returncode != 0, f"helm rendered it:\n{result.stdout[:300]}"
    assert "don't meet the specifications of the schema" in result.stderr, result.stderr[:500]
    assert where in result.stderr, result.stderr[:500]


def test_what_kubernetes_accepts_still_renders(helm, helm_home, tmp_path):
    values = {
        "commonLabels": {"app.kubernetes.io/part-of": "ml-platform", "team": "", "a.b_c-d": "X.1"},
        "monitoring": {"release": "prom", "labels": {"example.com/tier": "gold"}},
        "exporter": {
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
            "podAnnotations": {"example.com/note": "free text: {{ kept }}\nover lines"},
            "priorityClassName": "system-node-critical",
            "dcgmExporter": {"localService": {"namespace": "gpu-operator"}},
        },
        "ranks": {"podMonitor": {"namespaces": ["team-a", "b2"]}},
        "dashboards": {"namespace": "grafana", "label": "grafana_dashboard", "labelValue": "1"},
    }
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    result = run_helm(helm, helm_home, "template", "t", str(CHART), "-f", str(path))
    assert result.returncode == 0, result.stderr
    (daemonset,) = [d for d in objects(result.stdout) if d["kind"] == "DaemonSet"]
    assert daemonset["metadata"]["labels"]["app.kubernetes.io/part-of"] == "ml-platform"
    notes = daemonset["spec"]["template"]["metadata"]["annotations"]["example.com/note"]
    assert notes == "free text: {{ kept }}\nover lines"


@pytest.mark.parametrize(
    "option, message",
    [
        ("--namespace=monitoring\nx", "is not a Kubernetes namespace"),
        ("--namespace=Monitoring", "is not a Kubernetes namespace"),
        ("--name=trainprof_rules", "is not a Kubernetes object name"),
        ("--label=__name__=x", "'__name__' is not a Kubernetes label key"),
        ("--label=release=kube prometheus", "is not a Kubernetes label value"),
        ("--label=release=" + "x" * 64, "is not a Kubernetes label value"),
    ],
)
def test_prometheusrule_names_kubernetes_would_refuse_exit_2(option, message, capsys):
    with pytest.raises(SystemExit) as done:
        main(["rules", "compile", "--format", "prometheusrule", "-o", "-", "-q", option])
    assert done.value.code == 2
    assert message in capsys.readouterr().err


def test_prometheusrule_takes_kubernetes_label_keys(capsys):
    code = main(
        ["rules", "compile", "--format", "prometheusrule", "-o", "-", "-q"]
        + ["--namespace", "monitoring", "--label", "app.kubernetes.io/part-of=ml-platform"]
    )
    assert code == 0
    (rule,) = list(yaml.safe_load_all(capsys.readouterr().out))
    assert rule["metadata"]["namespace"] == "monitoring"
    assert rule["metadata"]["labels"]["app.kubernetes.io/part-of"] == "ml-platform"
