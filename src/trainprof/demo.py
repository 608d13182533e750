"""`make demo`: compile SageMaker's default ProfilerReport into Prometheus rules and prove
them with the real promtool.

    python -m trainprof.demo [--out out/demo]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

from trainprof.rules.compiler import compile_rules
from trainprof.rules.config import default_config
from trainprof.rules.files import OUTPUT_NAMES, render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join("out", "demo"))
    args = parser.parse_args(argv)

    config = default_config()
    compiled = compile_rules(config)
    os.makedirs(args.out, exist_ok=True)
    written = []
    for fmt in ("rules", "prometheusrule"):
        path = os.path.join(args.out, OUTPUT_NAMES[fmt])
        with open(path, "w", encoding="utf-8") as f:
            f.write(render(compiled, fmt, "trainprof demo"))
        written.append(path)

    print("SageMaker's default ProfilerReport, compiled for Prometheus:\n")
    print(f"  {'rule':<24} {'severity':<9} {'alerts':>6} {'records':>7}  evaluated every")
    for group in compiled.groups:
        alerts = sum(1 for r in group["rules"] if "alert" in r)
        records = sum(1 for r in group["rules"] if "record" in r)
        name = group["name"].removeprefix("trainprof.")
        severity = next((r["labels"]["severity"] for r in group["rules"] if "alert" in r), "-")
        print(f"  {name:<24} {severity:<9} {alerts:>6} {records:>7}  {group['interval']}")
    for w in compiled.warnings:
        print(f"\nnote: {w}")

    promtool = shutil.which("promtool")
    if promtool is None:
        print("\npromtool is not installed (scripts/install-tools.sh installs it)",
              file=sys.stderr)
        return 1
    result = subprocess.run([promtool, "check", "rules", written[0]],
                            capture_output=True, text=True)
    print(f"\n$ promtool check rules {written[0]}\n{result.stdout.strip()}")
    print(f"\nwrote {', '.join(written)}")
    print("next: load the rule file into Prometheus (rule_files:) or apply the "
          "PrometheusRule with kubectl")
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
