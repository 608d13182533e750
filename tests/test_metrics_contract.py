"""The metric table follows Prometheus naming and is what the docs and rules use."""

from __future__ import annotations

import re

import pytest

from trainprof.contract import metrics as contract
from trainprof.rules import catalog

UNIT_SUFFIX = {
    "seconds": "_seconds",
    "bytes": "_bytes",
    "ratio": "_ratio",
    "watts": "_watts",
    "joules": "_joules",
    "celsius": "_celsius",
    "hertz": "_hertz",
}
FORBIDDEN = {"job", "instance", "step", "pid", "epoch", "batch", "pod", "namespace"}


@pytest.mark.parametrize("m", contract.METRICS, ids=[m.name for m in contract.METRICS])
def test_names_follow_prometheus_conventions(m):
    assert re.match(r"^trainprof_[a-z][a-z0-9_]*$", m.name)
    assert m.type in ("counter", "gauge", "histogram", "summary")
    assert m.name.endswith("_total") == (m.type == "counter")
    if m.name.endswith("_info"):
        assert m.type == "gauge" and m.unit == ""
    if m.unit:
        stem = m.name.removesuffix("_total")
        assert stem.endswith(UNIT_SUFFIX[m.unit]), f"{m.name} lacks its unit suffix"
    assert not FORBIDDEN & set(m.labels + m.identity), f"{m.name} uses a forbidden label"
    assert m.help.endswith(".") and len(m.help) > 20
    assert (m.type == "histogram") == bool(m.buckets)


def test_names_are_unique_across_sample_names():
    names = [n for m in contract.METRICS for n in contract.series_names(m)]
    assert len(names) == len(set(names))


def test_used_by_names_real_rules():
    rules = {r.name for r in catalog.CATALOG} | {"all system rules"}
    for m in contract.METRICS:
        assert set(m.used_by) <= rules, m.name


def test_bucket_bounds_include_sagemaker_default_thresholds():
    for percent in (10, 50, 70):
        assert percent / 100 in contract.UTILIZATION_BUCKETS
    assert 0.9 in contract.BUSY_THRESHOLDS and 0.1 in contract.GPU_IDLE_THRESHOLDS
    assert 0.5 in contract.BUSY_THRESHOLDS and 3.0 in contract.OUTLIER_STDDEVS


def test_threshold_labels_are_canonical():
    assert contract.threshold_label(90 / 100) == "0.9"
    assert contract.threshold_label(3) == "3"
    assert contract.threshold_label(0.15) == "0.15"


def test_metrics_doc_lists_every_metric(root):
    text = (root / "docs" / "metrics.md").read_text()
    for m in contract.METRICS:
        assert f"`{m.name}`" in text
