"""Each optional module is installed by the extra its one-line error names, and a command or
import without it says so in one line (exit 2 from the command line), never a traceback.

The missing module is made missing for real in a child Python: `sys.modules[name] = None`
makes every import of it raise ModuleNotFoundError, as an environment without it does. The
clean install with only `[all]` is tests/test_wheel.py.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from trainprof import extras

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
SAGEMAKER_JOB = DATA / "real-sagemaker" / "trimcrae-8xtt-redock"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
OPTIONAL = PROJECT["optional-dependencies"]


def _names(requirements: list[str]) -> set[str]:
    """Distribution names of requirement strings (`trainprof[...]` self-references left out)."""
    names = {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower() for r in requirements}
    return names - {"trainprof"}


@functools.cache
def _installed() -> dict[str, list[str]]:
    """Import name -> distributions, read once (every installed distribution's file list)."""
    return importlib.metadata.packages_distributions()


def _distributions(module: str) -> set[str]:
    return {d.lower() for d in _installed().get(module, [])}


def test_every_module_is_installed_by_the_extra_its_error_names():
    assert set(OPTIONAL["all"]) == {"trainprof[exporter,tools]"}
    for module, extra in extras.EXTRA.items():
        wanted = OPTIONAL["exporter"] + OPTIONAL["tools"] if extra == "all" else OPTIONAL[extra]
        named = _names(wanted)
        assert _distributions(module) & named, f"{module}: trainprof[{extra}] does not install it"


def test_every_distribution_of_an_extra_is_known_by_its_import_name():
    known = set().union(*(_distributions(m) for m in extras.EXTRA))
    for extra in ("exporter", "tools", "torch", "lightning", "huggingface", "keras", "xgboost"):
        assert _names(OPTIONAL[extra]) <= known, extra


def test_the_test_extra_pulls_every_framework_extra():
    (own,) = [r for r in OPTIONAL["test"] if r.startswith("trainprof[")]
    assert set(own[len("trainprof[") : -1].split(",")) == {
        "all", "torch", "lightning", "huggingface", "keras", "xgboost",
    }  # fmt: skip


def test_every_third_party_import_in_the_package_has_an_extra():
    """A new dependency imported by src/ without an extra (and a line in trainprof.extras)
    would end in a traceback on a user's machine."""
    allowed = set(sys.stdlib_module_names) | {"trainprof", "prometheus_client", "__future__"}
    allowed |= {"pytorch_lightning"}  # lightning's older standalone name, tried second
    found: dict[str, str] = {}
    for path in (ROOT / "src" / "trainprof").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.partition(".")[0]
                if top not in allowed and top not in extras.EXTRA:
                    found[top] = str(path.relative_to(ROOT))
    assert found == {}


def _hidden(modules: list[str], code: str, cwd: Path) -> subprocess.CompletedProcess:
    hide = "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    return subprocess.run(
        [sys.executable, "-c", f"import sys\n{hide}{code}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def _cli(modules: list[str], argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    code = f"from trainprof.cli import main\nsys.exit(main({argv!r}))"
    return _hidden(modules, code, cwd)


def _one_line(result: subprocess.CompletedProcess, feature: str, module: str, extra: str):
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr == (
        f"error: {feature} needs {module}, which is not installed: "
        f"pip install 'trainprof[{extra}]'\n"
    )


@pytest.fixture(scope="module")
def trial(tmp_path_factory) -> Path:
    import numpy as np

    from smdebug_writer import write_trial

    root = tmp_path_factory.mktemp("trial") / "job-a" / "debug-output"
    steps = {i: {"CrossEntropyLoss_output_0": np.float32(1.0 - i / 10)} for i in range(3)}
    return write_trial(root, steps)


JOB = str(SAGEMAKER_JOB)
LISTEN = ["--web.listen-address", "127.0.0.1:0"]


@pytest.mark.parametrize(
    "module, argv, extra",
    [
        ("numpy", ["replay", JOB], "all"),
        ("numpy", ["report", "--replay", JOB, "-o", "r.html"], "all"),
        ("numpy", ["compare", JOB, JOB, "-o", "r.html"], "all"),
        ("yaml", ["rules", "compile", "-c", "rules.yaml", "-o", "out"], "all"),
        ("grafanalib", ["export", "dashboards", "-o", "out"], "all"),
        ("psutil", ["exporter", *LISTEN], "exporter"),
        ("yaml", ["exporter", *LISTEN, "--web.config.file", "web.yml"], "exporter"),
        ("pynvml", ["record", "rec.jsonl"], "exporter"),
    ],
)
def test_a_command_without_its_module_says_which_extra_in_one_line(tmp_path, module, argv, extra):
    (tmp_path / "rules.yaml").write_text("rules:\n  - rule: LowGPUUtilization\n")
    (tmp_path / "web.yml").write_text("http_server_config: {}\n")
    result = _cli([module], argv, tmp_path)
    _one_line(result, f"trainprof {argv[0]}", module, extra)
    assert not (tmp_path / "out").exists() and not (tmp_path / "r.html").exists()


def test_basic_auth_without_bcrypt_names_the_exporter_extra(tmp_path):
    web = tmp_path / "web.yml"
    web.write_text("basic_auth_users:\n  prometheus: $2y$10$" + "a" * 53 + "\n")
    argv = ["exporter", "--web.listen-address", "127.0.0.1:0", "--web.config.file", str(web)]
    result = _cli(["bcrypt"], argv, tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert "basic_auth_users needs bcrypt, which is not installed: " in result.stderr
    assert "pip install 'trainprof[exporter]'" in result.stderr


def test_replaying_a_tensor_trial_without_torch_names_the_torch_extra(trial, tmp_path):
    for argv in (["replay", str(trial)], ["report", "--replay", str(trial), "-o", "r.html"]):
        result = _cli(["torch"], argv, tmp_path)
        _one_line(result, "replaying a SageMaker Debugger tensor trial", "torch", "torch")


@pytest.mark.parametrize(
    "hidden, target, feature, extra",
    [
        (["torch"], "trainprof.torch", "trainprof.torch.watch()", "torch"),
        (["xgboost"], "trainprof.integrations.xgboost", None, "xgboost"),
        (["keras"], "trainprof.integrations.keras", None, "keras"),
        (["transformers"], "trainprof.integrations.huggingface", None, "huggingface"),
        (["lightning", "pytorch_lightning"], "trainprof.integrations.lightning", None, "lightning"),
    ],
)
def test_an_import_without_its_framework_raises_one_line_naming_the_extra(
    tmp_path, hidden, target, feature, extra
):
    module, feature, code = hidden[0], feature or target, f"import {target}"
    catch = (
        f"try:\n    {code}\nexcept ModuleNotFoundError as e:\n"
        "    print(json.dumps([type(e).__name__, e.name, str(e)]))\n"
    )
    result = _hidden(hidden, "import json\n" + catch, tmp_path)
    assert result.returncode == 0, result.stderr
    kind, name, message = json.loads(result.stdout)
    assert (kind, name) == ("MissingExtra", module)
    assert message == (
        f"{feature} needs {module}, which is not installed: pip install 'trainprof[{extra}]'"
    )
    uncaught = _hidden(hidden, code, tmp_path)  # a user's script: the same line, last
    assert uncaught.returncode == 1
    assert uncaught.stderr.splitlines()[-1] == f"trainprof.extras.MissingExtra: {message}"


def test_the_bare_package_imports_and_answers_version_and_help(tmp_path):
    """`pip install trainprof`: nothing optional; `import trainprof` and the command line's
    own help work, and a command names [all]."""
    hidden = sorted(extras.EXTRA)
    code = (
        "import trainprof, trainprof.cli\n"
        "from trainprof.cli import main\n"
        "for argv in (['--version'], ['--help'], ['replay', '--help']):\n"
        "    try:\n"
        "        main(argv)\n"
        "    except SystemExit as e:\n"
        "        assert e.code == 0, (argv, e.code)\n"
        "sys.exit(main(['rules', 'compile', '-o', 'out']))\n"
    )
    result = _hidden(hidden, code, tmp_path)
    assert "trainprof " in result.stdout and "usage: trainprof replay" in result.stdout
    _one_line(result, "trainprof rules", "yaml", "all")


def test_an_unknown_missing_module_is_a_bug_and_still_raises():
    error = ModuleNotFoundError("No module named 'trainprof.gone'", name="trainprof.gone")
    assert extras.reraise(error, "something") is error


def test_the_module_examples_hold():
    assert os.path.isfile(SAGEMAKER_JOB / "PROVENANCE.md")
