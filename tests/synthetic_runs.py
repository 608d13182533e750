"""Recordings of made-up runs, written with the recording format's own writer
(`trainprof.contract.recording`), for tests that need runs whose numbers they know: steps of
a fixed duration, phase totals, and host samples with a fixed GPU utilization."""

from __future__ import annotations

from pathlib import Path

from trainprof.contract import recording
from trainprof.contract.sampling import GpuSample, HostSample


def write_run(
    path: Path,
    start: float,
    minutes: float,
    step_seconds: float,
    gpu: float,
    *,
    job: str = "bert",
    node: str = "n1",
    steps_per_second: float = 2.0,
    phases: dict[str, float] | None = None,
    gpus: int = 1,
) -> int:
    """One run of `job`: rank 0's steps (`step_seconds` each, `steps_per_second`), its
    phase totals (`phases`: seconds of each phase per step) every 10 s, and the node's host
    samples every 0.5 s (every GPU at utilization `gpu`); returns the number of steps."""
    with recording.open_recording(str(path), "w") as stream:
        writer = recording.Writer(stream)
        writer.write(recording.meta(0.5, "test"))
        writer.write(recording.process_record(node, 0, start, training_job=job))
        t, steps, totals = start + 1.0, 0, dict.fromkeys(phases or {}, 0.0)
        last_phases = start
        while t + step_seconds < start + minutes * 60:
            writer.write(recording.step_record(node, 0, "train", t, t + step_seconds))
            steps += 1
            for name, seconds in (phases or {}).items():
                totals[name] += seconds
            if phases and t - last_phases >= 10:
                writer.write(recording.phases_record(node, 0, t + step_seconds, totals))
                last_phases = t
            t += 1 / steps_per_second
        if phases:
            writer.write(recording.phases_record(node, 0, t, totals))
        k = 1
        while k * 0.5 < minutes * 60:
            writer.write(
                recording.host_record(
                    node,
                    HostSample(
                        start + k * 0.5,
                        cpu_utilization=[0.3, 0.3],
                        cpu_iowait=[0.0, 0.0],
                        memory_used_ratio=0.3,
                        gpus=[
                            GpuSample(i, f"GPU-{node}-{i}", utilization=gpu, memory_used_ratio=0.5)
                            for i in range(gpus)
                        ],
                    ),
                )
            )
            k += 1
    return steps
