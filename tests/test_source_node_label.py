"""node_exporter's series named by another label than `node` (`source_options.node_label`):
the counters' rates are taken before the node label is set, so the compiled rules load, and
promtool finds each core's and each node's shares under the node's name.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from trainprof.engines.promtool import series_text
from trainprof.generation.render import to_yaml
from trainprof.sources import SourceOptions, normalisation_group

HOST = "gpu-host-1"
SAMPLES = 20  # 5 minutes at the 15 s scrape
# cpu0: 80 % busy (user), 10 % iowait, 10 % idle; cpu1 idle.
SHARES = {
    "0": {"user": 0.8, "iowait": 0.1, "idle": 0.1},
    "1": {"user": 0.0, "iowait": 0.0, "idle": 1.0},
}


def _series(node_labels: dict[str, str]) -> list[dict]:
    series = []
    for cpu, shares in SHARES.items():
        for mode, share in shares.items():
            labels = {"cpu": cpu, "mode": mode, **node_labels}
            values = " ".join(f"{15 * share * k:g}" for k in range(SAMPLES + 1))
            series.append(
                {"series": series_text("node_cpu_seconds_total", labels), "values": values}
            )
    for name, value in (("MemTotal", 1000), ("MemAvailable", 600)):
        series.append(
            {
                "series": series_text(f"node_memory_{name}_bytes", node_labels),
                "values": f"{value}x{SAMPLES}",
            }
        )
    received = 15e6
    series.append(
        {
            "series": series_text(
                "node_network_receive_bytes_total", {"device": "eth0", **node_labels}
            ),
            "values": " ".join(f"{received * k:g}" for k in range(SAMPLES + 1)),
        }
    )
    return series


@pytest.mark.parametrize(
    "node_label, node_labels",
    [
        ("instance", {"instance": f"{HOST}:9100"}),
        ("kubernetes_node", {"kubernetes_node": HOST, "instance": "10.0.0.7:9100"}),
        ("node", {"node": HOST, "instance": "10.0.0.7:9100"}),
    ],
)
def test_rates_are_taken_before_the_node_label_is_set(tmp_path, promtool, node_label, node_labels):
    group = normalisation_group(("node_exporter",), SourceOptions(node_label=node_label))
    (tmp_path / "rules.yaml").write_text(to_yaml({"groups": [group]}))
    checked = subprocess.run(
        [promtool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr

    def expect(expr: str, labels: dict[str, str], value: float) -> dict:
        return {
            "expr": expr,
            "eval_time": "4m",
            "exp_samples": [{"labels": series_text(expr.split("{")[0], labels), "value": value}],
        }

    checks = [
        expect('cpu:trainprof_cpu_utilization:ratio{cpu="0"}', {"node": HOST, "cpu": "0"}, 0.8),
        expect('cpu:trainprof_cpu_iowait:ratio{cpu="0"}', {"node": HOST, "cpu": "0"}, 0.1),
        expect("node:trainprof_cpu_utilization:ratio", {"node": HOST}, 0.4),
        expect("node:trainprof_memory_used:ratio", {"node": HOST}, 0.4),
        expect("node:trainprof_network_receive_bytes:rate", {"node": HOST}, 1e6),
    ]
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "15s",
        "tests": [
            {"interval": "15s", "input_series": _series(node_labels), "promql_expr_test": checks}
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
