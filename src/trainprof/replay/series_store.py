"""Scraped series, encoded for promtool as they are scraped, in memory bounded by the
number of series.

Replay reads every series at every scrape instant. Holding a list per series as long as
the job (what it did before) made memory and time grow with the job's length times its
series. Here each value goes straight into its series' run in promtool's expanding notation
(`1+0.5x20`, `7x12`, `_x3`), so a counter rising evenly or a gauge holding still costs one
token however long it lasts; what is encoded spills to a temporary file past a budget.

    >>> store = SeriesStore(count=5)
    >>> s = store.id_of("up", {"job": "a"})
    >>> for k in (1, 2, 3):
    ...     store.put(s, k, 1.0)
    >>> list(store.items())
    [('up{job="a"}', '_ 1x2 _')]

A series that ended (its process gone) gets a staleness marker, as Prometheus writes one:

    >>> store = SeriesStore(count=5)
    >>> s = store.id_of("up", {"job": "b"})
    >>> store.put(s, 0, 1.0)
    >>> store.put(s, 1, 1.0)
    >>> store.stale(s, 2)
    >>> list(store.items())
    [('up{job="b"}', '1x1 stale _x2')]
"""

from __future__ import annotations

import itertools
import math
import operator
import tempfile
from array import array
from collections.abc import Iterator, Sequence
from typing import IO, Protocol

from trainprof.engines.promtool import series_text

# Memory the encoded text may take before it moves to the spill file.
BUDGET = 32 * 1024 * 1024
# promtool's notation for a staleness marker.
STALE = "stale"
# What a token costs beyond its characters: the str object's header and its slot in the
# list. Counting characters alone let 8 MB of budget hold ~50 MB of tokens at a 1 s scrape.
TOKEN_OVERHEAD = 57


def _num(v: float) -> str:
    """A value as promtool reads it (a tensor's reductions may be NaN or infinite).

    >>> _num(2.0), _num(0.25), _num(float("nan")), _num(float("-inf"))
    ('2', '0.25', 'NaN', '-Inf')
    """
    if not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("Inf" if v > 0 else "-Inf")
    return repr(float(v)) if v != int(v) else str(int(v))


class Tokens(Protocol):
    """Encoded text held for one series: tokens in memory, and pieces already spilled."""

    tokens: list[str]
    # (offset, length) of each spilled piece, flat: one per series and spill, so a long job
    # adds many; 16 bytes each here against ~120 as a list of tuples.
    chunks: array


class _Run:
    """One series' encoder: the open run of values with a constant step, and its tokens."""

    __slots__ = ("next", "start", "last", "step", "n", "tokens", "chunks")

    def __init__(self) -> None:
        self.next = 0  # the next instant expected
        self.start: float | None = None  # the open run's first value
        self.last = 0.0
        self.step: float | None = None
        self.n = 0  # steps taken in the open run
        self.tokens: list[str] = []
        self.chunks = array("q")  # (offset, length) in the spill file, flat

    def close(self) -> int:
        """End the open run; the bytes its token adds."""
        if self.start is None:
            return 0
        v, n, step = self.start, self.n, self.step
        if n == 0 or step is None:
            token = _num(v)
        elif step == 0:
            token = f"{_num(v)}x{n}"
        else:
            token = f"{_num(v)}{'+' if step >= 0 else '-'}{_num(abs(step))}x{n}"
        self.tokens.append(token)
        self.start, self.step, self.n = None, None, 0
        return len(token) + 1 + TOKEN_OVERHEAD

    def gap(self, missing: int) -> int:
        added = self.close()
        token = "_" if missing == 1 else f"_x{missing}"
        self.tokens.append(token)
        return added + len(token) + 1 + TOKEN_OVERHEAD


