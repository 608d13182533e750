"""Replay applies each alert's hold itself, and must agree with the rule engine evaluating the
compiled alert as written.

A compiled alert holds by reading its own ALERTS (trainprof.rules.job_alerts), which would
tie a replay chunk's state to the whole job before it. So replay evaluates the alerts without
their hold and `AlertStates` replays `for:` and the hold from each evaluation's active
alerts. Here both run over every scenario that flips around a threshold (tests/scenarios,
the cases with `holds`): promtool evaluating the rules as compiled, and replay's way; the
firing alerts must be the same at every evaluation.
"""

from __future__ import annotations

import pytest

from trainprof.contract.durations import parse_duration
from trainprof.engines.promtool import run_rules
from trainprof.replay.cadence import AlertStates
from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import default_config, load_config
from trainprof.rules.job_alerts import holds, without_holds

from scenario import load_cases, runs, scraped_series

HELD = [(ident, case) for ident, case in load_cases() if case.get("holds") or case.get("held")]


def _firing(by_time) -> dict[float, set[tuple]]:
    return {
        t: {
            tuple(sorted((k, v) for k, v in a.items() if k not in ("alertstate", "__name__")))
            for a in alerts
        }
        for t, alerts in by_time.items()
    }


@pytest.mark.parametrize("case", [c for _, c in HELD], ids=[i for i, _ in HELD])
def test_replay_holds_alerts_as_the_rule_engine_does(case, promtool, tmp_path):
    scrape = parse_duration(case.get("scrape_interval", "15s"))
    evaluation = parse_duration(case.get("evaluation_interval", "1m"))
    end = parse_duration(case.get("duration", "20m"))
    config = load_config(case["config"], "scenario", scrape) if "config" in case else None
    compiled = compile_rules(config or default_config(scrape))
    series = {s["series"]: s["values"] for s in scraped_series(case, 0.5)}
    series |= {s["series"]: runs(s["values"], scrape) for s in case.get("series", [])}
    (tmp_path / "literal").mkdir()
    (tmp_path / "replay").mkdir()
    literal = run_rules(compiled.groups, series, scrape, evaluation, end, tmp_path / "literal")
    active = run_rules(
        without_holds(compiled.groups, compiled.affected, compiled.config.job_labels),
        series,
        scrape,
        evaluation,
        end,
        tmp_path / "replay",
        active=True,
    )
    replayed = AlertStates(compiled.groups, evaluation, holds(compiled.affected)).firing(
        active.firing, end
    )
    want, got = _firing(literal.firing), _firing(replayed)
    times = sorted(t for t in set(want) | set(got) if t > 0)
    assert [(t, got.get(t, set())) for t in times] == [(t, want.get(t, set())) for t in times]
    assert any(want.values()), "the case fires"
