"""The JSON Schema of the compare document (`trainprof compare --json`), version `VERSION`:
committed as schemas/trainprof-compare.schema.json by the generator and checked against
every document the tests make.

The three kinds share `version`, `kind`, `runs`, `rules`, `not_comparable` and `notes`;
`rules.<Rule>.<run label>` holds replay's verdict (`status` fired, quiet, no_data or
not_applicable, with `datapoints` and `measured`) or, for the run labelled `sagemaker`,
SageMaker's (`status` and `triggered`, its RuleTriggered). A later version adds keys; one
that changes or removes a key changes `version`.
"""

from __future__ import annotations

from typing import Any

from trainprof.compare.runs import STEP_STATISTICS, VERSION
from trainprof.compare.traces import CHANGES
from trainprof.rules.status import STATUSES

LABEL = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
NUMBER = {"type": "number"}
MAYBE = {"type": ["number", "null"]}
COUNT = {"type": "integer", "minimum": 0}
TEXT = {"type": "string"}
TEXTS = {"type": "array", "items": TEXT}
RUN_LABEL = {"type": "string", "pattern": LABEL}


def _object(properties: dict[str, Any], optional: tuple[str, ...] = (), **more: Any) -> dict:
    return {
        "type": "object",
        "properties": properties,
        "required": [k for k in properties if k not in optional],
        "additionalProperties": False,
        **more,
    }


def _by_label(value: Any) -> dict:
    return {
        "type": "object",
        "propertyNames": {"pattern": LABEL},
        "additionalProperties": value,
    }


def _by_name(value: Any) -> dict:
    return {"type": "object", "additionalProperties": value}


def _kind(kind: str, runs: dict, properties: dict[str, Any], title: str) -> dict:
    """A kind of document: `version`, `kind` and `runs`, its own `properties`, then the
    `not_comparable` and `notes` all kinds end with."""
    return _object(
        {
            "version": {"const": VERSION},
            "kind": {"const": kind},
            "runs": runs,
            **properties,
            "not_comparable": TEXTS,
            "notes": TEXTS,
        },
        title=title,
    )


def _two(run: dict) -> dict:
    """The `runs` of a comparison: A and B."""
    return {"type": "array", "items": run, "minItems": 2, "maxItems": 2}


MEASURED = {
    "oneOf": [
        {"type": "null"},
        _object(
            {
                "value": MAYBE,
                "peak": MAYBE,
                "threshold": NUMBER,
                "fires": {"enum": ["above", "below"]},
                "parameter": TEXT,
                "unit": TEXT,
            }
        ),
    ]
}
VERDICT = _object(
    {
        "status": {"enum": list(STATUSES)},
        "fired": {"type": "boolean"},
        "times_triggered": COUNT,
        "datapoints": {"type": ["integer", "null"]},
        "measured": MEASURED,
        "first_fired_at": MAYBE,
        "reason": TEXT,
    },
    description="A rule's verdict in one run, as `trainprof replay --json` gives it.",
)
SAGEMAKER_VERDICT = _object(
    {
        "status": {"enum": ["fired", "quiet", "no_data"]},
        "triggered": COUNT,
        "violations": COUNT,
        "datapoints": COUNT,
        "parameters": {"type": "object", "additionalProperties": TEXT},
        "measured": MEASURED,
    },
    description="SageMaker's verdict from its ProfilerReport JSON: fired when RuleTriggered "
    "(`triggered`) > 0, no_data when it analysed no datapoint, else quiet.",
)
STATS = _object({k: MAYBE for k in ("min", "p50", "p90", "p95", "p99", "max")})
CHANGE = _object(
    {
        "seconds": MAYBE,
        "ratio": MAYBE,
        "noise": MAYBE,
        "beyond_noise": {"type": ["boolean", "null"]},
        "same_bucket": {"type": "boolean"},
    },
    optional=("same_bucket",),
)


