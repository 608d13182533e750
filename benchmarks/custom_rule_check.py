"""What checking custom rules with promtool costs `rules compile`: one promtool run per
configuration (what the loader does) against one run per custom rule.

    .venv/bin/python benchmarks/custom_rule_check.py [--rules 20] [--repeat 7]

Variants, interleaved (each round runs every variant once), in milliseconds per load:
ProfilerReport alone (no custom rule), one custom rule, N custom rules (one promtool run
for all), and N custom rules checked one promtool run each (as the loader did before issue
31, which checked each definition apart). Medians with min and max. Not a test: timings
depend on the machine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time

from trainprof.rules import custom
from trainprof.rules.config import load_config


def _rules(n: int) -> list[dict]:
    return [
        {
            "custom": f"Custom{i}",
            "expr": 'max by (training_job) (trainprof_tensor_mean_abs{collection="{coll}"}) '
            "> {threshold}",
            "parameters": {"coll": "gradients", "threshold": i + 1},
            "description": "{{ $labels.training_job }}: mean of {coll} above {threshold}.",
        }
        for i in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed"
    many = _rules(args.rules)
    definitions = [custom_definition(rule, n) for n, rule in enumerate(many)]
    checked = [(d.path, d, d.defaults) for d in definitions]

    variants = {
        "ProfilerReport, no custom rule": lambda: load_config({"rules": ["ProfilerReport"]}),
        "1 custom rule": lambda: load_config({"rules": _rules(1)}),
        f"{args.rules} custom rules, one promtool run": lambda: load_config({"rules": many}),
        f"{args.rules} custom rules, a run each": lambda: [
            custom.promtool_problems([one], promtool) for one in checked
        ],
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeat):
        for name, run in variants.items():
            started = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - started) * 1000)
    for name, ms in times.items():
        print(
            f"{name:<40} median {statistics.median(ms):7.1f} ms  "
            f"(min {min(ms):.1f}, max {max(ms):.1f})"
        )


def custom_definition(rule: dict, n: int) -> custom.Definition:
    found = custom.definition(f"rules[{n}]", rule, lambda *problem: None, set())
    assert found is not None
    return found


if __name__ == "__main__":
    main()
