"""helm/trainprof rendered by the real helm binary, every object validated.

Core kinds go through kubernetes-validate (strict), the operator kinds through the CRD schemas
in tests/data/kubernetes/crds with `additionalProperties: false` added to every object schema
that lists its properties (the API server would prune a misspelled key; this test rejects
it), the PrometheusRule's spec through `promtool check rules` and the rule scenarios.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from trainprof.cli import main as cli
from trainprof.deploy import chart

from helm_render import CHART, Loader, by_kind, helm_env, objects, render, run_helm

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VALUES = HERE / "fixtures" / "helm"
GOLDEN = HERE / "golden" / "helm"
CRDS = ROOT / "tests" / "data" / "kubernetes" / "crds"
KUBE_VERSION = "1.30.0"
OPERATOR_KINDS = {
    "PrometheusRule": ("crd-prometheusrules.yaml", "v1"),
    "ServiceMonitor": ("crd-servicemonitors.yaml", "v1"),
    "PodMonitor": ("crd-podmonitors.yaml", "v1"),
    "AlertmanagerConfig": ("crd-alertmanagerconfigs.yaml", "v1alpha1"),
}
# kubectl apply keeps the whole object in this annotation; the API server caps all of an
# object's annotations at 256 KiB together.
ANNOTATION_LIMIT = 262144
USER_CONFIG = """\
scrape_interval: 30s
rules:
  - rule: LowGPUUtilization
    parameters: {threshold_p95: "55", window: "500"}
  - rule: CPUBottleneck
    parameters: {cpu_threshold: 85}
"""


@pytest.fixture(scope="module")
def helm_home(tmp_path_factory) -> dict[str, str]:
    return helm_env(tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def user_values(tmp_path_factory) -> Path:
    """The helm-values file `trainprof rules compile` writes from a user's configuration."""
    out = tmp_path_factory.mktemp("user-values")
    (out / "rules.yaml").write_text(USER_CONFIG)
    return _compile_helm_values(out / "rules.yaml", out)


def _compile_helm_values(config: Path, out: Path, *options: str) -> Path:
    """`trainprof rules compile --format helm-values` of `config` into `out`."""
    code = cli(
        ["rules", "compile", "-c", str(config), *options, "--format", "helm-values"]
        + ["-o", str(out), "-q"]
    )
    assert code == 0
    return out / "trainprof.values.yaml"


def _case_values(case: str, user_values: Path) -> list[str]:
    if case == "default":
        return []
    if case == "user-config":
        return [str(user_values)]
    if case == "sources":
        return [str(user_values.parent / "sources" / "trainprof.values.yaml")]
    if case == "sources-report":
        return [str(user_values.parent / "sources-report" / "trainprof.values.yaml")]
    return [str(VALUES / f"{case}.yaml")]


@pytest.fixture(scope="module", autouse=True)
def sources_values(user_values) -> Path:
    """The same configuration compiled for a cluster with only dcgm-exporter and
    node_exporter, as `rules compile` writes it (which switches trainprof's exporter off)."""
    return _compile_helm_values(
        user_values.parent / "rules.yaml",
        user_values.parent / "sources",
        "--source",
        "dcgm,node_exporter",
    )


@pytest.fixture(scope="module", autouse=True)
def sources_report_values(user_values) -> Path:
    """ProfilerReport compiled for dcgm-exporter and node_exporter."""
    config = user_values.parent / "report.yaml"
    config.write_text("rules:\n  - rule: ProfilerReport\n")
    return _compile_helm_values(
        config, user_values.parent / "sources-report", "--source", "dcgm,node_exporter"
    )


CASES = [
    "default",
    "no-operator",
    "actions",
    "rules-off",
    "user-config",
    "sources",
    "sources-report",
    "dcgm-exporter",
]


@pytest.fixture(scope="module")
def rendered(helm, helm_home, user_values) -> dict[str, str]:
    return {c: render(helm, helm_home, _case_values(c, user_values)) for c in CASES}


# --- lint and golden renders ----------------------------------------------------------------