def _runs_kind() -> dict:
    run = _object(
        {
            "label": RUN_LABEL,
            "training_job": TEXT,
            "source": TEXT,
            "start": NUMBER,
            "end": NUMBER,
            "seconds": NUMBER,
            "nodes": COUNT,
            "gpus": COUNT,
            "ranks": COUNT,
            "steps": COUNT,
            "steps_per_second": MAYBE,
            "samples_per_second_per_gpu": MAYBE,
        }
    )
    step_run = _object(
        {
            "steps": COUNT,
            **{name: MAYBE for name in STEP_STATISTICS},
            "noise": _object({name: MAYBE for name in STEP_STATISTICS}),
            "distribution": {
                "type": "array",
                "items": _object({"le": {"oneOf": [NUMBER, {"const": "+Inf"}]}, "share": MAYBE}),
            },
        }
    )
    return _kind(
        "runs",
        _two(run),
        {
            "step_time": {
                "oneOf": [
                    {"type": "null"},
                    _object(
                        {
                            "runs": _by_label(step_run),
                            "change": _object(
                                {name: CHANGE for name in STEP_STATISTICS},
                                optional=STEP_STATISTICS,
                            ),
                        }
                    ),
                ]
            },
            "phases": {
                "oneOf": [
                    {"type": "null"},
                    _object(
                        {
                            "phases": _by_name(
                                _object(
                                    {
                                        "runs": _by_label(
                                            _object({"share": MAYBE, "seconds_per_step": MAYBE})
                                        ),
                                        "change_seconds_per_step": MAYBE,
                                    }
                                )
                            ),
                            "moved": {
                                "type": "array",
                                "items": _object(
                                    {"phase": TEXT, "change_seconds_per_step": NUMBER}
                                ),
                            },
                        }
                    ),
                ]
            },
            "utilization": _by_name(
                _object({"runs": _by_label(STATS), "change": _object({"p50": MAYBE, "p95": MAYBE})})
            ),
            "gpu_memory": _by_label(_object({"peak_bytes": MAYBE, "total_bytes": MAYBE})),
            "rules": _by_name(_by_label(VERDICT)),
            "verdict_changes": {
                "type": "array",
                "items": _object(
                    {
                        "rule": TEXT,
                        "from": {"enum": list(STATUSES)},
                        "to": {"enum": list(STATUSES)},
                    }
                ),
            },
        },
        "Two runs",
    )


def _traces_kind() -> dict:
    names = _object(
        {
            "per": {"enum": ["per profiler step", "whole trace"]},
            "summary": _object({k: COUNT for k in (*CHANGES, "changed_time")}),
            "entries": {
                "type": "array",
                "items": _object(
                    {
                        "name": TEXT,
                        "change": {"enum": list(CHANGES)},
                        "runs": _by_label(
                            _object(
                                {
                                    "count": NUMBER,
                                    "seconds": NUMBER,
                                    "total": COUNT,
                                    "total_seconds": NUMBER,
                                }
                            )
                        ),
                        "change_seconds": NUMBER,
                        "time_changed": {"type": "boolean"},
                    }
                ),
            },
        }
    )
    run = _object(
        {
            "label": RUN_LABEL,
            "source": TEXT,
            "rank": COUNT,
            "gpu": TEXT,
            "window": TEXT,
            "steps": COUNT,
            "span_seconds": NUMBER,
        }
    )
    return _kind(
        "traces",
        _two(run),
        {
            "time_classes": _object(
                {
                    "per": {"enum": ["per profiler step", "whole trace"]},
                    "classes": _by_name(_object({"runs": _by_label(NUMBER), "change": NUMBER})),
                }
            ),
            "kernels": names,
            "operators": names,
            "rules": {"type": "object", "maxProperties": 0},
        },
        "Two Kineto traces",
    )


def _sagemaker_kind() -> dict:
    sagemaker_run = _object(
        {
            "label": {"const": "sagemaker"},
            "source": TEXT,
            "training_job": TEXT,
            "reports": COUNT,
        }
    )
    trainprof_run = _object(
        {
            "label": {"const": "trainprof"},
            "source": TEXT,
            "training_job": TEXT,
            "start": NUMBER,
            "end": NUMBER,
        }
    )
    runs = {
        "type": "array",
        "prefixItems": [sagemaker_run, trainprof_run],
        "items": False,
        "minItems": 1,
    }
    return _kind(
        "sagemaker",
        runs,
        {
            "sagemaker_only": {"type": "boolean"},
            "rules": _by_name(
                _object(
                    {"sagemaker": SAGEMAKER_VERDICT, "trainprof": VERDICT},
                    optional=("sagemaker", "trainprof"),
                    minProperties=1,
                )
            ),
            "disagreements": {
                "type": "array",
                "items": _object(
                    {
                        "rule": TEXT,
                        "sagemaker": {"enum": ["fired", "quiet", "no_data"]},
                        "trainprof": {"enum": list(STATUSES)},
                        "reason": TEXT,
                        "differences": TEXT,
                    }
                ),
            },
            "system_usage": {
                "type": "array",
                "items": _object(
                    {
                        "node": TEXT,
                        "resource": TEXT,
                        **{k: NUMBER for k in ("min", "p50", "p95", "p99", "max")},
                    },
                    optional=("min", "p50", "p95", "p99", "max"),
                ),
            },
        },
        "SageMaker's verdicts beside trainprof's",
    )


TITLE = f"trainprof compare --json, version {VERSION}"
DESCRIPTION = (
    "What `trainprof compare` writes with --json: two runs, two Kineto traces, or "
    "SageMaker's verdicts beside trainprof's (docs/compare.md)."
)


def compare_schema(header: dict[str, Any]) -> dict[str, Any]:
    """The schema under `header` (the generator's `$schema`, `$id`, title...), every kind
    one branch of `oneOf` (told apart by `kind`)."""
    return {**header, "oneOf": [_runs_kind(), _traces_kind(), _sagemaker_kind()]}
