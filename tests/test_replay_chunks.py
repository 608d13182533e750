"""A long job replayed in time chunks reports exactly what one promtool run over it reports:
the same alerts at the same times, the same statuses and measured values, byte for byte.

The oracle is the single pass through real promtool (chunk_instants larger than the job);
the chunked replay runs promtool once per chunk."""

from __future__ import annotations

import json
import math
import random
import re

import pytest

from trainprof.engines.promtool import encode, run_rules
from trainprof.replay import replay
from trainprof.replay.chunks import ChunkedStore, Plan, run_chunked, shifted
from trainprof.replay.reach import LOOKBACK, UNBOUNDED, selectors, warmups
from trainprof.replay.series_store import SeriesStore
from trainprof.replay.synthetic import write_system

START = 1_700_000_000
ONE_PASS = 0  # chunks turned off
CHUNK = 152  # scrapes: 38 min at 15 s


def _expand(text: str) -> list[float | None]:
    """promtool's reading of `a+bxn`, `axn`, `_xn`: b added again and again, as its parser
    does (an oracle of its own, not the code under test)."""
    out: list[float | None] = []
    for token in text.split():
        if token.startswith("_"):
            out += [None] * (int(token[2:]) if "x" in token else 1)
            continue
        m = re.fullmatch(r"(-?[^+\-x]+)(?:([+-])([^x]+))?(?:x(\d+))?", token)
        assert m, token
        value = float(m.group(1))
        if m.group(4) is None:
            out.append(value)
            continue
        step = float(m.group(3) or 0) * (-1 if m.group(2) == "-" else 1)
        for _ in range(int(m.group(4)) + 1):
            out.append(value)
            value += step
    return out


def test_every_chunk_holds_the_values_the_single_pass_expands_to():
    rng = random.Random(3)
    count = 700
    plan = Plan.of(count, scrape=1.0, evaluation=10.0, overlap=60.0, own=150)
    assert len(plan.windows) >= 4
    # Series stepping by 0.1 (whose sums drift from the values given), constants, gaps.
    sequences = {}
    for i in range(30):
        values: list[float | None] = []
        v = rng.choice([0.0, 0.3, 1e6])
        for k in range(count):
            kind = rng.random()
            if kind < 0.05:
                values.append(None)
                continue
            if kind < 0.1:
                v = rng.random()
            else:
                v = k * 0.1 if i % 2 else v  # steps of 0.1 give or take a last bit
            values.append(v)
        sequences[f"s{i}"] = values
    single = SeriesStore(count)
    # "m" read 60 s back, "q" by nothing: q's chunks hold it only from their own part.
    metric = {n: "m" if i % 3 else "q" for i, n in enumerate(sequences)}
    chunked = ChunkedStore(plan, count, {"m": 60.0}, budget=256)  # spilling all the time
    for store in (single, chunked):
        ids = {n: store.id_of(metric[n], {"n": n}) for n in sequences}
        for k in range(count):
            for n, values in sequences.items():
                if values[k] is not None:
                    store.put(ids[n], k, values[k])
    whole = {text: _expand(values) for text, values in single.items()}
    assert len(whole) == len(sequences)
    # The single pass's expansion drifts from the values given (0.1 added again and
    # again): the chunks must keep that drift, not the values.
    assert any(_expand(encode(v)) != v for v in sequences.values())
    for c, w in enumerate(plan.windows):
        got = dict(chunked.window_items(c))
        for text, values in whole.items():
            held = w.lo if text.startswith("m") else w.own_lo if c else 0
            want = [None] * (held - w.lo) + values[held : w.hi + 1]
            assert _expand(got.get(text, f"_x{len(want)}")) == want, (c, text)
    chunked.close()


def test_selectors_read_ranges_offsets_subqueries_and_not_strings():
    assert selectors('rate(x_total{a="[9h]"}[4m10s] offset 45s) / y') == [
        ("x_total", 295.0),
        ("y", LOOKBACK),
    ]
    assert selectors("sum by (node, gpu) (z)") == [("z", LOOKBACK)]
    assert selectors("max_over_time((z > 0)[1m:15s] offset 1m)") == [("z", LOOKBACK + 135.0)]
    assert selectors("x @ start()") == [(None, UNBOUNDED)]
    assert selectors('{__name__=~"x.*"}') == [(None, LOOKBACK)]
    assert selectors("x offset -5m") == [(None, UNBOUNDED)]


