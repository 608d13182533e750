"""`trainprof stack`: a workstation's Prometheus, Alertmanager and exporter for a training
script, in one command.

    trainprof stack -- python train.py --epochs 3   # the stack, then the script; ends with it
    trainprof stack --keep -- python train.py       # ... and stays up after it, until Ctrl-C
    trainprof stack                                 # the stack alone, until Ctrl-C

The rules (`-c rules.yaml`, default SageMaker's ProfilerReport) are compiled for a quick
scrape (`--scrape-interval`, default 1s) and loaded into a local Prometheus that scrapes the
exporter (started here, on a free port) and every rank of the script that calls
`trainprof.start()`: the script runs with TRAINPROF_JOB, TRAINPROF_NODE and
TRAINPROF_FILE_SD_DIR set, so its ranks announce themselves (trainprof.deploy.file_sd), and
with TRAINPROF_PROMETHEUS_URL and TRAINPROF_ALERTMANAGER_URL. Alertmanager routes with
trainprof's generated tree; each notification is printed. Needs prometheus and
prometheus-alertmanager on PATH (Debian's packages; scripts/install-tools.sh).

Exit code: the script's; 2 for bad input (a rule configuration, a command that does not
exist), 1 when a server cannot start.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from trainprof.cliargs import EXIT_BAD_INPUT, EXIT_FAILED, duration


def add_parser(commands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = commands.add_parser(
        "stack",
        help="Prometheus, Alertmanager and the exporter on this machine, for a training script",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument(
        "-c",
        "--config",
        metavar="FILE",
        help="rule configuration (default: ProfilerReport with SageMaker's defaults)",
    )
    parser.add_argument(
        "--scrape-interval",
        type=duration,
        default=1.0,
        metavar="DURATION",
        help="how often Prometheus scrapes and evaluates the rules (default 1s)",
    )
    parser.add_argument(
        "--job",
        help="the training_job label (default: the script's file name, else 'local')",
    )
    parser.add_argument(
        "--dir",
        help="where the rules, configurations and data go (default: a temporary directory, "
        "removed at the end)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the stack running after the script ends, until Ctrl-C",
    )
    parser.add_argument(
        "--report",
        metavar="FILE",
        help="write the job's HTML profiling report here when the script ends",
    )
    parser.add_argument(
        "argv",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND ...",
        help="the training script to run, after --",
    )
    parser.set_defaults(run=run)
    return parser


def _job_name(argv: list[str]) -> str:
    """`python train.py` -> `train`; a name Prometheus can carry as a label value.

    >>> _job_name(["python", "-u", "scripts/train_bert.py", "--epochs", "3"])
    'train_bert'
    >>> _job_name(["torchrun", "--nproc-per-node", "2", "fit.py"]), _job_name([])
    ('fit', 'local')
    """
    for word in argv:
        if word.endswith(".py"):
            return Path(word).stem
    return "local"


def run(args: argparse.Namespace) -> int:
    from trainprof.rules import files
    from trainprof.rules.config import ConfigError

    argv = list(args.argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if argv and shutil.which(argv[0]) is None and not os.path.isfile(argv[0]):
        print(f"error: cannot run {argv[0]!r}: no such command", file=sys.stderr)
        return EXIT_BAD_INPUT
    missing = [b for b in ("prometheus", "prometheus-alertmanager") if shutil.which(b) is None]
    if missing:
        print(
            f"error: {', '.join(missing)} not installed: apt-get install "
            f"{' '.join(missing)} (or scripts/install-tools.sh)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    try:
        config = files.read_config(args.config, args.scrape_interval, None, None)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    job = args.job or _job_name(argv)
    if args.dir:
        workdir = Path(args.dir)
        workdir.mkdir(parents=True, exist_ok=True)
        return _run(args, argv, config, job, workdir)
    with tempfile.TemporaryDirectory(prefix="trainprof-stack-") as tmp:
        return _run(args, argv, config, job, Path(tmp))


def _say(text: str) -> None:
    print(text, flush=True)


def _run(args: argparse.Namespace, argv: list[str], config, job: str, workdir: Path) -> int:
    import trainprof.exporter
    from trainprof.engines.stack import EXPORTER_JOB, local_stack
    from trainprof.generation.render import to_yaml
    from trainprof.rules.compiler import compile_rules

    started = time.monotonic()
    compiled = compile_rules(config)
    for warning in compiled.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    rules = to_yaml({"groups": compiled.groups}, "trainprof stack")
    (workdir / "rules.yaml").write_text(rules)
    node = socket.gethostname()
    try:
        exporter = trainprof.exporter.start(
            0,
            address="127.0.0.1",
            datapoint_interval=config.datapoint_interval,
            identity={"training_job": job, "node": node},
        )
    except (OSError, ValueError) as e:
        print(f"error: the exporter did not start: {e}", file=sys.stderr)
        return EXIT_FAILED
    stopping = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    try:
        with local_stack(
            workdir,
            rules,
            {EXPORTER_JOB: exporter.port or 0},
            _say,
            scrape_interval=config.scrape_interval,
        ) as stack:
            names = (
                f"{len(config.rules)} rules of {args.config}"
                if args.config
                else "SageMaker's ProfilerReport"
            )
            _say(
                f"trainprof stack ready in {time.monotonic() - started:.1f}s "
                f"(training_job={job}, node={node})\n"
                f"  Prometheus   {stack.prometheus}   rules: {names} at a "
                f"{config.scrape_interval:g}s scrape ({workdir / 'rules.yaml'})\n"
                f"  Alertmanager {stack.alertmanager}   routing: trainprof's, printed below\n"
                f"  exporter     {exporter.url}\n"
                f"  ranks        found in {stack.targets} (TRAINPROF_FILE_SD_DIR)"
            )
            code = 0
            if argv:
                began = time.time()
                code = _run_script(argv, stack.environment(job, node), stopping)
                _say(f"{argv[0]} exited with {code}")
                if args.report:
                    # The script's run exactly: its last samples are already stale.
                    span = (began - 1, time.time() + config.scrape_interval)
                    if not _report(stack.prometheus, job, config, Path(args.report), span):
                        code = code or EXIT_FAILED
            if not argv or args.keep:
                _say("The stack keeps running: press Ctrl-C to stop it.")
                _wait(stopping)
            _summary(stack.notifications)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        signal.signal(signal.SIGTERM, previous)
        exporter.stop()
    return code


def _run_script(argv: list[str], env: dict[str, str], stopping: threading.Event) -> int:
    """Runs the script with the stack's environment; Ctrl-C reaches it from the terminal,
    SIGTERM to the stack is passed on."""
    try:
        child = subprocess.Popen(argv, env={**os.environ, **env})
    except OSError as e:
        print(f"error: cannot run {argv[0]!r}: {e.strerror or e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    _say(f"running {' '.join(argv)} (pid {child.pid})")
    while True:
        try:
            return child.wait(0.5)
        except subprocess.TimeoutExpired:
            if stopping.is_set():
                child.terminate()
        except KeyboardInterrupt:
            pass  # the script got the same Ctrl-C; wait for it to end


def _wait(stopping: threading.Event) -> None:
    try:
        while not stopping.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass


def _report(prometheus: str, job: str, config, path: Path, span: tuple[float, float]) -> bool:
    """The job's HTML report over `span` (start, end); False, said, when it cannot be made."""
    from trainprof.report import ReportError, build, from_prometheus, render

    try:
        collected = from_prometheus(prometheus, job, config, start=span[0], end=span[1])
        path.write_text(render(build(collected)), encoding="utf-8")
    except ReportError as e:
        print(f"error: no report: {e}", file=sys.stderr)
        return False
    except OSError as e:
        print(f"error: cannot write the report {path}: {e.strerror or e}", file=sys.stderr)
        return False
    _say(f"report written to {path}")
    return True


def _summary(notifications: list[dict]) -> None:
    fired = sorted(
        {
            a["labels"].get("alertname", "?")
            for n in notifications
            for a in n.get("alerts", [])
            if a.get("status") == "firing"
        }
    )
    _say("alerts notified: " + (", ".join(fired) if fired else "none"))
