"""The report says what each rule decided: no data and not applicable are not "ok"."""

from __future__ import annotations

from trainprof.report import build, from_replay, render


def test_the_report_shows_status_datapoints_and_measure_of_every_rule(real_data, promtool):
    source = real_data / "real-sagemaker" / "trimcrae-8xtt-redock"
    report = build(from_replay(str(source), None, scrape_interval=15))
    rows = {r.name: r for r in report.rules}
    assert rows["LoadBalancing"].state == "not_applicable"
    assert "needs 2 GPUs on a node" in rows["LoadBalancing"].reason
    assert rows["StepOutlier"].state == "no_data"
    assert rows["LowGPUUtilization"].status == "fired"
    cpu = rows["CPUBottleneck"]
    assert cpu.state == "quiet" and cpu.measured.endswith("vs above 50%")
    assert cpu.measured.startswith(("46%", "47%"))
    page = render(report)
    assert 'class="badge not_applicable"' in page and 'class="badge no_data"' in page
    assert "Datapoints analysed: 1,4" in page or "Datapoints analysed: 14" in page