def test_a_recording_passes_its_readers_need_on_and_an_alert_adds_its_for():
    groups = [
        {
            "name": "g",
            "rules": [
                {"record": "r", "expr": "rate(x_total[4m])"},
                {"alert": "A", "expr": "r > 1", "for": "10m"},
            ],
        }
    ]
    need = warmups(groups, ["y"], evaluation=60, slack=0)
    # A firing at the first evaluation e after the cut: r > 1 held from e - 10m, i.e.
    # 9 evaluations before the cut; r written at every evaluation (stale-marked when a
    # series ends), by the rule before A: found at t itself; r at t reads x over 4m.
    assert need["r"] == 540
    assert (
        warmups(groups[:0] + [{**groups[0], "rules": groups[0]["rules"][::-1]}], [], 60, 0)["r"]
        == 540 + 60
    )  # written after A: found one evaluation back
    assert need["x_total"] == need["r"] + 240
    assert need["y"] == LOOKBACK


def test_time_is_the_jobs_clock_in_every_chunk():
    assert shifted("time() - start", 3600) == "(time() + 3600) - start"
    assert shifted('x{a="time()"}', 60) == 'x{a="time()"}'
    assert shifted("time()", 0) == "time()"


def _job(out: str, duration: float, hosts: dict) -> None:
    write_system(out, start=START, duration=duration, interval=0.5, hosts=hosts)


def _as_text(result) -> str:
    return json.dumps(result.as_json())


# The 2.5 h job's replays, in one pass and in chunks (about 20 CPU-seconds together). The
# quick tier keeps the planning tests here and test_trial_bounds' chunked trial replay.
LONG_JOB = pytest.mark.slow(reason="replays a 2.5 h two-node job five times")


@pytest.fixture(scope="module")
def long_job(tmp_path_factory):
    """2.5 h, two nodes: algo-1's GPUs idle from 4060 s to 5400 s, algo-2's from 5900 s
    on. In chunks of 38 min (CHUNK, from 2280 s, 4560 s, 6840 s), algo-1's alert is
    pending across 4560 s and fires after it, algo-2's fires in the warm-up of the chunk
    from 6840 s."""
    out = str(tmp_path_factory.mktemp("long") / "job")
    _job(
        out,
        9000,
        {
            "algo-1": {
                "cores": 4,
                "gpus": 2,
                "timeline": [
                    {"gpu_util": 0.9, "cpu": 0.4},
                    {"from": 4060, "gpu_util": 0.05},
                    {"from": 5400, "gpu_util": 0.9},
                ],
            },
            "algo-2": {
                "cores": 4,
                "gpus": 2,
                "timeline": [{"gpu_util": 0.9, "cpu": 0.4}, {"from": 5900, "gpu_util": 0.05}],
            },
        },
    )
    return out


@pytest.fixture(scope="module")
def long_job_runs(long_job, promtool):
    single = replay(long_job, None, scrape_interval=15, chunk_instants=ONE_PASS)
    chunked = replay(long_job, None, scrape_interval=15, chunk_instants=CHUNK)
    return single, chunked


@LONG_JOB
def test_chunked_replay_is_the_single_pass_byte_for_byte(long_job_runs):
    single, chunked = long_job_runs
    assert single.chunks == 1 and chunked.chunks >= 3, chunked.one_pass
    assert _as_text(chunked) == _as_text(single)
    assert [(a.labels, a.fired_at) for a in chunked.health] == [
        (a.labels, a.fired_at) for a in single.health
    ]
    found = chunked.rules["LowGPUUtilization"].affected
    assert {u.labels["node"] for u in found} == {"algo-1", "algo-2"}


@LONG_JOB
def test_alerts_straddle_chunk_boundaries_and_fire_in_the_warm_up(long_job_runs):
    """What makes the identity above mean something: an alert pending across a chunk's
    start and firing after it, and one firing inside the next chunk's warm-up."""
    _, chunked = long_job_runs
    starts, warm = chunked.chunk_starts[1:], chunked.warmup
    assert starts == (2280, 4560, 6840), "the rules' warm-up outgrew CHUNK: lengthen it"
    hold = 500  # LowGPUUtilization's for: 8m20s
    at = [a.fired_at - chunked.start for a in chunked.rules["LowGPUUtilization"].alerts]
    assert any(s < t <= s + hold for t in at for s in starts), (at, starts)
    assert any(s - warm < t < s for t in at for s in starts), (at, starts, warm)


