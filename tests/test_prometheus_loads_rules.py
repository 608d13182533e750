"""A real Prometheus loads the compiled rules and evaluates every one without an error."""

from __future__ import annotations

import time

import yaml

from trainprof.generation.render import to_yaml
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import load_config

from servers import prometheus, query

OVERRIDES = {
    "job_selector": {"namespace": 'team "a"\n', "training_job": {"regex": "bert-.*"}},
    "rules": [
        {
            "rule": "ProfilerReport",
            "parameters": {
                "scan_interval_us": 1_000_000,
                "CPUBottleneck_cpu_threshold": 85,
                "LowGPUUtilization_window": 100,
                "StepOutlier_mode": "TRAIN",
            },
        },
        {"rule": "IOBottleneck", "parameters": {"window": 600, "scan_interval_us": 1e6}},
    ],
}


def test_prometheus_loads_and_evaluates_default_and_overridden_rules(
    prometheus_bin, root, tmp_path
):
    default = (root / "rules" / "trainprof.rules.yaml").read_text()
    compiled = compile_rules(load_config(OVERRIDES))
    overridden = to_yaml(
        {"groups": [{**g, "name": g["name"] + ".overridden"} for g in compiled.groups]}
    )
    config = (
        "global: {evaluation_interval: 1s}\n"
        "rule_files: [default.rules.yaml, overridden.rules.yaml]\n"
    )
    with prometheus(
        prometheus_bin,
        tmp_path,
        config,
        {"default.rules.yaml": default, "overridden.rules.yaml": overridden},
    ) as base:
        expected = {g["name"] for g in yaml.safe_load(default)["groups"]}
        expected |= {g["name"] for g in yaml.safe_load(overridden)["groups"]}
        deadline = time.monotonic() + 20
        while True:
            groups = query_rules(base)
            loaded = {g["name"] for g in groups}
            fast = [
                r
                for g in groups
                if g["name"].endswith(".overridden") and g["interval"] <= 1
                for r in g["rules"]
            ]
            if loaded == expected and fast and all(r["health"] == "ok" for r in fast):
                break
            assert time.monotonic() < deadline, f"rules not evaluated: {groups}"
            time.sleep(0.5)
        errors = [
            (r["name"], r.get("lastError"))
            for g in groups
            for r in g["rules"]
            if r.get("lastError")
        ]
        assert not errors
        # Every default expression also runs as an instant query (the slow groups may not
        # have been evaluated yet).
        for group in yaml.safe_load(default)["groups"]:
            for rule in group["rules"]:
                assert query(base, rule["expr"])["status"] == "success", rule["expr"]


def query_rules(base: str) -> list[dict]:
    from servers import get_json

    return get_json(f"{base}/api/v1/rules")["data"]["groups"]
