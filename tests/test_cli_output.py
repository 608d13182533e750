"""`--json FILE|-` (replay, trace summarize) and `report -o FILE|-`, written by one helper
(`cliargs.write_output`): a file holds what - prints, and a file that cannot be written is
exit 1 naming it, never a traceback."""

from __future__ import annotations

import json

import numpy as np
import pytest

import warm_cli
from smdebug_writer import write_trial

# One rank, one kernel of 10 us on stream 7: a trace PyTorch's profiler could have written.
TRACE = {
    "traceEvents": [
        {
            "ph": "X",
            "cat": "kernel",
            "name": "volta_sgemm_128x64_nn",
            "pid": 0,
            "tid": 7,
            "ts": 100,
            "dur": 10,
            "args": {"device": 0, "stream": 7, "correlation": 1},
        }
    ]
}


def cli(*args) -> warm_cli.Run:
    """`python -m trainprof.cli ARGS` in a process of its own (forked with torch imported)."""
    return warm_cli.run(*args, timeout=300)


def _unwritable(done: warm_cli.Run, path) -> None:
    assert done.returncode == 1, done.stderr
    assert f"error: cannot write {path}: No such file or directory" in done.stderr
    assert "Traceback" not in done.stderr


def test_trace_summary_json_to_a_file_or_stdout(tmp_path):
    trace = tmp_path / "rank0.json"
    trace.write_text(json.dumps(TRACE))
    printed = cli("trace", "summarize", trace, "--json", "-")
    assert printed.returncode == 0, printed.stderr
    written = cli("trace", "summarize", trace, "--json", tmp_path / "summary.json")
    assert written.returncode == 0 and written.stdout == "", written.stderr
    assert (tmp_path / "summary.json").read_text() == printed.stdout
    assert json.loads(printed.stdout)["ranks"]["0"]["span_seconds"] == pytest.approx(10e-6)
    missing = tmp_path / "no-such-dir" / "summary.json"
    _unwritable(cli("trace", "summarize", trace, "--json", missing), missing)


def test_report_html_to_a_file_or_stdout(tmp_path):
    trace = tmp_path / "rank0.json"
    trace.write_text(json.dumps(TRACE))
    printed = cli("report", "--trace", trace, "-o", "-")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.startswith("<!DOCTYPE html>") and "wrote" not in printed.stderr
    out = tmp_path / "report.html"
    written = cli("report", "--trace", trace, "-o", out)
    assert written.returncode == 0 and written.stdout == "", written.stderr
    assert f"wrote {out} (" in written.stderr and out.read_text().startswith("<!DOCTYPE html>")
    missing = tmp_path / "no-such-dir" / "report.html"
    _unwritable(cli("report", "--trace", trace, "-o", missing), missing)


def test_replayed_trial_verdicts_to_a_file_or_stdout(promtool, tmp_path):
    # Losses that stop decreasing: LossNotDecreasing first fires at step 12.
    losses = dict(zip((0, 4, 8, 12, 16), (0.30, 0.33, 0.31, 0.30, 0.28)))
    trial = write_trial(
        tmp_path / "job" / "debug-output",
        {s: {"CrossEntropyLoss_output_0": np.float32(loss)} for s, loss in losses.items()},
    )
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - rule: LossNotDecreasing\n")
    printed = cli("replay", trial, "--rules", rules, "--json", "-")
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout)["rules"]["LossNotDecreasing"]["first_fired_step"] == 12
    verdicts = tmp_path / "verdicts.json"
    written = cli("replay", trial, "--rules", rules, "--json", verdicts)
    assert written.returncode == 0, written.stderr
    assert verdicts.read_text() == printed.stdout
    assert "LossNotDecreasing" in written.stdout and "first fired at step" in written.stdout
    missing = tmp_path / "no-such-dir" / "verdicts.json"
    _unwritable(cli("replay", trial, "--rules", rules, "--json", missing), missing)
