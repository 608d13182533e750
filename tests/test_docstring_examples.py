"""Every `>>>` example in src/trainprof runs, and shows what it really prints.

The modules are found by reading the source, so a new module's examples run without being
listed here. Examples run from the repository root, so one may read the real data as
`tests/data/...` (that module's test needs the `real_data` fixture) or replay it through promtool
(`replay(` in an example: the test needs the `promtool` fixture, and so its tier).
"""

from __future__ import annotations

import doctest
import importlib
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PROMPT = re.compile(r"^\s*>>> (.*)$", re.MULTILINE)


def examples() -> dict[str, list[str]]:
    """Dotted module name -> the source lines of its examples, for every module with one."""
    found = {}
    for path in sorted((SRC / "trainprof").rglob("*.py")):
        lines = PROMPT.findall(path.read_text(encoding="utf-8"))
        if lines:
            parts = list(path.relative_to(SRC).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = lines
    return found


# Examples marked `# doctest: +SKIP`, and why they cannot run here.
NOT_RUN: dict[str, str] = {}
EXAMPLES = {m: lines for m, lines in examples().items() if m not in NOT_RUN}
REAL_DATA = sorted(m for m, lines in EXAMPLES.items() if any("tests/data/" in x for x in lines))
PROMTOOL = sorted(
    m for m in REAL_DATA if any(re.search(r"\breplay(_trial)?\(", x) for x in EXAMPLES[m])
)
PLAIN = sorted(m for m in EXAMPLES if m not in REAL_DATA)
REAL_DATA = [m for m in REAL_DATA if m not in PROMTOOL]


def run_examples(name: str) -> None:
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner()
    report: list[str] = []
    for test in doctest.DocTestFinder().find(module, name):
        runner.run(test, out=report.append)
    result = runner.summarize(verbose=False)
    # A prompt doctest cannot find (in a comment, or a string that is not a docstring) is an
    # example that silently never runs.
    assert result.attempted, f"{name} shows `>>>` examples but doctest finds none to run"
    assert result.failed == 0, "".join(report)


@pytest.mark.parametrize("name", PLAIN)
def test_examples(name, monkeypatch, root):
    monkeypatch.chdir(root)
    run_examples(name)


@pytest.mark.parametrize("name", REAL_DATA)
def test_examples_on_the_real_data(name, monkeypatch, root, real_data):
    monkeypatch.chdir(root)
    run_examples(name)


@pytest.mark.parametrize("name", PROMTOOL)
def test_examples_through_promtool(name, monkeypatch, root, real_data, promtool):
    monkeypatch.chdir(root)
    run_examples(name)


def test_every_module_with_examples_is_found():
    # The modules whose examples the suite ran before this test existed, by hand.
    assert {
        "trainprof.sources",
        "trainprof.replay.exporters",
        "trainprof.training.state",
        "trainprof.exporter.sources.dcgm_exporter",
    } <= set(EXAMPLES)
    assert len(EXAMPLES) + len(NOT_RUN) == len(examples()) >= 50