@LONG_JOB
def test_a_job_short_enough_for_one_chunk_takes_one_promtool_run(tmp_path, long_job, long_job_runs):
    out = str(tmp_path / "job")
    _job(out, 2400, {"algo-1": {"cores": 2, "gpus": 1, "timeline": [{"gpu_util": 0.05}]}})
    result = replay(out, None, scrape_interval=15)
    assert result.chunks == 1 and result.one_pass == "short enough for one chunk"
    # The 2.5 h job: one chunk by default (at 15 s, up to 8 warm-ups: 4 h 16 min), two of
    # 300 scrapes (the last 25 % longer rather than a third).
    assert replay(long_job, None, scrape_interval=15).chunks == 1
    two = replay(long_job, None, scrape_interval=15, chunk_instants=300)
    assert two.chunks == 2 and _as_text(two) == _as_text(long_job_runs[0])


def test_rules_reading_since_the_job_started_fall_back_to_one_pass(tmp_path, promtool):
    """dcgm-exporter and node_exporter's bottleneck rules count since the job started
    (2h30m at a 1 s scrape, 37.5 h at 15 s): no warm-up shorter than the job reproduces
    them, so the job goes through promtool in one run, with the same output."""
    out = str(tmp_path / "job")
    _job(
        out,
        2400,
        {"algo-1": {"cores": 2, "gpus": 1, "timeline": [{"gpu_util": 0.9}]}},
    )
    kw = dict(scrape_interval=15, sources=("dcgm", "node_exporter"))
    small = replay(out, None, chunk_instants=1, **kw)
    assert small.chunks == 1 and "the rules read" in small.one_pass, small.one_pass
    assert "more than the job" in small.one_pass
    assert _as_text(small) == _as_text(replay(out, None, chunk_instants=ONE_PASS, **kw))


def test_the_chunked_store_bounds_each_window():
    plan = Plan.of(count=10_001, scrape=1.0, evaluation=60.0, overlap=600.0, own=1200)
    sizes = {w.hi - w.lo for w in plan.windows}
    assert max(sizes) <= 1.25 * 1200 + 600  # a chunk's own part and its warm-up, at most
    assert plan.windows[-1].hi == 10_000
    assert math.isclose(plan.overlap, 600)


# Rules whose state reaches back: a recording over a range, alerts with `for:` on it and
# on the raw series and on a subquery; a query reading the recording.
GROUPS = [
    {
        "name": "g",
        "interval": "15s",
        "rules": [
            {"record": "r", "expr": "avg_over_time(x[1m])"},
            {"alert": "A", "expr": "r > 0.5", "for": "1m"},
            {"alert": "B", "expr": "min_over_time(x[30s]) > 0.8", "for": "45s"},
            {
                "alert": "C",
                "expr": "max_over_time((max_over_time(x[15s]) > 0.9)[1m:15s]) > 0",
                "for": "30s",
            },
        ],
    }
]


def _flips(rng: random.Random, count: int) -> list[float | None]:
    """A series that holds values a few scrapes at a time, with gaps of up to 6 min
    (past Prometheus' 5 min lookback)."""
    out: list[float | None] = []
    while len(out) < count:
        if rng.random() < 0.15:
            out += [None] * rng.randint(1, 24)
        else:
            out += [rng.random()] * rng.randint(1, 9)
    return out[:count]


def _chunked_firing(sequences, count, cut, tmp_path):
    """Firing alerts from run_chunked, with the derived warm-up less `cut` seconds."""
    asked = ["sum(r)", 'count(ALERTS{alertname="A"})']
    queries = {f"q{i}": (q, [t * 15.0 for t in range(1, count, 7)]) for i, q in enumerate(asked)}
    need = warmups(GROUPS, asked, evaluation=15.0, slack=0.0)
    need = {k: max(0.0, v - cut) for k, v in need.items()}
    plan = Plan.of(count, 15.0, 15.0, max(need.values()), own=12)
    store = ChunkedStore(plan, count, need)
    single = SeriesStore(count)
    for s in (store, single):
        ids = {n: s.id_of("x", {"n": n}) for n in sequences}
        for k in range(count):
            for n, values in sequences.items():
                if values[k] is not None:
                    s.put(ids[n], k, values[k])
    one = run_rules(GROUPS, single, 15.0, 15.0, (count - 1) * 15.0, tmp_path, queries=queries)
    many = run_chunked(store, GROUPS, 15.0, 15.0, tmp_path, None, queries, ordered=False)
    return len(plan.windows), one, many