class SeriesStore:
    """Series by id, each holding `count` instants; values must arrive in instant order."""

    def __init__(self, count: int, budget: int = BUDGET, spill_dir: str | None = None):
        self.count = count
        self._ids: dict[tuple, int] = {}
        self._by_text: dict[str, int] = {}
        self._texts: list[str] = []
        self._runs: list[_Run] = []
        self._bytes = 0
        self._budget = budget
        self._spill_dir = spill_dir
        self._spill: IO[bytes] | None = None
        self._writers: list[RowWriter] = []

    def __len__(self) -> int:
        return len(self._texts)

    def id_of(self, name: str, labels: dict[str, str]) -> int:
        key = (name, tuple(labels.items()))
        found = self._ids.get(key)
        if found is None:
            text = series_text(name, labels)
            found = self._by_text.get(text)
            if found is None:
                found = self._by_text[text] = len(self._texts)
                self._texts.append(text)
                self._runs.append(_Run())
            self._ids[key] = found
        return found

    def put(self, series: int, k: int, value: float) -> None:
        """The value of `series` at instant `k`."""
        run = self._runs[series]
        if k < run.next:
            raise ValueError(f"instant {k} of {self._texts[series]} after {run.next - 1}")
        if k > run.next:
            self._bytes += run.gap(k - run.next)
        run.next = k + 1
        if run.start is None:
            run.start, run.last = value, value
            return
        d = value - run.last
        if not math.isfinite(d):  # promtool expands no runs of NaN or Inf
            self._bytes += run.close()
            run.start = value
        elif run.step is None:
            run.step, run.n = d, 1
        elif d == run.step:
            run.n += 1
        else:
            self._bytes += run.close()
            run.start = value
        run.last = value
        if self._bytes > self._budget:
            self._spill_all()

    def stale(self, series: int, k: int) -> None:
        """A staleness marker for `series` at instant `k`: it ended there, as Prometheus
        marks the series of a target that went away (an ended training process)."""
        run = self._runs[series]
        if k < run.next:
            raise ValueError(f"instant {k} of {self._texts[series]} after {run.next - 1}")
        self._bytes += run.gap(k - run.next) if k > run.next else run.close()
        run.tokens.append(STALE)
        self._bytes += len(STALE) + 1 + TOKEN_OVERHEAD
        run.next = k + 1

    def writer(self, ids: Sequence[int], replacing: RowWriter | None = None) -> RowWriter:
        """A `RowWriter` of series `ids` (one per scraped target), `replacing` the target's
        previous one (its series change), which is brought up to date first."""
        if replacing is not None:
            replacing.sync()
            self._writers.remove(replacing)
        writer = RowWriter(self, ids)
        self._writers.append(writer)
        return writer

    def sync(self) -> None:
        """Bring every series the writers hold back up to date, before reading the runs."""
        for writer in self._writers:
            writer.sync()

    def _catch_up(self, run: _Run, instants: int, last: float, following: int) -> None:
        """`run`, which went on with its step for `instants` more instants up to `last`,
        as `put` would have left it; `following`: the next instant expected."""
        run.n += instants
        run.last = last
        run.next = following

    def _cut(self, run: _Run) -> int | float:
        """The next instant at which `run` must see `put` itself (chunked stores cut there)."""
        return float("inf")

    def _spill_all(self) -> None:
        for run in self._runs:
            self._spill_tokens(run)
        self._bytes = 0

    def _spill_tokens(self, held: Tokens) -> None:
        """Move `held`'s tokens to the spill file, remembering where they went."""
        if not held.tokens:
            return
        if self._spill is None:
            self._spill = tempfile.TemporaryFile(mode="w+b", dir=self._spill_dir)
        data = (" ".join(held.tokens) + " ").encode()
        offset = self._spill.seek(0, 2)
        self._spill.write(data)
        held.chunks.extend((offset, len(data)))
        held.tokens = []

    def _text_of(self, held: Tokens) -> str:
        """`held`'s whole text: its spilled pieces, then the tokens still in memory."""
        parts = []
        pieces = held.chunks
        for i in range(0, len(pieces), 2):
            assert self._spill is not None  # pieces exist only once spilled
            self._spill.seek(pieces[i])
            parts.append(self._spill.read(pieces[i + 1]).decode())
        return "".join(parts) + " ".join(held.tokens)

    def items(self) -> Iterator[tuple[str, str]]:
        """(series text, its values in expanding notation), one series at a time."""
        self.sync()
        for text, run in zip(self._texts, self._runs):
            run.close()
            if run.next < self.count:
                run.gap(self.count - run.next)
                run.next = self.count
            yield text, self._text_of(run)

    def close(self) -> None:
        if self._spill is not None:
            self._spill.close()
            self._spill = None


class RowWriter:
    """Puts the values of a fixed list of series at consecutive instants (one target's
    scrape), the same as `SeriesStore.put` of each value, at a fraction of its cost.

    `put` finds, at C speed, the series whose step since the last instant differs from its
    run's (`map` over the row); only those go through `SeriesStore.put`. The others go on
    with their runs without being touched: their runs are brought up to date when they next
    differ, at a chunk's cut, and when the store is read (`SeriesStore.sync`).
    """

    def __init__(self, store: SeriesStore, ids: Sequence[int]):
        self.store = store
        self.ids = list(ids)
        self.k = -2  # the last instant put (-2: none)
        self.prev: list = []  # the values put then
        self.steps: list = []  # each run's step (None: not known yet)
        self.synced: list[int] = []  # the instant each run was last brought up to date
        self.cut: int | float = -1  # the next instant a run must see `put` itself

    def put(self, k: int, values: list) -> None:
        """The values of the series at instant `k`, in the order of `ids`."""
        if len(values) != len(self.ids):
            raise ValueError(f"{len(values)} values for {len(self.ids)} series")
        if k != self.k + 1 or k >= self.cut:
            self._put_each(k, values)
            return
        steps = self.steps
        diffs = list(map(operator.sub, values, self.prev))
        if diffs != steps:
            store, ids, prev, synced = self.store, self.ids, self.prev, self.synced
            runs = store._runs
            for i in itertools.compress(itertools.count(), map(operator.ne, diffs, steps)):
                run = runs[ids[i]]
                behind = k - 1 - synced[i]
                if behind:
                    store._catch_up(run, behind, prev[i], k)
                store.put(ids[i], k, values[i])
                synced[i] = k
                steps[i] = run.step
        self.prev = values
        self.k = k

    def _put_each(self, k: int, values: list) -> None:
        """Every value through `SeriesStore.put` (the first row, after a gap, at a cut)."""
        self.sync()
        store, runs = self.store, self.store._runs
        for series, value in zip(self.ids, values):
            store.put(series, k, value)
        self.prev = values
        self.steps = [runs[series].step for series in self.ids]
        self.synced = [k] * len(self.ids)
        self.k = k
        self.cut = min((store._cut(runs[series]) for series in self.ids), default=float("inf"))

    def close(self) -> None:
        """The target's last row is put: its runs brought up to date, the writer let go (so
        `SeriesStore.stale` and the like may follow)."""
        self.sync()
        if self in self.store._writers:
            self.store._writers.remove(self)

    def sync(self) -> None:
        """Bring every run up to the last instant put."""
        if not self.synced:
            return
        store, runs, k = self.store, self.store._runs, self.k
        for i, series in enumerate(self.ids):
            behind = k - self.synced[i]
            if behind > 0:
                store._catch_up(runs[series], behind, self.prev[i], k + 1)
                self.synced[i] = k