@pytest.mark.parametrize("case", CASES)
def test_helm_lint_strict_is_clean(case, helm, helm_home, user_values):
    args = ["lint", "--strict", str(CHART)]
    for v in _case_values(case, user_values):
        args += ["-f", v]
    result = run_helm(helm, helm_home, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


def _golden_text(text: str) -> str:
    """The render with each dashboard's JSON replaced by its size and digest (the dashboards
    have their own drift test; the golden pins everything around them)."""
    docs = objects(text)
    for d in docs:
        if (
            d["kind"] == "ConfigMap"
            and d["metadata"]["labels"].get("app.kubernetes.io/component") == "dashboards"
        ):
            for key, value in d["data"].items():
                digest = hashlib.sha256(value.encode()).hexdigest()[:16]
                d["data"][key] = f"<{len(value.encode())} bytes, sha256 {digest}>"
    return "---\n".join(yaml.safe_dump(d, sort_keys=False, width=10_000) for d in docs)


@pytest.mark.parametrize(
    "case", [c for c in CASES if c not in ("user-config", "sources", "sources-report")]
)
def test_render_matches_golden(case, rendered, update_golden):
    path = GOLDEN / f"{case}.yaml"
    text = _golden_text(rendered[case])
    if update_golden:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run pytest --update-golden"
    assert text == path.read_text(), f"{case} render changed: review, then --update-golden"


# --- the packaged chart (make release) ------------------------------------------------------


@pytest.fixture(scope="module")
def packaged(helm, tmp_path_factory) -> Path:
    """What `make release` publishes of the chart: `make chart-package` into a folder."""
    out = tmp_path_factory.mktemp("release")
    result = subprocess.run(
        ["make", "-s", "chart-package", f"RELEASE_DIR={out}", f"HELM={helm}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_make_release_packages_the_chart_with_a_chart_repository_index(packaged):
    import tarfile

    from trainprof._version import __version__

    tgz = packaged / f"trainprof-{__version__}.tgz"
    assert sorted(p.name for p in packaged.iterdir()) == ["index.yaml", tgz.name]
    (entry,) = yaml.safe_load((packaged / "index.yaml").read_text())["entries"]["trainprof"]
    assert entry["version"] == entry["appVersion"] == __version__
    assert entry["digest"] == hashlib.sha256(tgz.read_bytes()).hexdigest()
    assert entry["urls"] == [
        f"https://github.com/trainprof/trainprof/releases/download/v{__version__}/{tgz.name}"
    ]
    with tarfile.open(tgz) as tar:
        names = set(tar.getnames())
    committed = {f"trainprof/{p.relative_to(CHART)}" for p in CHART.rglob("*") if p.is_file()} - {
        "trainprof/.helmignore"
    }
    assert committed <= names, sorted(committed - names)[:5]


@pytest.mark.parametrize("case", CASES)
def test_the_packaged_chart_renders_what_the_chart_directory_renders(
    case, packaged, rendered, helm, helm_home, user_values
):
    """So every test of the directory's renders holds for the packaged file."""
    (tgz,) = packaged.glob("trainprof-*.tgz")
    assert render(helm, helm_home, _case_values(case, user_values), chart=tgz) == rendered[case]


def test_helm_install_from_the_packaged_file_deploys_the_image_make_image_builds(
    packaged, helm, helm_home
):
    """The default image is the tag `make image` gives (the package version), and until a
    public image exists the notes say how to build and push it."""
    from trainprof._version import __version__

    (tgz,) = packaged.glob("trainprof-*.tgz")
    result = run_helm(
        helm, helm_home, "install", "t", str(tgz), "--dry-run=client", "--namespace", "monitoring"
    )
    assert result.returncode == 0, result.stderr
    manifest, notes = result.stdout.split("NOTES:", 1)
    (ds,) = by_kind(objects(manifest.split("MANIFEST:", 1)[1]), "DaemonSet")
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"trainprof/exporter:{__version__}"
    assert f"trainprof {__version__} is installed" in notes
    assert "make image" in notes
    assert f"skopeo copy oci:build/image/oci:{__version__} docker://REGISTRY/" in notes
    pushed = run_helm(
        helm,
        helm_home,
        *("install", "t", str(tgz), "--dry-run=client"),
        *("--set", "exporter.image.repository=registry.example/ml/trainprof-exporter"),
    )
    assert pushed.returncode == 0, pushed.stderr
    assert "registry.example/ml/trainprof-exporter:" + __version__ in pushed.stdout
    assert "make image" not in pushed.stdout.split("NOTES:", 1)[1]


# --- validation -------------------------------------------------------------------------


def _strict(schema):
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(x) for x in schema]
    return schema


@pytest.fixture(scope="module")
def crd_validators():
    import jsonschema

    validators = {}
    for kind, (name, version) in OPERATOR_KINDS.items():
        crd = yaml.load((CRDS / name).read_text(), Loader=Loader)
        (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
        schema = _strict(served["schema"]["openAPIV3Schema"])
        validators[kind] = jsonschema.Draft7Validator(schema)
    return validators


def _operator_errors(validator, doc) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)
    ]


@pytest.mark.parametrize("case", CASES)
def test_every_rendered_object_is_valid(case, rendered, crd_validators):
    import kubernetes_validate

    docs = objects(rendered[case])
    assert docs
    for doc in docs:
        name = f"{doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in OPERATOR_KINDS:
            errors = _operator_errors(crd_validators[doc["kind"]], doc)
            assert not errors, f"{name}: " + "; ".join(errors)
        else:
            try:
                kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{name}: {'/'.join(map(str, e.path))}: {e.message}")


def test_strict_crd_check_catches_a_misspelled_key(rendered, crd_validators):
    (monitor,) = by_kind(objects(rendered["default"]), "ServiceMonitor")
    bad = copy.deepcopy(monitor)
    bad["spec"]["endpoints"][0]["scrapeTimout"] = "10s"
    errors = _operator_errors(crd_validators["ServiceMonitor"], bad)
    assert any("scrapeTimout" in e for e in errors), errors
    assert not _operator_errors(crd_validators["ServiceMonitor"], monitor)


@pytest.mark.parametrize("case", ["default", "rules-off", "user-config", "sources"])
def test_prometheusrule_spec_passes_promtool(case, rendered, promtool, tmp_path):
    (rule,) = by_kind(objects(rendered[case]), "PrometheusRule")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run(
        [promtool, "check", "rules", "--lint=all", "--lint-fatal", str(path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_default_prometheusrule_is_the_catalog_compiled_for_a_daemonset(rendered, root):
    from trainprof.rules.compiler import compile_rules
    from trainprof.rules.config import default_config

    (rule,) = by_kind(objects(rendered["default"]), "PrometheusRule")
    by_name = lambda groups: {g["name"]: g for g in groups}
    chart_groups = by_name(rule["spec"]["groups"])
    assert chart_groups == by_name(compile_rules(chart.chart_config(default_config())).groups)
    # Against the committed rules/ (attribution by the exporter's labels), only the per-GPU
    # alerts' conditions differ (joined to the GPU's job), their descriptions count the GPUs
    # the job holds, and the health group gains the shared-GPU check.
    committed = by_name(
        yaml.safe_load((root / "rules" / "trainprof.rules.yaml").read_text())["groups"]
    )
    assert chart_groups.keys() == committed.keys()
    joined, counted = set(), set()
    shared = {"TrainprofGPUSharedByJobs", "gpu:trainprof_health_gpu_shared_by_jobs:affected"}
    for name, group in committed.items():
        mine = chart_groups[name]["rules"]
        extra = [r for r in mine if shared & {r.get("alert"), r.get("record")}]
        mine = [r for r in mine if r not in extra]
        assert len(mine) == len(group["rules"]), name
        for theirs, ours in zip(group["rules"], mine):
            if theirs == ours:
                continue
            if "record" in ours:  # the condition, per GPU: joined to the GPU's job
                assert ours["record"].endswith(":affected") and ours["record"] == theirs["record"]
                assert "group_left (namespace, training_job)" in ours["expr"]
                assert "trainprof_gpu_assignment_info" in ours["expr"]
                joined.add(ours["labels"]["rule"])
                continue
            # the alert counts the joined recording: only its description's total differs
            assert {**ours, "annotations": {}} == {**theirs, "annotations": {}}
            assert "trainprof_gpu_assignment_info" in ours["annotations"]["description"]
            counted.add(ours["alert"])
        assert len(extra) == (2 if name == "trainprof.health" else 0), name
    assert joined == {"LowGPUUtilization", "BatchSize", "GPUMemoryIncrease", "LoadBalancing"}
    assert counted == {f"Training{r}" for r in joined}


# --- rules: switches and a user's configuration -------------------------------------------


def test_rule_switches_drop_exactly_their_groups(rendered):
    names = lambda case: {
        g["name"] for g in by_kind(objects(rendered[case]), "PrometheusRule")[0]["spec"]["groups"]
    }
    assert names("default") - names("rules-off") == {
        "trainprof.LowGPUUtilization",
        "trainprof.StepOutlier",
    }
    assert names("rules-off") < names("default")


def test_every_catalog_group_has_a_switch(root):
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert list(values["prometheusRule"]["rules"]) == chart.rule_keys()


def test_a_misspelled_rule_switch_is_an_error(helm, helm_home):
    result = run_helm(
        helm,
        helm_home,
        "template",
        "t",
        str(CHART),
        "--set",
        "prometheusRule.rules.LowGPUUtilisation=false",
    )
    assert result.returncode != 0
    assert "LowGPUUtilisation" in result.stderr and "additional properties" in result.stderr.lower()


def test_user_configuration_reaches_the_prometheusrule(rendered, user_values):
    (rule,) = by_kind(objects(rendered["user-config"]), "PrometheusRule")
    groups = {g["name"]: g for g in rule["spec"]["groups"]}
    assert set(groups) >= {"trainprof.LowGPUUtilization", "trainprof.CPUBottleneck"}
    assert "trainprof.StepOutlier" not in groups  # not in the user's configuration
    low = yaml.safe_dump(groups["trainprof.LowGPUUtilization"])
    assert "below55" in low, low  # threshold_p95 55 instead of 70
    shipped = yaml.safe_load(user_values.read_text())["prometheusRule"]["groups"]
    assert rule["spec"]["groups"] == shipped


def test_a_user_group_can_be_switched_off(helm, helm_home, user_values):
    docs = objects(
        render(helm, helm_home, [str(user_values)], ["prometheusRule.rules.CPUBottleneck=false"])
    )
    (rule,) = by_kind(docs, "PrometheusRule")
    assert [g["name"] for g in rule["spec"]["groups"]] == [
        g["name"]
        for g in yaml.safe_load(user_values.read_text())["prometheusRule"]["groups"]
        if g["name"] != "trainprof.CPUBottleneck"
    ]


# --- labels, exporter, dashboards ---------------------------------------------------------


def test_release_and_extra_labels_on_every_monitoring_object(rendered):
    docs = objects(rendered["actions"])
    monitoring = [d for d in docs if d["kind"] in OPERATOR_KINDS]
    assert {d["kind"] for d in monitoring} == set(OPERATOR_KINDS)
    for d in monitoring:
        assert d["metadata"]["labels"]["release"] == "prom", d["kind"]
        assert d["metadata"]["labels"]["tier"] == "monitoring", d["kind"]
    for d in docs:
        assert d["metadata"]["labels"]["team"] == "ml-platform", d["kind"]
        assert d["metadata"]["labels"]["app.kubernetes.io/part-of"] == "trainprof"


def _containers(doc):
    spec = doc["spec"]["template"]["spec"]
    return spec.get("initContainers", []) + spec["containers"]


@pytest.mark.parametrize("case", ["default", "actions"])
def test_every_workload_is_locked_down(case, rendered):
    workloads = [d for d in objects(rendered[case]) if d["kind"] in ("DaemonSet", "Deployment")]
    assert workloads
    for w in workloads:
        assert w["spec"]["template"]["spec"]["securityContext"]["seccompProfile"] == {
            "type": "RuntimeDefault"
        }
        for c in _containers(w):
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]


def test_exporter_lands_on_tainted_gpu_nodes_and_reads_the_host_read_only(rendered):
    (ds,) = by_kind(objects(rendered["default"]), "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    (container,) = pod["containers"]
    assert "--path.procfs=/host/proc" in container["args"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/host/proc"]["readOnly"] is True
    host_paths = [v for v in pod["volumes"] if "hostPath" in v]
    assert [v["hostPath"]["path"] for v in host_paths] == ["/proc"]
    for v in host_paths:
        (m,) = [m for m in container["volumeMounts"] if m["name"] == v["name"]]
        assert m["readOnly"] is True
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])  # takes no job's GPU
    assert pod["automountServiceAccountToken"] is False


def test_exporter_reads_its_nodes_dcgm_exporter_through_a_node_local_service(
    rendered, helm, helm_home
):
    docs = objects(rendered["dcgm-exporter"])
    (ds,) = by_kind(docs, "DaemonSet")
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    service = ds["metadata"]["name"].removesuffix("-exporter") + "-dcgm-exporter-local"
    url = f"http://{service}.gpu-operator.svc:9400/metrics"
    assert f"--collector.gpu.dcgm-exporter={url}" in container["args"]
    assert "--collector.gpu.dcgm-exporter.poll-interval=1s" in container["args"]
    assert "env" not in container  # NVML is not used: no NVIDIA devices in the pod
    (local,) = [s for s in by_kind(docs, "Service") if "dcgm" in s["metadata"]["name"]]
    assert local["metadata"]["name"] == service
    assert local["metadata"]["namespace"] == "gpu-operator"
    assert local["spec"]["internalTrafficPolicy"] == "Local"
    assert local["spec"]["selector"] == {"app": "nvidia-dcgm-exporter"}
    assert "dcgm" not in rendered["default"]

    given = "http://10.0.0.7:9400/metrics"
    docs = objects(
        render(
            helm,
            helm_home,
            sets=[
                "exporter.dcgmExporter.enabled=true",
                f"exporter.dcgmExporter.url={given}",
                "exporter.nvidia.runtimeClassName=nvidia",
            ],
        )
    )
    (ds,) = by_kind(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert f"--collector.gpu.dcgm-exporter={given}" in pod["containers"][0]["args"]
    assert "runtimeClassName" not in pod
    assert not [s for s in by_kind(docs, "Service") if "dcgm" in s["metadata"]["name"]]


def test_node_selection_and_tolerations_are_values(helm, helm_home):
    docs = objects(
        render(
            helm,
            helm_home,
            sets=["exporter.nodeSelector.pool=a100", "exporter.tolerations=null"],
        )
    )
    (ds,) = by_kind(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "a100"}
    assert "tolerations" not in pod


def _configmaps(text: str) -> list[dict]:
    return [
        d
        for d in by_kind(objects(text), "ConfigMap")
        if d["metadata"]["labels"].get("app.kubernetes.io/component") == "dashboards"
    ]


def _last_applied_size(doc: dict) -> int:
    # What `kubectl apply` stores in kubectl.kubernetes.io/last-applied-configuration.
    return len(json.dumps(doc, separators=(",", ":")).encode()) + 1


def test_dashboards_are_one_configmap_each_under_the_annotation_limit(rendered, root):
    maps = _configmaps(rendered["default"])
    committed = sorted(p.name for p in (root / "dashboards").glob("*.json"))
    assert sorted(k for m in maps for k in m["data"]) == committed
    from trainprof import dashboards
    from trainprof.rules.config import default_config

    for m in maps:
        ((key, text),) = m["data"].items()
        # The committed dashboard, rendered for a node-wide exporter (no job on its series).
        made = dashboards.render(f"dashboards/{key}", chart.chart_config(default_config()))
        assert json.loads(text) == json.loads(made)
        assert "trainprof_gpu_utilization_sampled_ratio_bucket{namespace" not in text
        assert m["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert m["metadata"]["annotations"] == {"grafana_folder": "trainprof"}
        assert _last_applied_size(m) < ANNOTATION_LIMIT, (key, _last_applied_size(m))


def test_dashboard_sidecar_label_value_and_folder_are_values(rendered):
    for m in _configmaps(rendered["actions"]):
        assert m["metadata"]["labels"]["grafana_dashboard_custom"] == "yes"
        assert "grafana_dashboard" not in m["metadata"]["labels"]
        assert m["metadata"]["annotations"] == {"grafana_folder": "Training"}
        assert m["metadata"]["namespace"] == "grafana"


def _recordings_queried(maps: list[dict]) -> set[str]:
    """The recording rules' names (`level:metric:operations`) the dashboards' queries read."""
    import re

    names: set[str] = set()
    for m in maps:
        for text in m["data"].values():
            for expr in re.findall(r'"(?:expr|query|definition)":"((?:[^"\\]|\\.)*)"', text):
                names |= set(re.findall(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b", expr))
    return names


@pytest.mark.parametrize("case", ["default", "sources-report"])
def test_every_recording_a_dashboard_reads_is_in_the_rules_the_chart_renders(rendered, case):
    """A chart installed with `rules compile --source dcgm,node_exporter --format
    helm-values` must not draw dashboards for trainprof's exporter: their panels and
    variables would read recordings that release never evaluates."""
    docs = objects(rendered[case])
    (rule,) = by_kind(docs, "PrometheusRule")
    recorded = {r["record"] for g in rule["spec"]["groups"] for r in g["rules"] if "record" in r}
    queried = _recordings_queried(_configmaps(rendered[case]))
    assert queried, "no recording read by a dashboard: the pattern no longer finds queries"
    assert queried <= recorded, sorted(queried - recorded)[:10]


def test_helm_values_draw_the_dashboards_for_their_source(rendered):
    """The fleet's namespace variable and the job's GPU panels read the adapters' per-job
    gauges on a cluster with only dcgm-exporter and node_exporter."""
    default = {k: t for m in _configmaps(rendered["default"]) for k, t in m["data"].items()}
    sources = {k: t for m in _configmaps(rendered["sources-report"]) for k, t in m["data"].items()}
    assert sorted(sources) == sorted(default)
    for text in sources.values():
        assert "gpu_job:trainprof_gpu_utilization:ratio" in text
    for m in _configmaps(rendered["sources-report"]):
        assert _last_applied_size(m) < ANNOTATION_LIMIT
    for text in default.values():
        assert "gpu_job:trainprof_gpu_utilization:ratio" not in text


def test_helm_values_without_profilerreport_keep_or_switch_off_the_dashboards(
    rendered, user_values, capsys
):
    """Two rules cannot draw the dashboards (they read ProfilerReport's recordings): with
    trainprof's exporter the chart's own stay; with another source they would read series
    that cluster lacks, so none are rendered; either way `rules compile` says why."""
    # the job, fleet and compare dashboards
    assert len(_configmaps(rendered["user-config"])) == 3
    assert _configmaps(rendered["sources"]) == []
    code = cli(
        ["rules", "compile", "-c", str(user_values.parent / "rules.yaml"), "--source", "dcgm"]
        + ["--format", "helm-values", "-o", "-"]
    )
    assert code == 0
    err = capsys.readouterr().err
    assert "dashboards switched off for this source" in err
    assert "trainprof_training_initialization_seconds" in err


def test_without_the_operator_only_core_kinds_render(rendered):
    kinds = sorted({d["kind"] for d in objects(rendered["no-operator"])})
    assert kinds == ["ConfigMap", "DaemonSet", "Service"]


# --- Alertmanager and the actions receiver ------------------------------------------------


def test_alertmanagerconfig_is_the_generated_routing_with_the_users_receivers(rendered, root):
    (amc,) = by_kind(objects(rendered["actions"]), "AlertmanagerConfig")
    generated = yaml.safe_load(
        (root / "alerting" / "trainprof.alertmanagerconfig.yaml").read_text()
    )
    assert amc["spec"]["route"] == generated["spec"]["route"]
    assert amc["spec"]["inhibitRules"] == generated["spec"]["inhibitRules"]
    receivers = {r["name"]: r for r in amc["spec"]["receivers"]}
    assert set(receivers) == {r["name"] for r in generated["spec"]["receivers"]}
    assert receivers["trainprof-page"]["slackConfigs"][0]["channel"] == "#training-pages"
    (hook,) = receivers["trainprof-actions"]["webhookConfigs"]
    assert hook["url"] == "http://t-trainprof-actions.monitoring.svc:9095/alerts"
    assert hook["httpConfig"]["authorization"]["credentials"] == {
        "name": "trainprof-actions-token",
        "key": "token",
    }


def test_alertmanagerconfig_is_off_by_default(rendered):
    assert not by_kind(objects(rendered["default"]), "AlertmanagerConfig")
    assert not [d for d in objects(rendered["default"]) if "actions" in d["metadata"]["name"]]


def test_actions_rbac_grants_exactly_the_one_call(rendered):
    docs = objects(rendered["actions"])
    (role,) = by_kind(docs, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": ["kubeflow.org"], "resources": ["pytorchjobs"], "verbs": ["patch"]}
    ]
    assert not by_kind(docs, "ClusterRoleBinding")
    bindings = by_kind(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for b in bindings:
        assert b["roleRef"]["name"] == role["metadata"]["name"]
        assert b["subjects"] == [
            {"kind": "ServiceAccount", "name": "t-trainprof-actions", "namespace": "monitoring"}
        ]
    assert not by_kind(docs, "Secret")  # existingSecret: the chart creates none


def test_actions_delete_grants_delete(helm, helm_home):
    docs = objects(
        render(
            helm,
            helm_home,
            sets=[
                "actions.enabled=true",
                "actions.token=0123456789abcdef-token",
                "actions.allow.namespaces={ml}",
                "actions.kubernetes.resource=JobSet",
                "actions.kubernetes.action=delete",
            ],
        )
    )
    (role,) = by_kind(docs, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["delete"]}
    ]
    (secret,) = by_kind(docs, "Secret")
    assert base64.b64decode(secret["data"]["token"]).decode() == "0123456789abcdef-token"


def test_actions_configuration_is_accepted_by_the_receiver(rendered):
    from trainprof.actions.config import load_actions_config

    docs = objects(rendered["actions"])
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if "actions.yaml" in d.get("data", {})]
    config = load_actions_config(yaml.safe_load(cm["data"]["actions.yaml"]), "chart")
    assert config.dry_run is False
    assert config.listen == ("0.0.0.0", 9095)
    (deploy,) = by_kind(docs, "Deployment")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert os.path.dirname(config.token_file) in mounts


def test_actions_audit_log_is_kept_on_a_writable_volume(rendered, helm, helm_home):
    """The audit log is the receiver's memory of what it stopped: a restart that lost it would
    stop the same firing again. It is a file on a volume, a claim when one is named."""
    docs = objects(rendered["actions"])
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if "actions.yaml" in d.get("data", {})]
    audit_log = yaml.safe_load(cm["data"]["actions.yaml"])["audit_log"]
    assert audit_log != "-"
    (deploy,) = by_kind(docs, "Deployment")
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (mount,) = [
        m for m in container["volumeMounts"] if m["mountPath"] == os.path.dirname(audit_log)
    ]
    assert not mount.get("readOnly")
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume.get("emptyDir") == {}
    assert pod["securityContext"]["fsGroup"] == container["securityContext"]["runAsGroup"]

    claimed = objects(
        render(
            helm,
            helm_home,
            sets=[
                "actions.enabled=true",
                "actions.token=0123456789abcdef-token",
                "actions.allow.namespaces={ml}",
                "actions.auditLog.existingClaim=actions-audit",
            ],
        )
    )
    (deploy,) = by_kind(claimed, "Deployment")
    volumes = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mount["name"]] == {
        "name": mount["name"],
        "persistentVolumeClaim": {"claimName": "actions-audit"},
    }


def test_actions_networkpolicy_admits_only_alertmanager(rendered):
    docs = objects(rendered["actions"])
    (policy,) = by_kind(docs, "NetworkPolicy")
    (deploy,) = by_kind(docs, "Deployment")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= (
        deploy["spec"]["template"]["metadata"]["labels"].items()
    )
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    assert source["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "alertmanager"}}


@pytest.mark.parametrize(
    "sets, message",
    [
        (["actions.enabled=true", "actions.token=0123456789abcdef"], "allow.namespaces"),
        (["actions.enabled=true", "actions.allow.namespaces={a}", "actions.token=short"], "16"),
        (
            ["actions.enabled=true", "actions.kubernetes.resource=Deployment"],
            "/actions/kubernetes/resource",
        ),
    ],
)
def test_bad_actions_values_fail_with_a_clear_message(sets, message, helm, helm_home):
    args = ["template", "t", str(CHART)]
    for s in sets:
        args += ["--set", s]
    result = run_helm(helm, helm_home, *args)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    for s in sets:  # a token never reaches the output
        if s.startswith("actions.token="):
            assert s.split("=", 1)[1] not in result.stderr


def test_notes_say_what_to_check(helm, helm_home, tmp_path):
    result = run_helm(
        helm,
        helm_home,
        "install",
        "t",
        str(CHART),
        "--dry-run=client",
        "--namespace",
        "monitoring",
    )
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "kubectl -n monitoring get daemonset t-trainprof-exporter" in notes
    assert 'release="kube-prometheus-stack"' in notes
    assert 'container port "trainprof" (local rank 0, port 9946)' in notes
    assert "NVML works" in notes

    secret = "http://u:s3cret@10.0.0.7:9400/metrics"
    for sets, shown in (
        (
            ["exporter.dcgmExporter.enabled=true"],
            "http://t-trainprof-dcgm-exporter-local.gpu-operator",
        ),
        ([f"exporter.dcgmExporter.url={secret}"], "exporter.dcgmExporter.url"),
    ):
        args = [a for s in ["exporter.dcgmExporter.enabled=true", *sets] for a in ("--set", s)]
        result = run_helm(helm, helm_home, "install", "t", str(CHART), "--dry-run=client", *args)
        assert result.returncode == 0, result.stderr
        notes = result.stdout.split("NOTES:", 1)[1]
        assert f"the exporter reads dcgm-exporter at\n     {shown}" in notes
        assert "s3cret" not in notes


# --- the chart's rules give the committed rules' verdicts ---------------------------------


def _default_cases():
    from scenario import load_cases

    return [(i, c) for i, c in load_cases() if "config" not in c]


def _with_assignments(case: dict) -> dict:
    """The case with every GPU held by the job its exporter names, as ranks would say."""
    from scenario import host_labels

    case = copy.deepcopy(case)
    for name, host in case.get("hosts", {}).items():
        labels = host_labels(case, name)
        for i in range(host.get("gpus", 1)):
            who = {k: labels[k] for k in ("namespace", "training_job") if k in labels}
            text = ", ".join(f'{k}="{v}"' for k, v in sorted(who.items()))
            case.setdefault("series", []).append(
                {
                    "series": f'trainprof_gpu_assignment_info{{job="ranks", {text}, '
                    f'gpu="{i}", uuid="GPU-{name}-{i}"}}',
                    "values": "1x" + str(int(4 * 60 * 2)),
                }
            )
    return case


@pytest.fixture(scope="module")
def chart_rules_file(rendered, tmp_path_factory) -> Path:
    (rule,) = by_kind(objects(rendered["default"]), "PrometheusRule")
    path = tmp_path_factory.mktemp("chart-rules") / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


@pytest.mark.parametrize(
    "case", [c for _, c in _default_cases()], ids=[i for i, _ in _default_cases()]
)
def test_scenarios_hold_for_the_charts_prometheusrule(
    case, chart_rules_file, promtool, tmp_path, monkeypatch
):
    import scenario

    monkeypatch.setattr(scenario, "DEFAULT_RULES", chart_rules_file)
    test_file = scenario.promtool_files(_with_assignments(case), tmp_path)
    result = subprocess.run(
        [promtool, "test", "rules", test_file.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "setting, where",
    [
        ("exporter.port=abc", "/exporter/port"),
        ("exporter.serviceMonitor.interval=15 seconds", "/exporter/serviceMonitor/interval"),
        ("exporter.hostPath=/proc", "hostPath"),
        ("dashboards.label=", "/dashboards/label"),
        ("dashboards.files.Job\\.json=x", "'Job.json' does not match"),
        ("dashboards.files.trainprof-job\\.json=", "/dashboards/files/trainprof-job.json"),
        ("actions.dryRun=maybe", "/actions/dryRun"),
        ("exporter.dcgmExporter.url=localhost:9400", "/exporter/dcgmExporter/url"),
        ("exporter.dcgmExporter.pollInterval=1", "/exporter/dcgmExporter/pollInterval"),
    ],
)
def test_bad_values_name_the_key(setting, where, helm, helm_home):
    result = run_helm(helm, helm_home, "template", "t", str(CHART), "--set", setting)
    assert result.returncode != 0
    assert where in result.stderr, result.stderr
    assert "panic" not in result.stderr and "goroutine" not in result.stderr


def test_a_cluster_with_only_dcgm_and_node_exporter_gets_the_sources_group(rendered):
    """`rules compile --source dcgm,node_exporter --format helm-values`: the PrometheusRule
    starts with the normalisation group and holds each configured rule once; no exporter
    DaemonSet is deployed."""
    docs = objects(rendered["sources"])
    (rule,) = by_kind(docs, "PrometheusRule")
    names = [g["name"] for g in rule["spec"]["groups"]]
    assert names[:3] == [
        "trainprof.sources.devices",
        "trainprof.sources.inventory",
        "trainprof.sources",
    ]
    assert names.count("trainprof.LowGPUUtilization") == 1
    assert names.count("trainprof.CPUBottleneck") == 1
    rules_text = yaml.safe_dump(rule["spec"])
    assert "DCGM_FI_DEV_GPU_UTIL" in rules_text and "node_cpu_seconds_total" in rules_text
    assert "gpu_job:trainprof_gpu_utilization:ratio" in rules_text
    assert not by_kind(docs, "DaemonSet")


def test_rules_for_dcgm_exporter_never_add_a_second_gpu_poller(
    rendered, helm, helm_home, user_values, sources_values
):
    """The values `rules compile --source dcgm,node_exporter --format helm-values` writes
    deploy no exporter at all (dcgm-exporter and node_exporter serve every signal); with
    `--source dcgm` alone the exporter serves the host only: no GPU collector, no NVIDIA
    devices in its pod. Asked for, the exporter comes back."""
    assert not [d for d in objects(rendered["sources"]) if "exporter" in d["metadata"]["name"]]
    assert not [
        d for d in objects(rendered["sources-report"]) if "exporter" in d["metadata"]["name"]
    ]
    asked = objects(render(helm, helm_home, [str(sources_values)], ["exporter.enabled=true"]))
    assert len(by_kind(asked, "DaemonSet")) == 1

    dcgm_only = _compile_helm_values(
        user_values.parent / "rules.yaml", user_values.parent / "dcgm-only", "--source", "dcgm"
    )
    (ds,) = by_kind(objects(render(helm, helm_home, [str(dcgm_only)])), "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--no-collector.gpu" in container["args"]
    assert "env" not in container and "runtimeClassName" not in pod
    (ds,) = by_kind(objects(rendered["default"]), "DaemonSet")
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    assert "--no-collector.gpu" not in container["args"]


def test_docstring_examples_run():
    import doctest

    result = doctest.testmod(chart)
    assert result.attempted and result.failed == 0
