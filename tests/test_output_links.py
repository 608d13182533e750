"""A symbolic link planted in an output directory is never written through: `rules compile
-o DIR` and `export` (with --force too) refuse it, name it, and leave its target as it was;
a link anywhere below DIR (a folder of the chart) counts."""

from __future__ import annotations

import os

import pytest

from trainprof.cli import main


@pytest.mark.parametrize(
    "argv, name",
    [
        (["rules", "compile", "-q"], "trainprof.rules.yaml"),
        (["rules", "compile", "-q", "--format", "prometheusrule"], "trainprof.prometheusrule.yaml"),
        (["export", "rules", "--force"], "trainprof.rules.yaml"),
        (["export", "rules"], "trainprof.prometheusrule.yaml"),
        (["export", "chart", "--force"], "trainprof/values.yaml"),
        (["export", "chart", "--force"], "trainprof"),  # the chart's folder
    ],
)
def test_a_planted_link_is_refused_and_its_target_kept(argv, name, tmp_path, capsys):
    victim = tmp_path / "victim"
    if name.endswith(".yaml"):
        victim.write_text("precious\n")
    else:
        victim.mkdir()
    out = tmp_path / "out"
    (out / name).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(victim, out / name)
    code = main([*argv, "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert f"{out / name}" in err and "symbolic link" in err, err
    if victim.is_dir():
        assert not any(victim.iterdir())
    else:
        assert victim.read_text() == "precious\n"
    if argv[0] == "export":  # nothing at all is written
        assert [p.name for p in out.rglob("*") if p.is_file() and not p.is_symlink()] == []


def test_compile_still_replaces_its_own_file(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["rules", "compile", "-q", "-o", str(out)]) == 0
    (out / "trainprof.rules.yaml").write_text("old")
    assert main(["rules", "compile", "-q", "-o", str(out)]) == 0
    assert (out / "trainprof.rules.yaml").read_text().startswith("# Code generated")
