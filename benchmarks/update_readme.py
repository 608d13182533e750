"""Run the benchmarks that keep a table in benchmarks/README.md and put their tables there.

    python benchmarks/update_readme.py [--only step_overhead health_overhead ...] [--quick]

Each table sits between `<!-- table: NAME -->` and `<!-- /table: NAME -->` in the README
and is replaced by what `NAME.py --markdown` prints: its caption (date, machine, load) and
its rows. A benchmark that fails leaves its table as it was and the script exits 1.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
README = HERE / "README.md"
# Benchmark -> its arguments (full run, --quick run).
TABLES = {
    "step_overhead": ([], ["--rounds", "20", "--steps", "2000"]),
    "health_overhead": ([], ["--rounds", "3", "--steps", "30", "--models", "cnn"]),
    "scrape_cost": ([], ["--rounds", "2", "--paced", "4", "--burst", "50"]),
    "replay_scale": (
        ["--hours", "1", "2", "--rounds", "3"],
        ["--hours", "0.25", "--scrape", "15s"],
    ),
}


def replace_table(text: str, name: str, table: str) -> str:
    """`text` with the table between NAME's markers replaced by `table`.

    >>> replace_table("a\\n<!-- table: x -->\\nold\\n<!-- /table: x -->\\nb", "x", "new")
    'a\\n<!-- table: x -->\\nnew\\n<!-- /table: x -->\\nb'
    """
    pattern = re.compile(
        rf"(<!-- table: {re.escape(name)} -->\n).*?(\n<!-- /table: {re.escape(name)} -->)",
        re.DOTALL,
    )
    if not pattern.search(text):
        raise KeyError(f"{README.name} has no markers for {name}")
    return pattern.sub(lambda m: m.group(1) + table.strip("\n") + m.group(2), text, count=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=TABLES, default=list(TABLES))
    parser.add_argument("--quick", action="store_true", help="fewer rounds: to try the script")
    args = parser.parse_args()
    failed = []
    for name in args.only:
        full, quick = TABLES[name]
        command = [sys.executable, str(HERE / f"{name}.py"), "--markdown"]
        command += quick if args.quick else full
        print("running", " ".join(command[1:]), flush=True)
        run = subprocess.run(command, capture_output=True, text=True, cwd=HERE)
        if run.returncode != 0:
            print(f"{name} failed:\n{run.stderr[-2000:]}", file=sys.stderr)
            failed.append(name)
            continue
        README.write_text(replace_table(README.read_text(), name, run.stdout))
        print(run.stdout)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
