"""Replay of a long job in time chunks, so promtool's memory is bounded by the series count.

promtool's unit-test engine holds every sample it is given: a 4 h job scraped every second
took 879 MB. Here the job is cut into chunks of `CHUNK_INSTANTS` scrapes, each evaluated
by its own promtool run over its own part plus a warm-up before it long enough that every
rule's state at the part's start is the one a single pass has (trainprof.replay.reach
derives each input metric's warm-up from the compiled PromQL). A chunk answers only for its
own part: the firing alerts and query results there are stitched into what one promtool
run over the whole job reports, value for value.

    >>> plan = Plan.of(count=1001, scrape=1.0, evaluation=60.0, overlap=300.0, own=300)
    >>> [(w.lo, w.own_lo, w.hi) for w in plan.windows]
    [(0, 0, 360), (60, 360, 720), (420, 720, 1000)]

Each chunk's clock starts at its warm-up's start (promtool's starts at 0), so `time()` in
its rules and queries reads `(time() + W)`, W its start in the job: integer seconds, exact.
The samples promtool sees are the ones the single pass's input expands to (its `a+bxn`
runs add b again and again), so a chunk begins a run where the single pass is mid-run with
the very value promtool would have reached there.

What a chunk cannot reproduce is the order promtool first wrote a recording's series in,
which decides the order `sum` adds them in: a query summing recorded series may differ
from the single pass in its last bits (1e-16 relative); verdicts, firing times and the
rounded measures replay reports are the same (tests/test_replay_chunks.py). A job whose
rules read back further than a chunk (the adapter sources' "since the job started"
bottleneck share, 2h30m at a 1 s scrape and 37.5 h at 15 s; their datapoint count over
the whole job) is evaluated in one pass, as before: `ReplayResult.one_pass` says why.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import itertools
import math
import re
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from trainprof.engines.promtool import RuleRun, run_rules
from trainprof.replay import reach
from trainprof.replay.series_store import STALE, TOKEN_OVERHEAD, SeriesStore, _num, _Run

# Memory a chunked store's encoded text may take before it moves to the spill file, each
# token counted with its object overhead (series_store.TOKEN_OVERHEAD).
BUDGET = 8 * 1024 * 1024
# Scrape instants a chunk answers for (at most STRETCH times; its warm-up comes on top):
# 2 h at a 1 s scrape. Shorter chunks bound promtool lower but evaluate the warm-ups more often: at
# 3600, a 4 h job at 1 s took 8 % more CPU than in one pass; at 7200, none more.
CHUNK_INSTANTS = 7200
# A chunk's own part is at least its warm-up (an instant is in at most two chunks' input)
# and, up to CHUNK_INSTANTS, this many times it: at a slow scrape (15 s) the warm-up is
# few scrapes, so chunks are shorter than CHUNK_INSTANTS and promtool's memory stays near
# its floor, while the warm-ups, evaluated twice, add an eighth at most to its work.
OWN_PER_OVERLAP = 8
# Chunks may run this much longer than their length rather than add one more.
STRETCH = 1.25


@dataclasses.dataclass(frozen=True)
class Window:
    """Scrape instants lo..hi of one chunk, answering for own_lo < k <= hi (k >= 0 for the
    first)."""

    lo: int
    own_lo: int
    hi: int


@dataclasses.dataclass(frozen=True)
class Plan:
    windows: tuple[Window, ...]
    own: int  # instants each chunk answers for (the last: up to as many)
    overlap: int  # instants of warm-up
    scrape: float

    @classmethod
    def of(
        cls,
        count: int,
        scrape: float,
        evaluation: float,
        overlap: float,
        own: int,
        per_overlap: int = OWN_PER_OVERLAP,
    ) -> Plan:
        """Windows over instants 0..count-1, each own part `own` instants (a multiple of
        the evaluation; at most `per_overlap` warm-ups) and a warm-up of `overlap` seconds
        rounded up to evaluations."""
        per_eval = max(1, round(evaluation / scrape))
        warm = math.ceil(overlap / evaluation - 1e-9) * per_eval
        own = max(warm, min(own, per_overlap * warm), per_eval)
        last = count - 1
        # As many chunks as that takes, all of a length (on the evaluation grid).
        pieces = max(1, math.ceil(last / (own * STRETCH)))
        own = math.ceil(last / pieces / per_eval) * per_eval
        windows = []
        for own_lo in range(0, last, own):
            windows.append(Window(max(0, own_lo - warm), own_lo, min(own_lo + own, last)))
        if not windows:
            windows.append(Window(0, 0, last))
        return cls(tuple(windows), own, warm, scrape)


def plan(
    groups: Sequence[Mapping],
    queries: Mapping[str, tuple[str, Sequence[float]]],
    count: int,
    scrape: float,
    evaluation: float,
    chunk_instants: int = CHUNK_INSTANTS,
    per_overlap: int = OWN_PER_OVERLAP,
) -> tuple[Plan | None, dict[str | None, float], str]:
    """The chunks to replay `count` instants in (None: one pass, as before), each input
    metric's warm-up, and why one pass when it is. `chunk_instants` 0: one pass;
    `per_overlap`: a chunk's own part is at most that many warm-ups."""
    if chunk_instants <= 0:
        return None, {}, "chunks turned off"
    exprs = [r["expr"] for g in groups for r in g["rules"]] + [e for e, _ in queries.values()]
    if count - 1 <= 2 * OWN_PER_OVERLAP:
        return None, {}, "short enough for one chunk"
    if not (_whole(scrape) and _whole(evaluation)) or evaluation % scrape:
        return None, {}, "scrape or evaluation interval not whole seconds apart"
    if any(_TIMESTAMP.search(e) for e in exprs):
        return None, {}, "an expression reads timestamp()"
    steps = reach.subquery_steps(exprs)
    if any(not _whole(s) or evaluation % s for s in steps):
        return None, {}, "a subquery step the evaluation grid does not keep"
    need = reach.warmups(groups, [e for e, _ in queries.values()], evaluation, 0.0)
    overlap = max(need.values(), default=0.0)
    if not math.isfinite(overlap):
        return None, need, "an expression reads further back than replay can bound"
    chunked = Plan.of(count, scrape, evaluation, overlap, chunk_instants, per_overlap)
    if len(chunked.windows) < 2:
        if overlap < (count - 1) * scrape:
            return None, need, "short enough for one chunk"
        return None, need, f"the rules read {overlap:g}s back: more than the job"
    return chunked, need, ""