def _edges(firing):
    return sorted((t, tuple(sorted(lb.items()))) for t, labels in firing.items() for lb in labels)


@pytest.mark.slow(reason="over 40 chunks, each a promtool run, twice, and the one pass")
def test_chunks_reproduce_promtool_exactly_and_one_evaluation_less_warm_up_does_not(
    tmp_path, promtool
):
    rng = random.Random(11)
    count = 1200
    sequences = {f"s{i}": _flips(rng, count) for i in range(4)}
    chunks, one, many = _chunked_firing(sequences, count, 0.0, tmp_path)
    assert chunks > 40
    assert _edges(many.firing) == _edges(one.firing)
    assert len({lb for _, lb in _edges(one.firing)}) >= 6  # the alerts do fire
    # Query values agree to the last bits promtool's sum over the recording's series
    # leaves to the order those series were first written in (see chunks' docstring).
    assert many.queries.keys() == one.queries.keys()
    for name, by_time in one.queries.items():
        assert many.queries[name].keys() == by_time.keys()
        for t, samples in by_time.items():
            got = many.queries[name][t]
            assert [lb for lb, _ in got] == [lb for lb, _ in samples]
            for (_, a), (_, b) in zip(got, samples):
                assert math.isclose(a, b, rel_tol=1e-12), (name, t, a, b)
    # The warm-up derived is the shortest exact one: one evaluation less and a chunk
    # starts an alert's `for:` (or a range) too late somewhere in this job.
    _, one, short = _chunked_firing(sequences, count, 15.0, tmp_path)
    assert _edges(short.firing) != _edges(one.firing)


def _rows_sequences(rng: random.Random, count: int, n: int) -> list[list[float]]:
    """Series for a RowWriter: constants, counters stepping by 0.1 or 2, noisy gauges, runs
    that change step, every kind switching now and then."""
    rows = [[0.0] * n for _ in range(count)]
    for i in range(n):
        v, step = rng.choice([0.0, 0.3, 1e6]), rng.choice([0.1, 2.0, -0.25, 0.0])
        for k in range(count):
            kind = rng.random() if i % 5 else 1.0  # every fifth: a counter all along
            if i % 7 == 0 or kind < 0.03:
                v = rng.random()  # a noisy gauge, or a jump
            elif kind < 0.04:
                step = rng.choice([0.0, 0.1, 3.0])
            else:
                v += step
            rows[k][i] = v
    return rows


def test_a_row_writer_puts_what_put_puts_in_one_pass_and_in_chunks():
    rng = random.Random(7)
    count, n = 700, 40
    rows = _rows_sequences(rng, count, n)
    skipped = {300, 301, 302}  # the target was down: a gap in every series
    plan = Plan.of(count, scrape=1.0, evaluation=10.0, overlap=60.0, own=150)
    outputs = []
    for make in (
        lambda: SeriesStore(count, budget=512),
        lambda: ChunkedStore(plan, count, {"m": 60.0}, budget=512),
    ):
        by_put, by_row = make(), make()
        for store, rowwise in ((by_put, False), (by_row, True)):
            ids = [store.id_of("m" if i % 3 else "q", {"i": str(i)}) for i in range(n)]
            writer = store.writer(ids) if rowwise else None
            for k in range(count):
                if k in skipped:
                    continue
                if k == 500 and rowwise:  # the target's series change: a new writer
                    writer = store.writer(ids, writer)
                if writer is not None:
                    writer.put(k, list(rows[k]))
                else:
                    for series, value in zip(ids, rows[k]):
                        store.put(series, k, value)
        if isinstance(by_put, ChunkedStore):
            got = [list(by_row.window_items(c)) for c in range(len(plan.windows))]
            want = [list(by_put.window_items(c)) for c in range(len(plan.windows))]
        else:
            got, want = list(by_row.items()), list(by_put.items())
        by_put.close()
        by_row.close()
        assert got == want
        outputs.append(got)
    assert all(outputs)
