"""Every dashboard query runs against a real Prometheus scraping a real (small) job, with the
compiled rules loaded, and returns data; the alerts' dashboard links lead to that data."""

from __future__ import annotations

import json
import time
import urllib.parse

import pytest

from trainprof.dashboards import fleet, job, panel_queries
from trainprof.dashboards.panels import grafanalib_json, modernize
from trainprof.dashboards.queries import interpolate

from servers import get_json, try_query

BUILTINS = {"__rate_interval": "4s", "__range": "1m", "__interval": "1s"}
FOUND = "Found in the range"  # a rule row's table of what its alert found


def built(module, config) -> dict:
    return modernize(grafanalib_json(module.dashboard(config)))


def run_until_all_return_data(base: str, queries, values, timeout: float = 60.0):
    """Run every query; fail at once on an error, retry the empty ones until the job has
    produced what they need. Returns the number of queries run."""
    pending = {
        (i, title, ref): interpolate(expr, values, BUILTINS)
        for i, (title, ref, expr) in enumerate(queries)
    }
    total = len(pending)
    deadline = time.monotonic() + timeout
    while pending:
        for key, expr in list(pending.items()):
            result, error = try_query(base, expr)
            assert error is None, f"{key}: {error}\n{expr}"
            if result:
                del pending[key]
        if not pending:
            break
        if time.monotonic() > deadline:
            empty = "\n".join(
                f"  {title} [{ref}]: {expr}" for (_, title, ref), expr in pending.items()
            )
            pytest.fail(f"{len(pending)} of {total} queries still empty:\n{empty}")
        time.sleep(1)
    return total


@pytest.mark.parametrize("selection", ["all", "one"])
def test_every_job_dashboard_query_returns_data(live_job, selection):
    base, live, config = live_job
    values = {
        "namespace": live.namespace,
        "training_job": live.training_job,
        "node": None,
        "gpu": None,
        "rank": None,
    }
    if selection == "one":
        values.update(node="n1", gpu=["0"], rank="0")
    queries = panel_queries(built(job, config))
    # What a rule's alert found is empty for the rules this job does not trip (its alert
    # is quiet); it must still run, and show what the tripped ones found.
    found = [q for q in queries if q[0] == FOUND]
    others = [q for q in queries if q[0] != FOUND]
    assert run_until_all_return_data(base, others, values) == len(others) > 50
    answers = [try_query(base, interpolate(expr, values, BUILTINS)) for _, _, expr in found]
    assert all(error is None for _, error in answers), answers
    assert sum(bool(result) for result, _ in answers) >= 4, answers


def test_every_fleet_query_returns_data(live_job):
    base, live, config = live_job
    queries = panel_queries(built(fleet, config))
    run_until_all_return_data(base, queries, {"namespace": None})


def test_the_variables_list_the_job(live_job):
    base, live, config = live_job
    data = built(job, config)
    values = {"namespace": live.namespace, "training_job": live.training_job, "node": None}
    found = {}
    for variable in data["templating"]["list"]:
        if variable["type"] != "query":
            continue
        selector, label = variable["query"][len("label_values(") : -1].rsplit(", ", 1)
        selector = interpolate(selector, values)
        url = f"{base}/api/v1/label/{label}/values?" + urllib.parse.urlencode({"match[]": selector})
        found[variable["name"]] = get_json(url)["data"]
    assert found == {
        "namespace": [live.namespace],
        "training_job": [live.training_job],
        "node": live.nodes,
        "gpu": ["0", "1"],
        "rank": ["0", "1"],
    }


def test_alert_links_open_the_job_dashboard_with_the_alerts_job_selected(live_job):
    base, live, config = live_job
    deadline = time.monotonic() + 60
    while True:
        alerts = [
            a
            for a in get_json(f"{base}/api/v1/alerts")["data"]["alerts"]
            if a["state"] == "firing" and "dashboard_url" in a["annotations"]
        ]
        if alerts or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert alerts, "no alert fired"
    data = built(job, config)
    variables = {v["name"] for v in data["templating"]["list"]}
    for alert in alerts:
        url = urllib.parse.urlparse(alert["annotations"]["dashboard_url"])
        assert url.path == f"/d/{data['uid']}/{job.SLUG}"
        args = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        assert args == {"var-training_job": live.training_job, "var-namespace": live.namespace}
        assert {name[len("var-") :] for name in args} <= variables


def test_the_committed_dashboards_queries_are_valid_promql(live_job, root):
    """The committed dashboards (SageMaker's default windows and intervals, so not every
    query has data yet) parse and evaluate without an error."""
    base, live, _ = live_job
    values = {
        "namespace": live.namespace,
        "training_job": live.training_job,
        "node": None,
        "gpu": None,
        "rank": None,
    }
    for name in ("trainprof-job.json", "trainprof-fleet.json"):
        data = json.loads((root / "dashboards" / name).read_text())
        for title, ref, expr in panel_queries(data):
            _, error = try_query(base, interpolate(expr, values, BUILTINS))
            assert error is None, f"{name} {title} [{ref}]: {error}"
