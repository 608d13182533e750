"""A rule added in one place reaches everything: the compiled rules, the health group, the
job dashboard's row, the report's rule list and detail, and the docs.

The rule below is declared only here, as a catalog entry; the fixture adds it to the catalog
for one test. Nothing else in the product is told about it.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from trainprof.dashboards import iter_panels, job, panels
from trainprof.generation import docs
from trainprof.replay.synthetic import write_system
from trainprof.report import build, from_replay, render
from trainprof.rules.catalog import registry
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import default_config, load_config
from trainprof.rules.model import (
    RATIO_UNIT,
    Alert,
    Build,
    HealthCheck,
    Recording,
    Recordings,
    RuleOutput,
    RuleSpec,
    Selects,
    Signal,
    percent_threshold,
    ratio,
)
from trainprof.rules.params import PERCENT, param, scan_interval_param

_MEMORY = "trainprof_memory_used_sampled_ratio"


@dataclasses.dataclass(frozen=True)
class HostMemoryHighParams:
    threshold: float = param(90, PERCENT, "Host memory use above which the rule fires.")
    scan_interval_us: int = scan_interval_param()


def _build(b: Build[HostMemoryHighParams]) -> RuleOutput:
    mean = Recording(
        "node",
        _MEMORY,
        "mean_rate1m",
        f"rate({b.sel(_MEMORY + '_sum')}[1m])\n/\nrate({b.sel(_MEMORY + '_count')}[1m])",
    )
    alert = Alert(
        expr=f"{mean.record} > {ratio(b.p.threshold)}",
        summary="A host's memory is nearly full.",
        description=f"Host memory is above {b.p.threshold:g}%.",
    )
    return RuleOutput((mean,), (alert,))


def _signals(
    b: Build[HostMemoryHighParams], out: RuleOutput, scope: Selects, _: Recordings
) -> tuple[Signal, ...]:
    return (
        Signal(
            "Mean host memory over 1m",
            scope.sel(out.recordings[0].record),
            "{{node}}",
            RATIO_UNIT,
            percent_threshold("threshold", b.p.threshold, "above"),
        ),
    )


def _health(b: Build[HostMemoryHighParams]) -> tuple[HealthCheck, ...]:
    return (
        HealthCheck(
            "TrainprofHostMemoryUnsampled",
            f"absent({b.sel(_MEMORY + '_count')})",
            summary="No exporter samples host memory.",
            description="HostMemoryHigh cannot fire.",
        ),
    )


HOST_MEMORY_HIGH = RuleSpec(
    name="HostMemoryHigh",
    summary="Host memory nearly full",
    detects="The mean host memory use over a minute, per node, above `threshold` percent.",
    recommendation="Lower the DataLoader's prefetching or pick a host with more memory.",
    severity="warning",
    parameters=HostMemoryHighParams,
    build=_build,
    signals=_signals,
    health=_health,
    family="system",
    differences="Not a SageMaker rule: a test's throwaway.",
)


@pytest.fixture
def throwaway(monkeypatch):
    monkeypatch.setattr(registry, "CATALOG", registry.CATALOG + (HOST_MEMORY_HIGH,))
    by_name = {**registry.BY_NAME, "HostMemoryHigh": HOST_MEMORY_HIGH}
    monkeypatch.setattr(registry, "BY_NAME", by_name)
    return HOST_MEMORY_HIGH


def _config(threshold: float = 60):
    return load_config(
        {
            "rules": [
                {"rule": "hostmemoryhigh", "parameters": {"threshold": str(threshold)}},
                {"rule": "LowGPUUtilization"},
            ]
        }
    )


def test_the_compiled_rules_hold_its_group_and_its_health_check(throwaway):
    compiled = compile_rules(_config(60))
    group = next(g for g in compiled.groups if g["name"] == "trainprof.HostMemoryHigh")
    record, affected, alert = group["rules"]
    assert record["record"] == "node:trainprof_memory_used_sampled_ratio:mean_rate1m"
    # its condition, recorded per unit, which the one alert per job reads
    assert affected["record"] == "training_job:trainprof_rule_host_memory_high:affected"
    assert affected["expr"] == f"{record['record']} > 0.6"
    assert alert["alert"] == "TrainingHostMemoryHigh"
    assert alert["expr"].startswith(affected["record"])
    assert alert["labels"]["rule"] == "HostMemoryHigh"
    assert alert["annotations"]["runbook_url"].endswith("#hostmemoryhigh")
    health = next(g for g in compiled.groups if g["name"] == "trainprof.health")
    assert {"alert": "TrainprofHostMemoryUnsampled", "affects": "HostMemoryHigh"} in [
        {"alert": r["alert"], "affects": r["labels"]["affects"]}
        for r in health["rules"]
        if "alert" in r
    ]
    assert (
        compiled.recording(_MEMORY, level="node", rule="HostMemoryHigh").record
        == (record["record"])
    )
    # ProfilerReport stands for every catalog rule, the new one included.
    assert compile_rules(default_config()).rule("HostMemoryHigh") is not None


def test_the_job_dashboard_has_its_row_with_the_configured_threshold(throwaway):
    # The job dashboard reads the summary rules' recordings: ProfilerReport, whose
    # `<Rule>_<parameter>` overrides reach the new rule too.
    config = load_config(
        {"rules": [{"rule": "ProfilerReport", "parameters": {"HostMemoryHigh_threshold": "60"}}]}
    )
    data = json.loads(panels.render(job.dashboard(config)))
    row = next(p for p in data["panels"] if p["title"].startswith("HostMemoryHigh"))
    assert row["title"] == "HostMemoryHigh: Host memory nearly full"
    charts = [p for p in iter_panels({"panels": row["panels"]}) if p["type"] == "timeseries"]
    (chart,) = charts
    assert chart["title"] == "Mean host memory over 1m"
    assert chart["targets"][0]["expr"].startswith(
        "node:trainprof_memory_used_sampled_ratio:mean_rate1m{"
    )
    steps = chart["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert 0.6 in [s["value"] for s in steps]
    assert "threshold = 60%" in chart["description"]


def test_the_report_lists_it_and_details_it_when_it_fires(throwaway, tmp_path, promtool):
    source = tmp_path / "job" / "profiler-output"
    write_system(
        str(source),
        start=1_700_000_000,
        duration=6 * 60,
        interval=0.5,
        hosts={"algo-1": {"cores": 2, "gpus": 1, "timeline": [{"mem": 0.95}]}},
    )
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n- rule: HostMemoryHigh\n- rule: LowGPUUtilization\n")
    collected = from_replay(str(tmp_path / "job"), str(rules), promtool=promtool)
    assert collected.verdicts["HostMemoryHigh"].alerts, collected.notes
    html = render(build(collected))
    row = re.search(r'<tr class="main fired" data-rule="HostMemoryHigh">(.*?)</tr>', html)
    assert row, "the rules table has no fired HostMemoryHigh row"
    assert "Host memory use above which" not in row.group(1)  # the detects text, not params
    assert "mean host memory use over a minute" in row.group(1)
    article = re.search(r'<article class="rule" id="rule-HostMemoryHigh">(.*?)</article>', html)
    assert article and "Mean host memory over 1m" in article.group(1)


def test_the_docs_describe_it(throwaway):
    text = docs.rules_md()
    assert "| [HostMemoryHigh](#hostmemoryhigh) | `TrainingHostMemoryHigh` | warning |" in text
    section = text.split("## HostMemoryHigh\n", 1)[1]
    assert "| `threshold` | 90 | Host memory use above which the rule fires." in section
    assert "record: node:trainprof_memory_used_sampled_ratio:mean_rate1m" in section
    assert "Not a SageMaker rule: a test's throwaway." in section


def test_without_the_fixture_the_catalog_does_not_know_it():
    assert registry.lookup("HostMemoryHigh") is None


def test_a_rule_declared_wrong_is_refused_when_its_module_is_imported():
    declared = dict(
        name="Broken",
        summary="s",
        detects="d",
        recommendation="r",
        severity="warning",
        parameters=HostMemoryHighParams,
        build=_build,
        signals=_signals,
    )
    RuleSpec(**declared)  # as declared, it is fine
    with pytest.raises(ValueError, match="rule Broken: an alerting rule says what its dashboard"):
        RuleSpec(**{**declared, "signals": None})

    @dataclasses.dataclass(frozen=True)
    class Plain:
        threshold: float = 90

    with pytest.raises(TypeError, match=r"Plain.threshold is not declared with param\(\)"):
        RuleSpec(**{**declared, "parameters": Plain})
    with pytest.raises(KeyError, match="gpu_threshold"):
        RuleSpec(**{**declared, "gpu_idle_param": "gpu_threshold"})


def test_a_recording_name_is_built_from_its_parts_and_checked_as_it_is_made():
    rec = Recording("node", _MEMORY, "mean_rate1m", "1")
    assert rec.record == "node:trainprof_memory_used_sampled_ratio:mean_rate1m"
    with pytest.raises(ValueError, match="recording part 'mean:1m' is not lower_snake_case"):
        Recording("node", _MEMORY, "mean:1m", "1")
