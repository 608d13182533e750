"""Parameter kinds of SageMaker Debugger's tensor rules, as the SDK sends them (strings).

>>> OPTIONAL_NUMBER.parse("None"), NUMBER.parse("1e-7"), FLAG.parse("False")
(None, 1e-07, False)
>>> NAMES.parse("weights, gradients")
('weights', 'gradients')
>>> STEPS.parse("0")
Traceback (most recent call last):
...
ValueError: '0' is not a whole number of steps of at least 1
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainprof.rules.params import Kind, _non_negative_int, _number, whole_at_least


def _is_none(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.strip().lower() in ("", "none"))


def _or_none(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`parse`, but None for an empty value or "None" (as the SDK sends an unset one)."""
    return lambda value: None if _is_none(value) else parse(value)


def _steps(value):
    return whole_at_least(value, 1, "a whole number of steps of at least 1")


def _flag(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{value!r} is not True or False")


def _names(value):
    if _is_none(value):
        return ()
    if isinstance(value, (list, tuple)):
        items = [str(v).strip() for v in value]
    elif isinstance(value, str):
        items = [v.strip() for v in value.split(",")]
    else:
        raise ValueError(f"{value!r} is not a comma-separated list of names")
    return tuple(v for v in items if v)


def _regex(value):
    """A regular expression both Python and Prometheus (RE2) read: tensor_regex becomes a
    `=~` matcher of the rules, and one Prometheus refuses makes it refuse the rule file."""
    from trainprof.contract.validation import regex_problem, short

    if _is_none(value):
        return None
    if not isinstance(value, str):
        raise ValueError(f"{short(value)} is not a regular expression")
    problem = regex_problem(value)
    if problem:
        raise ValueError(f"{short(value)} {problem}")
    return value


def _numbers(value):
    names = _names(value)
    try:
        return tuple(float(v) for v in names)
    except ValueError:
        raise ValueError(f"{value!r} is not a comma-separated list of numbers") from None


NUMBER = Kind("number", "", _number, "a number")
OPTIONAL_NUMBER = Kind("number", "", _or_none(_number), "a number, or None")
STEPS = Kind("steps", "steps", _steps, "a whole number of training steps, at least 1")
OPTIONAL_STEPS = Kind("steps", "steps", _or_none(_steps), "a whole number of steps, or None")
WHOLE = Kind("count", "", _non_negative_int, "a whole number")
FLAG = Kind("flag", "", _flag, "True or False")
NAMES = Kind("names", "", _names, "comma-separated names")
REGEX = Kind("regex", "", _regex, "a regular expression (RE2, as Prometheus reads it), or None")
TEXT = Kind("text", "", _or_none(str), "text, or None")
NUMBERS = Kind("numbers", "", _numbers, "comma-separated numbers")
