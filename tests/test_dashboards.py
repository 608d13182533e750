"""The generated dashboards: Grafana's schema, layout, links, and one source of truth."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from trainprof.contract import metrics as contract
from trainprof.contract.names import JOB_DASHBOARD
from trainprof.dashboards import DASHBOARDS, compare, fleet, job, panel_queries
from trainprof.dashboards import iter_panels as panels
from trainprof.dashboards.panels import grafanalib_json, modernize
from trainprof.dashboards.queries import JOB_VARIABLES, Scope, interpolate, series_labels
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import default_config, load_config


def committed(root, name: str) -> dict:
    return json.loads((root / name).read_text())


def check_schema(tools, paths) -> dict[str, list[dict]]:
    result = subprocess.run(
        ["node", "scripts/check-dashboard-schema.mjs", str(tools), *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode in (0, 1), result.stderr
    return {doc["file"]: doc["errors"] for doc in map(json.loads, result.stdout.splitlines())}


def test_the_committed_dashboards_follow_grafanas_dashboard_schema(root, grafana_schema):
    errors = check_schema(grafana_schema, [root / p for p in DASHBOARDS])
    assert errors and not any(errors.values()), errors


def test_grafanalibs_own_output_fails_the_schema_so_the_check_has_teeth(
    root, grafana_schema, tmp_path
):
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps(grafanalib_json(job.dashboard(default_config()))))
    errors = check_schema(grafana_schema, [raw])[str(raw)]
    messages = {e["message"] for e in errors}
    assert "must NOT have additional properties (sharedCrosshair)" in messages
    assert len(errors) > 100


def test_alerts_link_to_the_job_dashboard_and_its_variables(root):
    data = committed(root, "dashboards/trainprof-job.json")
    assert data["uid"] == JOB_DASHBOARD.uid
    urls = {
        r["annotations"]["dashboard_url"]
        for g in compile_rules(default_config()).groups
        for r in g["rules"]
        if "dashboard_url" in r.get("annotations", {})
    }
    assert len(urls) == 1
    url = urls.pop()
    assert f"/d/{data['uid']}/{job.SLUG}?" in url
    names = {v["name"] for v in data["templating"]["list"]}
    assert {"datasource", *JOB_VARIABLES} == names
    assert set(re.findall(r"var-(\w+)=", url)) <= names


def _variables_set(url: str) -> dict[str, str]:
    return dict(re.findall(r"var-(\w+)=([^&]*)", url))


def test_the_dashboards_link_to_each_other(root):
    job_data = committed(root, "dashboards/trainprof-job.json")
    fleet_data = committed(root, "dashboards/trainprof-fleet.json")
    compare_data = committed(root, "dashboards/trainprof-compare.json")
    job_links = [link["url"] for link in job_data["links"]]
    assert job_links[0] == f"/d/{fleet.UID}/{fleet.SLUG}"
    # The job dashboard opens the compare dashboard with this job as A and B, and the
    # compare dashboard opens either job's dashboard: each sets only variables the other has.
    assert job_links[1].startswith(f"/d/{compare.UID}/{compare.SLUG}?")
    names = {
        d: {v["name"] for v in data["templating"]["list"]}
        for d, data in (("job", job_data), ("compare", compare_data))
    }
    assert _variables_set(job_links[1]) == {
        "job_a": "$training_job",
        "job_b": "$training_job",
        "namespace": "$namespace",
    }
    assert set(_variables_set(job_links[1])) <= names["compare"]
    back = [link["url"] for link in compare_data["links"]]
    assert [u.split("?")[0] for u in back] == [f"/d/{job.UID}/{job.SLUG}"] * 2
    assert [_variables_set(u)["training_job"] for u in back] == ["$job_a", "$job_b"]
    assert all(set(_variables_set(u)) <= names["job"] for u in back)
    assert [link["url"] for link in fleet_data["links"]] == [f"/d/{job.UID}/{job.SLUG}"]
    table_links = [
        link["url"]
        for p in panels(fleet_data)
        for o in p.get("fieldConfig", {}).get("overrides", [])
        for prop in o["properties"]
        if prop["id"] == "links"
        for link in prop["value"]
    ]
    assert table_links and all(
        u.startswith(f"/d/{job.UID}/{job.SLUG}?var-training_job=") for u in table_links
    )


@pytest.mark.parametrize("name", list(DASHBOARDS))
def test_panels_have_unique_ids_and_fit_the_grid_without_overlapping(root, name):
    data = committed(root, name)
    ids = [p["id"] for p in panels(data)]
    assert len(ids) == len(set(ids))

    def assert_no_overlap(group):
        cells: dict[tuple[int, int], str] = {}
        for p in group:
            g = p["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                    cells[(x, y)] = p["title"]

    assert_no_overlap(data["panels"])  # open rows' panels and every row header
    for row in data["panels"]:
        assert_no_overlap(row.get("panels", []))  # inside each collapsed row


@pytest.mark.parametrize("name", list(DASHBOARDS))
def test_every_query_uses_the_datasource_variable_and_no_value_is_null(root, name):
    data = committed(root, name)
    for p in panels(data):
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert all(t["datasource"] == p["datasource"] for t in p["targets"])
    nulls = []

    def walk(value, path):
        if isinstance(value, dict):
            for k, v in value.items():
                if v is None and not (k == "value" and "/steps/" in path):
                    nulls.append(f"{path}/{k}")
                walk(v, f"{path}/{k}")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{path}/{i}")

    walk(data, "")
    assert not nulls


@pytest.mark.parametrize("name", list(DASHBOARDS))
def test_queries_name_only_contract_metrics_and_recordings_the_rules_write(root, name):
    recorded = {
        r["record"]
        for g in compile_rules(default_config()).groups
        for r in g["rules"]
        if "record" in r
    }
    known = {n for m in contract.METRICS for n in contract.series_names(m)}
    known |= recorded | {"ALERTS", "ALERTS_FOR_STATE"}
    for title, _, expr in panel_queries(committed(root, name)):
        without_strings = re.sub(r'"(\\.|[^"\\])*"', '""', expr)
        names = set(re.findall(r"\b(trainprof_\w+|\w+:\w+:\w+|ALERTS\w*)\b", without_strings))
        assert names <= known, f"{title}: {names - known}"


def test_a_parameter_change_moves_the_alert_and_the_threshold_line_together():
    config = load_config(
        {
            "rules": [
                {
                    "rule": "ProfilerReport",
                    "parameters": {
                        "LowGPUUtilization_threshold_p95": 55,
                        "LowGPUUtilization_window": 240,
                    },
                }
            ]
        }
    )
    data = modernize(grafanalib_json(job.dashboard(config)))
    row = next(p for p in data["panels"] if p["title"].startswith("LowGPUUtilization"))
    p95 = next(p for p in row["panels"] if p["title"].startswith("95th percentile"))
    assert p95["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 0.55
    assert "threshold_p95 = 55%" in p95["description"]
    group = next(
        g for g in compile_rules(config).groups if g["name"] == "trainprof.LowGPUUtilization"
    )
    alert = next(r for r in group["rules"] if r.get("labels", {}).get("reason") == "underutilized")
    # The alert decides on the share of samples at or below 55 % over the window; the panel
    # shows the 95th percentile over the same window against a line at 55 %.
    assert alert["expr"] == (
        "gpu:trainprof_gpu_utilization_sampled_ratio:fraction_below55_rate2m > 0.95"
    )
    panel = p95["targets"][0]["expr"]
    assert panel.startswith("histogram_quantile(0.95, rate(") and panel.endswith("[2m]))")


def test_the_rules_table_holds_every_alerting_rule_with_its_recommendation(root):
    data = committed(root, "dashboards/trainprof-job.json")
    table = next(p for p in panels(data) if p["title"] == "Rules summary" and p["type"] == "table")
    catalog = next(t["expr"] for t in table["targets"] if t["refId"] == "catalog")
    for instance in default_config().rules:
        present = f'"rule", "{instance.spec.name}"' in catalog
        assert present == instance.spec.alerting, instance.spec.name
        if instance.spec.alerting:
            assert json.dumps(instance.spec.recommendation) in catalog


def test_the_committed_header_is_where_the_stale_file_check_looks(root):
    for name in DASHBOARDS:
        assert "Code generated by make generate" in (root / name).read_text()[:300]


def test_a_gpu_variable_narrows_gpu_series_only():
    scope = Scope(default_config(), JOB_VARIABLES)
    assert 'gpu=~"$gpu"' in scope.sel("trainprof_gpu_utilization_sampled_ratio_bucket")
    assert "gpu" not in scope.sel("trainprof_cpu_utilization_sampled_ratio_bucket")
    assert 'rank=~"$rank"' in scope.sel("trainprof_training_steps_total")
    assert series_labels(
        "training_job:trainprof_cpu_bottleneck_samples:ratio", ("namespace", "training_job")
    ) == {"namespace", "training_job"}
    with pytest.raises(KeyError, match="neither a recording rule nor in the metric contract"):
        scope.sel("trainprof_gpu_utilisation_ratio")


def test_variable_values_are_escaped_as_grafana_escapes_them():
    expr = 'x{training_job="$training_job", node=~"$node", gpu=~"$gpu"}[$__range]'
    out = interpolate(
        expr, {"training_job": 'a"b\\c', "node": "n.1", "gpu": ["0", "1"]}, {"__range": "1h"}
    )
    assert out == 'x{training_job="a\\"b\\\\c", node=~"n\\\\.1", gpu=~"(0|1)"}[1h]'
    with pytest.raises(KeyError, match=r"\$rank"):
        interpolate('x{rank=~"$rank"}', {})