_TIMESTAMP = re.compile(r"\btimestamp\s*\(")
_TIME = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|\btime\(\s*\)')


def _whole(seconds: float) -> bool:
    return float(seconds).is_integer() and seconds > 0


def shifted(expr: str, start: float) -> str:
    """`expr` with `time()` as the job's clock when promtool's starts `start` s into it.

    >>> shifted('time() - x{a="time()"}', 600)
    '(time() + 600) - x{a="time()"}'
    """
    if not start:
        return expr
    return _TIME.sub(
        lambda m: m.group(0) if m.group(0)[0] in "\"'" else f"(time() + {_num(start)})", expr
    )


class _Window:
    """A series' text in one chunk: its tokens (and spilled pieces), and the chunk's next
    instant (numbered from the chunk's start) they reach."""

    __slots__ = ("tokens", "chunks", "next")

    def __init__(self) -> None:
        self.tokens: list[str] = []
        self.chunks = array("q")  # (offset, length) of each spilled piece, flat
        self.next = 0


def _token(start: float, step: float | None, n: int) -> str:
    if n == 0 or step is None:
        return _num(start)
    if step == 0:
        return f"{_num(start)}x{n}"
    return f"{_num(start)}{'+' if step >= 0 else '-'}{_num(abs(step))}x{n}"


class _ChunkRun(_Run):
    """SeriesStore's run of one series, with the value promtool's expansion of it has
    reached (`acc`) and the next instant it is cut at (`cut`)."""

    __slots__ = ("acc", "cut")

    def __init__(self, cut: int) -> None:
        super().__init__()
        self.acc = 0.0
        self.cut = cut


