"""Shared fixtures: the real Prometheus tools, found on PATH, and the test tiers.

A missing tool skips its tests on a laptop, but fails them when TRAINPROF_REQUIRE_TOOLS=1
(which `make test` and CI set), so CI can never go green having run nothing that matters.

Each test is marked from what it uses (`pytest_collection_modifyitems`): the tool fixtures it
asks for, directly or through another fixture (`live_job` brings `prometheus_bin`), and the
training frameworks its module imports. A test that runs a tool, even through trainprof's own
code (`replay` finds promtool on PATH), asks for the tool's fixture, which is also what skips
it where the tool is missing. `make test-fast` deselects the slow tiers by these markers.

A test that is slow by nature without such a fixture (a load test, an interpreter per module,
gigabytes of input, hours of replayed job, seconds of real time) is marked where it is
written, `@pytest.mark.slow(reason=...)`: the reason is required, so the tier says why.
"""

from __future__ import annotations

import inspect
import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import read_audit  # noqa: E402 (found through the line above)

# Every test reads only the repository, the tools it runs on and temporary files.
_READS = read_audit.Plugin(str(ROOT))


def pytest_configure(config):
    _READS.start()


@pytest.hookimpl(tryfirst=True)  # before the worker sends the ids to the controller
def pytest_collection_finish(session):
    _READS.outside_tests += _READS.take()
    _keep_groups(session)


def _keep_groups(session) -> None:
    """Under `--dist loadgroup` a pytest-xdist worker appends each grouped test's group to
    its id (`id@group`), which is all that keeps the group on one worker. pytest 9.2 keeps
    ids in a structure pytest-xdist 3.8 does not change (pytest-dev/pytest-xdist#1386), so
    every scenario file's promtool batch ran on each worker: the group is appended here where
    it is missing, and a pytest whose ids cannot take it stops the session."""
    config = session.config
    if not hasattr(config, "workerinput") or not config.getvalue("loadgroup"):
        return
    for item in session.items:
        names = {
            str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")
        }
        suffix = "@" + "_".join(sorted(names))
        if not names or item.nodeid.endswith(suffix):
            continue
        node_id = getattr(item, "_id", None)
        if callable(getattr(node_id, "parse", None)):
            item._id = type(node_id).parse(item.nodeid + suffix)
        if not item.nodeid.endswith(suffix):
            raise pytest.UsageError(f"cannot keep {item.nodeid}'s xdist_group on one worker")


@pytest.fixture(autouse=True)
def _reads_stay_in_repository():
    """Fails the test during whose setup, run or teardown something outside the repository
    was read (tests/read_audit.py); what higher-scoped fixtures read counts for the first
    test that uses them."""
    found = _READS.take()
    if found:
        pytest.fail(_READS.message(found), pytrace=False)
    yield
    found = _READS.take()
    if found:
        pytest.fail(_READS.message(found), pytrace=False)


