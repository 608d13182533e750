"""Regular expressions read from a trial's files, matched in time linear in the name (RE2).

A collections file names its tensors by `include_regex`; Python's `re` backtracks, so a
pattern such as `^(a+)+$` against forty `a` and a `b` runs for hours. RE2 (Google's engine,
which Prometheus also uses) never backtracks: a match costs time linear in the text, and a
pattern it cannot run that way (a lookahead, a backreference) is refused when compiled.

    >>> compile_pattern("^(a+)+$").search("a" * 40 + "b") is None
    True
    >>> compile_pattern("relu.*_output").search("dense/relu1_output_0") is not None
    True
    >>> try:
    ...     compile_pattern("^(?!test).*")
    ... except PatternError as e:
    ...     print(e)
    '^(?!test).*': RE2 refuses it (invalid perl operator: (?!)
"""

from __future__ import annotations

from typing import Any

from trainprof import extras

# Longer patterns than this are refused unread: no collections file smdebug writes has one.
MAX_PATTERN = 4096
# RE2's memory for one compiled pattern (its own default is 8 MiB).
MAX_MEMORY = 8 << 20


class PatternError(ValueError):
    """A pattern replay will not run; the message quotes it and says why."""


def compile_pattern(pattern: str) -> Any:
    """`pattern` compiled by RE2: an object with `search(text)` and `pattern`."""
    try:
        import re2
    except ModuleNotFoundError as missing:
        raise extras.missing("re2", "reading a SageMaker Debugger trial's collections") from (
            missing
        )
    if not isinstance(pattern, str):
        raise PatternError(f"{pattern!r}: not a regular expression (not text)")
    if len(pattern) > MAX_PATTERN:
        raise PatternError(
            f"{pattern[:40]!r}...: {len(pattern):,} characters long (at most {MAX_PATTERN:,})"
        )
    options = re2.Options()
    options.log_errors = False  # RE2 would print its own line on stderr for each refusal
    options.max_mem = MAX_MEMORY
    try:
        return re2.compile(pattern, options)
    except re2.error as e:
        why = e.args[0].decode("utf-8", "replace") if e.args and isinstance(e.args[0], bytes) else e
        raise PatternError(f"{pattern!r}: RE2 refuses it ({why})") from None
