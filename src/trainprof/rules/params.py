"""Rule parameters: SageMaker's names, defaults and meaning, and how a value is checked.

A rule declares its parameters as a frozen dataclass, one field per parameter made by
`param` (SageMaker's name is the field's name), so the loader, the docs and a type checker
all read the same declaration, and a catalog entry's build sees `b.p.window` typed:

    >>> @dataclasses.dataclass(frozen=True)
    ... class Example:
    ...     threshold: float = param(70, PERCENT, "Utilization below which it fires.")
    ...     scan_interval_us: int = scan_interval_param()
    >>> [(p.name, p.default, p.kind.name) for p in params_of(Example)]
    [('threshold', 70, 'percent'), ('scan_interval_us', 60000000, 'microseconds')]

SageMaker's SDK sends every parameter as a string ("70"), so each kind parses strings and
numbers alike and says what is wrong in words a SageMaker user knows.

    >>> PERCENT.parse("70")
    70.0
    >>> COUNT.parse("1.5")
    Traceback (most recent call last):
    ...
    ValueError: '1.5' is not a whole number of datapoints
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from trainprof.contract.metrics import MODES


def _number(value: Any) -> float:
    if isinstance(value, bool) or value is None:
        raise ValueError(f"{_short(value)} is not a number")
    if isinstance(value, (int, float)):
        try:
            number = float(value)
        except OverflowError:  # an integer beyond the largest float
            raise ValueError("a number with more than 308 digits is not a finite number") from None
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise ValueError(f"{_short(value)} is not a number") from None
    else:
        raise ValueError(f"{_short(value)} is not a number")
    if not math.isfinite(number):
        raise ValueError(f"{_short(value)} is not a finite number")
    return number


def _short(value: Any) -> str:
    from trainprof.contract.validation import short

    return short(value)


@dataclasses.dataclass(frozen=True)
class Kind:
    """How one family of parameters is parsed and what range it allows."""

    name: str
    unit: str
    parse_fn: Callable[[Any], Any]
    doc: str

    def parse(self, value: Any) -> Any:
        return self.parse_fn(value)


def _percent(value):
    number = _number(value)
    if not 0 <= number <= 100:
        raise ValueError(f"{value!r} is not a percentage between 0 and 100")
    return number


def _count(value):
    number = _number(value)
    if number != int(number):
        raise ValueError(f"{value!r} is not a whole number of datapoints")
    if number < 1:
        raise ValueError(f"{value!r} must be at least 1 datapoint")
    return int(number)


def whole_at_least(value: Any, least: int, what: str) -> int:
    """`value` as a whole number of at least `least`; else a ValueError: it is not `what`.

    >>> whole_at_least("3", 1, "a whole number of steps")
    3
    >>> whole_at_least(2.5, 1, "a whole number of steps")
    Traceback (most recent call last):
    ...
    ValueError: 2.5 is not a whole number of steps
    """
    number = _number(value)
    if number != int(number) or number < least:
        raise ValueError(f"{value!r} is not {what}")
    return int(number)


def _non_negative_int(value):
    return whole_at_least(value, 0, "a whole number of 0 or more")


def _positive(value):
    number = _number(value)
    if number <= 0:
        raise ValueError(f"{value!r} must be greater than 0")
    return number


def _micros(value):
    number = _number(value)
    if number != int(number) or number < 1_000_000:
        raise ValueError(
            f"{value!r} is not a whole number of microseconds of at least 1000000 (1 s)"
        )
    if number % 1000:
        raise ValueError(
            f"{value!r} is not a whole number of milliseconds "
            "(Prometheus evaluates rules at millisecond resolution)"
        )
    return int(number)


def _distance(value):
    number = _number(value)
    if not 0 <= number <= 1:
        raise ValueError(f"{value!r} is not a Jensen-Shannon distance between 0 and 1")
    return number


_MODE_ALIASES = {m: m for m in MODES}
for _m in MODES:
    _MODE_ALIASES[f"modekeys.{_m}"] = _m
    _MODE_ALIASES[f"step:modekeys.{_m}"] = _m


def _mode(value):
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a mode (one of {', '.join(MODES)})")
    key = value.strip().lower()
    if key in ("", "none"):
        return None
    try:
        return _MODE_ALIASES[key]
    except KeyError:
        raise ValueError(
            f"{value!r} is not a mode; expected one of {', '.join(MODES)} "
            "(ModeKeys.TRAIN and Step:ModeKeys.TRAIN are accepted too)"
        ) from None


PERCENT = Kind("percent", "%", _percent, "a percentage, 0 to 100 (a ratio in PromQL)")
COUNT = Kind(
    "datapoints", "datapoints", _count, "a number of datapoints, each one `datapoint_interval` long"
)
OUTLIERS = Kind("count", "", _non_negative_int, "a whole number")
FACTOR = Kind("factor", "x", _positive, "a positive number")
MINUTES = Kind("minutes", "min", _positive, "minutes")
MICROS = Kind(
    "microseconds", "us", _micros, "microseconds; becomes the rule group's evaluation interval"
)
KERNEL_MICROS = Kind("microseconds", "us", _positive, "microseconds")
DISTANCE = Kind("distance", "", _distance, "a Jensen-Shannon distance, 0 to 0.83")
MODE = Kind("mode", "", _mode, "train, eval, predict or global; empty for all modes")


@dataclasses.dataclass(frozen=True)
class Param:
    name: str  # SageMaker's spelling
    default: Any
    kind: Kind
    help: str
    extension: bool = False  # a trainprof addition, not a SageMaker parameter


_DECLARED = "trainprof.param"


def param(default: Any, kind: Kind, help: str, extension: bool = False) -> Any:
    """A parameter as a field of a rule's parameter dataclass."""
    return dataclasses.field(default=default, metadata={_DECLARED: (kind, help, extension)})


def scan_interval_param() -> Any:
    """`scan_interval_us`, which every rule has."""
    return param(
        60_000_000,
        MICROS,
        "How often the rule is evaluated (SageMaker scanned new data this often).",
    )


def patience_param(default: int = 1000) -> Any:
    return param(
        default, COUNT, "Datapoints to collect before the rule decides anything (job warm-up)."
    )


@dataclasses.dataclass(frozen=True)
class SummaryParams:
    """The summary rules' only parameter (they record, never alert)."""

    scan_interval_us: int = scan_interval_param()


def params_of(parameters: type) -> tuple[Param, ...]:
    """The parameters a rule's dataclass declares, in declaration order."""
    out = []
    for f in dataclasses.fields(parameters):
        if _DECLARED not in f.metadata:
            raise TypeError(f"{parameters.__name__}.{f.name} is not declared with param()")
        kind, help, extension = f.metadata[_DECLARED]
        out.append(Param(f.name, f.default, kind, help, extension))
    return tuple(out)