def pytest_sessionfinish(session):
    found = _READS.outside_tests + _READS.take()
    _READS.stop()
    if found:
        sys.stderr.write("\n" + _READS.message(found) + " (outside any test)\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# marker -> the fixtures that put a test in it
TIERS = {
    "promtool": {"promtool", "amtool"},
    "live": {"prometheus_bin", "alertmanager_bin", "victoria_metrics_bin", "vmalert_bin"},
    "helm": {"helm"},
    "browser": {"chromium", "grafana_schema"},
    "hta": {"hta_peer", "hta_diff_peer"},
    "real_data": {"real_data"},
    "slow": {"wheel"},  # builds trainprof's wheel (and installs it into a fresh venv)
}
# Every fixture that fails under TRAINPROF_REQUIRE_TOOLS=1 where its tool is missing.
TOOLS = set().union(*(TIERS[t] for t in ("promtool", "live", "helm", "browser", "hta"))) | {
    "openssl"
}
# A module importing one of these trains a model (or loads the framework to): marker `torch`.
FRAMEWORKS = {"torch", "lightning", "pytorch_lightning", "transformers", "accelerate", "keras"}


def _frameworks(module) -> bool:
    """Whether a test module holds a framework's module, class or function at top level
    (`import torch`, `torch = require_module("torch")`, `from lightning import Trainer`)."""
    for value in vars(module).values():
        name = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
        if isinstance(name, str) and name.partition(".")[0] in FRAMEWORKS:
            return True
    return False


def _module_fixture(item) -> bool:
    """Whether the test uses a module-scoped fixture (set up once per module and worker)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    defs = info.name2fixturedefs
    return any(d.scope == "module" for name in item.fixturenames for d in defs.get(name, ()))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    frameworks: dict[object, bool] = {}
    for item in items:
        # A module's tests that share a module-scoped fixture run on one pytest-xdist worker
        # (--dist loadgroup), so the fixture (a training run, a replay) is made once.
        if _module_fixture(item) and not any(item.iter_markers("xdist_group")):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        for mark in item.iter_markers("slow"):
            if not mark.kwargs.get("reason"):  # checked before the fixtures' markers are added
                raise pytest.UsageError(f"{item.nodeid}: pytest.mark.slow needs a reason=")
        used = set(getattr(item, "fixturenames", ()))
        for marker, fixtures in TIERS.items():
            if used & fixtures:
                item.add_marker(marker)
        if used & TOOLS:
            item.add_marker("tools")
        module = getattr(item, "module", None)
        if module is not None:
            if module not in frameworks:
                frameworks[module] = _frameworks(module)
            if frameworks[module]:
                item.add_marker("torch")


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden",
        action="store_true",
        help="rewrite the golden files under tests/golden/ from the current "
        "output (review the diff before committing)",
    )


@pytest.fixture
def update_golden(request) -> bool:
    return request.config.getoption("--update-golden")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path:
        return path
    message = f"{name} is not installed (scripts/install-tools.sh installs it)"
    if os.environ.get("TRAINPROF_REQUIRE_TOOLS") == "1":
        pytest.fail(message + "; TRAINPROF_REQUIRE_TOOLS=1 makes this a failure")
    pytest.skip(message)


def require_module(name: str):
    """`pytest.importorskip`, except that a missing module fails under
    TRAINPROF_REQUIRE_TOOLS=1, as a missing tool does."""
    import importlib

    if os.environ.get("TRAINPROF_REQUIRE_TOOLS") == "1":
        try:
            return importlib.import_module(name)
        except ImportError as e:
            pytest.fail(
                f"{name} is not installed ({e}); TRAINPROF_REQUIRE_TOOLS=1 makes this a failure",
                pytrace=False,
            )
    return pytest.importorskip(name)


def skip_or_fail(message: str) -> None:
    """Skip on a laptop; fail under TRAINPROF_REQUIRE_TOOLS=1."""
    if os.environ.get("TRAINPROF_REQUIRE_TOOLS") == "1":
        pytest.fail(message + "; TRAINPROF_REQUIRE_TOOLS=1 makes this a failure", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def promtool() -> str:
    return _tool("promtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return _tool("prometheus")


@pytest.fixture(scope="session")
def amtool() -> str:
    return _tool("amtool")


@pytest.fixture(scope="session")
def alertmanager_bin() -> str:
    # Debian names the server binary prometheus-alertmanager.
    return _tool("prometheus-alertmanager")


@pytest.fixture(scope="session")
def victoria_metrics_bin() -> str:
    return _tool("victoria-metrics")


@pytest.fixture(scope="session")
def vmalert_bin() -> str:
    return _tool("vmalert")


@pytest.fixture(scope="session")
def openssl() -> str:
    return _tool("openssl")


@pytest.fixture(scope="session")
def helm() -> str:
    # scripts/install-tools.sh puts a static helm under .tools/ (Debian has none).
    local = ROOT / ".tools" / "helm" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return _tool("helm")


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def real_data(root) -> Path:
    """The real data the tests read (tests/data: SageMaker output, exporter captures, GPU
    traces, CRDs), each folder with its provenance and licence."""
    return root / "tests" / "data"


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """trainprof's wheel, built once per session from a copy of the sources (the build
    writes nothing into the checkout)."""
    import subprocess

    top = tmp_path_factory.mktemp("wheel")
    source = top / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    shutil.copytree(ROOT / "src", source / "src", ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation"]
        + ["--disable-pip-version-check", "-q", "-w", str(top / "dist")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=top,
    )
    assert build.returncode == 0, build.stderr
    (built,) = (top / "dist").glob("trainprof-*.whl")
    return built


@pytest.fixture(scope="session")
def chromium() -> str:
    return _tool("chromium")


@pytest.fixture(scope="session")
def hta_peer(root) -> list[str]:
    """The command that runs Holistic Trace Analysis, the peer the kernel-level trace summary
    is checked against, in a process of its own (tests/hta_peer.py; the test extra has it)."""
    import importlib.util

    if importlib.util.find_spec("hta") is None:
        skip_or_fail("holistictraceanalysis is not installed (the test extra has it)")
    return [sys.executable, str(root / "tests" / "hta_peer.py")]


@pytest.fixture(scope="session")
def hta_diff_peer(root) -> list[str]:
    """The command that runs Holistic Trace Analysis' own trace diff, the peer `trainprof
    compare` of two traces is checked against, in a process of its own
    (tests/hta_diff_peer.py)."""
    import importlib.util

    if importlib.util.find_spec("hta") is None:
        skip_or_fail("holistictraceanalysis is not installed (the test extra has it)")
    return [sys.executable, str(root / "tests" / "hta_diff_peer.py")]


# Rules compiled for a fast live test: evaluated every second, a few datapoints of patience
# and window, so every rule the scripted job provokes fires within seconds.
LIVE_RULES = {
    "scrape_interval": "1s",
    "rules": [
        {
            "rule": "ProfilerReport",
            "parameters": {
                "scan_interval_us": 1_000_000,
                **{
                    f"{rule}_patience": 4
                    for rule in (
                        "CPUBottleneck",
                        "IOBottleneck",
                        "LowGPUUtilization",
                        "BatchSize",
                        "GPUMemoryIncrease",
                        "LoadBalancing",
                    )
                },
                "LowGPUUtilization_window": 10,
                "BatchSize_window": 10,
                "GPUMemoryIncrease_window": 4,
                "StepOutlier_n_outliers": 2,
                # Half the job's nodes starve a GPU: above 40 % (not SageMaker's 50 %) fires.
                "CPUBottleneck_threshold": 40,
                "IOBottleneck_threshold": 40,
            },
        }
    ],
}


@pytest.fixture(scope="session")
def live_job(prometheus_bin, tmp_path_factory):
    """A real Prometheus scraping a small training job (see live_job.py for what serves the
    metrics) with LIVE_RULES loaded; yields (base URL, the job, the rule configuration)."""
    from trainprof.generation.render import to_yaml
    from trainprof.rules.compiler import compile_rules
    from trainprof.rules.config import load_config

    from live_job import scrape_config, scripted_job
    from servers import prometheus, wait_for_targets

    config = load_config(LIVE_RULES)
    rules = to_yaml({"groups": compile_rules(config).groups})
    workdir = tmp_path_factory.mktemp("live-prometheus")
    with scripted_job() as job:
        with prometheus(prometheus_bin, workdir, scrape_config(job), {"rules.yaml": rules}) as base:
            wait_for_targets(base, len(job.targets))
            yield base, job, config


@pytest.fixture(scope="session")
def grafana_schema(root) -> Path:
    """The directory where scripts/install-tools.sh put Grafana's dashboard JSON schema
    (generated from @grafana/schema 13.2.3) and ajv."""
    _tool("node")
    tools = Path(os.environ.get("TRAINPROF_GRAFANA_SCHEMA_DIR", root / ".tools" / "grafana-schema"))
    if not (tools / "dashboard.schema.json").is_file():
        message = f"{tools}/dashboard.schema.json is missing (scripts/install-tools.sh makes it)"
        if os.environ.get("TRAINPROF_REQUIRE_TOOLS") == "1":
            pytest.fail(message + "; TRAINPROF_REQUIRE_TOOLS=1 makes this a failure")
        pytest.skip(message)
    return tools