class ChunkedStore(SeriesStore):
    """A SeriesStore that gives each chunk its own series text: `window_items(c)` is chunk
    c's input for promtool, instants numbered from its window's start.

    It runs the single pass's encoding (SeriesStore.put) and cuts its runs where a chunk
    starts or ends, a cut run going on from the value promtool's expansion has reached
    there; each piece goes to every chunk holding its instants (a series from its metric's
    warm-up on). Memory: the open run per series plus the text up to the spill budget."""

    def __init__(
        self,
        plan: Plan,
        count: int,
        need: Mapping[str | None, float],
        spill_dir: str | None = None,
        budget: int = BUDGET,
    ):
        super().__init__(count, spill_dir=spill_dir, budget=budget)
        self.plan = plan
        self._need = need
        self._schedule: list[tuple[list[int], list[tuple[int, ...]]]] = []
        self._schedules: dict[int, tuple[list[int], list[tuple[int, ...]]]] = {}
        self._windows: list[list[_Window | None]] = []
        self._closed = False

    def _schedule_for(self, back: int) -> tuple[list[int], list[tuple[int, ...]]]:
        """(cut instants, the chunks holding each piece between them) of a series whose
        metric needs `back` instants of warm-up."""
        found = self._schedules.get(back)
        if found is None:
            windows = self.plan.windows
            held = [0] + [max(w.lo, w.own_lo - back) for w in windows[1:]]
            cuts = sorted({h for h in held[1:]} | {w.hi + 1 for w in windows[:-1]} - {0})
            pieces = []
            for start in [0, *cuts]:
                pieces.append(tuple(c for c, w in enumerate(windows) if held[c] <= start <= w.hi))
            found = self._schedules[back] = (cuts, pieces)
        return found

    def id_of(self, name: str, labels: dict[str, str]) -> int:
        # SeriesStore.id_of's lookup, not a call to it: this runs once per value scraped.
        found = self._ids.get((name, tuple(labels.items())))
        if found is None:
            found = self._new_series(name, labels)
        return found

    def _new_series(self, name: str, labels: dict[str, str]) -> int:
        found = super().id_of(name, labels)
        if found == len(self._schedule):
            back = max(self._need.get(name, 0.0), self._need.get(None, 0.0))
            schedule = self._schedule_for(math.ceil(back / self.plan.scrape - 1e-9))
            self._schedule.append(schedule)
            self._runs[found] = _ChunkRun(schedule[0][0] if schedule[0] else self.count)
            self._windows.append([None] * len(self.plan.windows))
        return found

    def put(self, series: int, k: int, value: float) -> None:
        run: _ChunkRun = self._runs[series]  # type: ignore[assignment]
        following = run.next
        if k < following:
            raise ValueError(f"instant {k} of {self._texts[series]} after {following - 1}")
        # SeriesStore.put's runs, and the value promtool's expansion of them reaches.
        if run.start is not None:
            if k > following:
                self._emit(series, run, following - 1)
            else:
                d = value - run.last
                if not math.isfinite(d):  # promtool expands no runs of NaN or Inf
                    self._emit(series, run, following - 1)
                elif run.step is None:
                    run.step, run.n = d, 1
                    run.acc += d
                elif d == run.step:
                    run.n += 1
                    run.acc += d
                else:
                    self._emit(series, run, following - 1)
        if run.start is None:
            run.start, run.step, run.n, run.acc = value, None, 0, value
        run.last = value
        run.next = k + 1
        if k >= run.cut:
            self._cut_at(series, run, k)

    def _catch_up(self, run: _Run, instants: int, last: float, following: int) -> None:
        # promtool's expansion adds the step again and again: so does `acc`, at C speed.
        chunk_run: _ChunkRun = run  # type: ignore[assignment]
        step: float = run.step  # type: ignore[assignment]  # a run going on has its step
        added = itertools.accumulate(itertools.repeat(step, instants), initial=chunk_run.acc)
        chunk_run.acc = collections.deque(added, maxlen=1)[0]
        super()._catch_up(run, instants, last, following)

    def _cut(self, run: _Run) -> int | float:
        return run.cut  # type: ignore[attr-defined]

    def _cut_at(self, series: int, run: _ChunkRun, k: int) -> None:
        if run.n:
            # The run so far, up to k - 1; it goes on from promtool's value at k.
            run.n -= 1
            self._emit(series, run, k - 1)
            run.start, run.n = run.acc, 0
        cuts = self._schedule[series][0]
        run.cut = next((c for c in cuts if c > k), self.count)

    def stale(self, series: int, k: int) -> None:
        run: _ChunkRun = self._runs[series]  # type: ignore[assignment]
        if k < run.next:
            raise ValueError(f"instant {k} of {self._texts[series]} after {run.next - 1}")
        if run.start is not None:
            self._emit(series, run, run.next - 1)
        self._place(series, STALE, k, k)
        run.next = k + 1
        if k >= run.cut:
            cuts = self._schedule[series][0]
            run.cut = next((c for c in cuts if c > k), self.count)

    def _emit(self, series: int, run: _Run, last: int) -> None:
        """Close the open run, which ends at instant `last`, into the chunks holding it."""
        assert run.start is not None
        token = _token(run.start, run.step, run.n)
        first = last - run.n
        run.start = None
        self._place(series, token, first, last)

    def _place(self, series: int, token: str, first: int, last: int) -> None:
        """`token`, covering instants `first` to `last`, into the chunks holding them."""
        cuts, pieces = self._schedule[series]
        windows = self._windows[series]
        plan = self.plan.windows
        for c in pieces[bisect.bisect_right(cuts, first)]:
            window = windows[c]
            if window is None:
                window = windows[c] = _Window()
            lo = plan[c].lo
            missing = first - lo - window.next
            if missing > 0:
                gap = "_" if missing == 1 else f"_x{missing}"
                window.tokens.append(gap)
                self._bytes += len(gap) + 1 + TOKEN_OVERHEAD
            window.tokens.append(token)
            window.next = last - lo + 1
            self._bytes += len(token) + 1 + TOKEN_OVERHEAD
        if self._bytes > self._budget:
            self._spill_windows()

    def _spill_windows(self) -> None:
        for windows in self._windows:
            for window in windows:
                if window is not None:
                    self._spill_tokens(window)
        self._bytes = 0

    def window_items(self, c: int) -> Iterator[tuple[str, str]]:
        """Chunk c's series (those with a value in it) in promtool's notation."""
        self.sync()
        if not self._closed:
            for series, run in enumerate(self._runs):
                if run.start is not None:
                    self._emit(series, run, run.next - 1)
            self._closed = True
        w = self.plan.windows[c]
        count = w.hi - w.lo + 1
        for text, windows in zip(self._texts, self._windows):
            window = windows[c]
            if window is None:
                continue
            if window.next < count:
                missing = count - window.next
                window.tokens.append("_" if missing == 1 else f"_x{missing}")
            yield text, self._text_of(window)
            windows[c] = None  # the chunk is done with: its text goes


class _Items:
    def __init__(self, store: ChunkedStore, c: int):
        self.store, self.c = store, c

    def items(self) -> Iterator[tuple[str, str]]:
        return self.store.window_items(self.c)


def run_chunked(
    store: ChunkedStore,
    groups: list[dict],
    scrape: float,
    evaluation: float,
    workdir: Path,
    promtool: str | None,
    queries: Mapping[str, tuple[str, Sequence[float]]],
    ordered: bool,
    active: bool = False,
    each: Callable[[RuleRun], None] | None = None,
) -> RuleRun:
    """What `run_rules` over the whole job reports, from one promtool run per chunk; with
    `each`, each chunk's part (in the job's time, in time order) is handed to it instead of
    kept, and what is returned is empty."""
    plan = store.plan
    firing: dict[float, list[dict[str, str]]] = {}
    answers: dict[str, dict[float, list]] = {}
    last = len(plan.windows) - 1
    for c, w in enumerate(plan.windows):
        start = w.lo * scrape
        own_from = w.own_lo * scrape if c else -1.0
        own_to = w.hi * scrape if c < last else math.inf
        local_queries = {}
        for name, (expr, times) in queries.items():
            mine = [t - start for t in times if own_from < t <= own_to + 1e-9]
            if mine:
                local_queries[name] = (shifted(expr, start), mine)
        local_groups = [
            {**g, "rules": [{**r, "expr": shifted(r["expr"], start)} for r in g["rules"]]}
            for g in groups
        ]
        run = run_rules(
            local_groups,
            _Items(store, c),
            scrape,
            evaluation,
            (w.hi - w.lo) * scrape,
            workdir,
            promtool,
            queries=local_queries,
            ordered=ordered,
            alerts_from=None if c == 0 else max(own_from - start, 0.0) + evaluation,
            active=active,
        )
        own_firing = {t + start: alerts for t, alerts in run.firing.items()}
        own_answers = {
            name: {t + start: samples for t, samples in by_time.items()}
            for name, by_time in run.queries.items()
        }
        if each is not None:
            each(RuleRun(own_firing, own_answers))
            continue
        firing.update(own_firing)
        for name, by_time in own_answers.items():
            answers.setdefault(name, {}).update(by_time)
    return RuleRun(firing, answers)
