"""One way to check every configuration trainprof reads: rules, actions, exporter web config.

Every checker collects `Problem`s (a path and what is wrong) and raises one `ConfigError`
listing all of them, so a user fixes a file in one pass:

    >>> problems = Problems()
    >>> problems.unknown_keys({"dryrun": True}, "", ("dry_run", "listen"))
    >>> problems.add("listen", "expected host:port")
    >>> print(problems.error("actions.yaml"))
    actions.yaml: 2 problems
      dryrun: unknown key (did you mean dry_run?); valid keys: dry_run, listen
      listen: expected host:port

A single problem reads as one line: `web.yml: line 2, column 1: not valid YAML: ...`.
Files are read with `read_text` and parsed with `parse_yaml`, which never lets a reader error,
a too-deep document or a tab-indented JSON file end in a traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import reprlib
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

MAX_DEPTH = 64  # no configuration needs more; parsers recurse per level
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80
_REPR.maxlevel = 3


@dataclasses.dataclass(frozen=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(ValueError):
    """One or more problems in a configuration; str() lists all of them."""

    def __init__(self, problems: list[Problem], source: str = "configuration"):
        self.problems = problems
        self.source = source
        super().__init__(str(self))

    def __str__(self) -> str:
        n = len(self.problems)
        if n == 1:
            return f"{self.source}: {self.problems[0]}"
        head = f"{self.source}: {n} problem{'s' if n != 1 else ''}"
        return head + "".join(f"\n  {p}" for p in self.problems)


def nearest(name: str, candidates: Iterable[str]) -> str:
    """' (did you mean X?)' for the closest candidate, or ''.

    >>> nearest("LowGPUUtilisation", ["LowGPUUtilization", "BatchSize"])
    ' (did you mean LowGPUUtilization?)'
    """
    candidates = [str(c) for c in candidates]
    name = str(name)
    folded = {c.lower(): c for c in candidates}
    if name.lower() in folded:
        return f" (did you mean {folded[name.lower()]}?)"
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def describe(value: Any) -> str:
    """A value as an error message names it, short even for huge or deeply nested values.

    >>> describe(None), describe([1]), describe("Jobs"), describe(0), describe(True)
    ('nothing', 'a list', "the string 'Jobs'", 'int 0', 'true')
    """
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"the string {short(value)}"
    return f"{type(value).__name__} {short(value)}"


def short(value: Any) -> str:
    """repr() cut to a readable length (a 5,000-digit integer, a 10,000-deep list)."""
    try:
        return _REPR.repr(value)
    except (RecursionError, ValueError):
        return f"<{type(value).__name__}>"


class Problems:
    """Collects problems and warnings while a checker walks a configuration."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.warnings: list[str] = []

    def __bool__(self) -> bool:
        return bool(self.problems)

    def add(self, path: str, message: str) -> None:
        self.problems.append(Problem(path, message))

    def warn(self, path: str, message: str) -> None:
        self.warnings.append(str(Problem(path, message)))

    def unknown_keys(
        self,
        mapping: Mapping,
        path: str,
        keys: Iterable[str],
        not_implemented: Iterable[str] = (),
        list_valid: bool = True,
        product: str = "trainprof",
    ) -> None:
        """A problem per key of `mapping` not in `keys`, with the nearest valid one."""
        keys, not_implemented = tuple(keys), tuple(not_implemented)
        for key in mapping:
            if key in keys:
                continue
            where = f"{path}.{key}" if path else str(key)
            if key in not_implemented:
                self.add(where, f"not implemented by {product}")
                continue
            valid = f"; valid keys: {', '.join(keys)}" if list_valid else ""
            self.add(where, "unknown key" + nearest(str(key), keys + not_implemented) + valid)

    def one_of(self, path: str, value: Any, choices: Iterable[str]) -> bool:
        """True if `value` is one of `choices`; else a problem naming them and the nearest."""
        choices = tuple(choices)
        if isinstance(value, str) and value in choices:
            return True
        self.add(
            path,
            f"{describe(value)} is not one of {', '.join(choices)}" + nearest(str(value), choices),
        )
        return False

    def error(self, source: str) -> ConfigError:
        return ConfigError(list(self.problems), source)

    def raise_if_any(self, source: str) -> None:
        if self.problems:
            raise self.error(source)


def read_text(path: str, what: str = "a UTF-8 text file") -> str:
    """A file's text; ConfigError (not OSError) when it cannot be read or is not text."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ConfigError([Problem("", f"cannot read: {e.strerror or e}")], path) from None
    except UnicodeDecodeError:
        raise ConfigError([Problem("", f"not {what}")], path) from None
    except MemoryError:
        raise ConfigError([Problem("", "too large to read")], path) from None


def parse_yaml(text: str, source: str) -> Any:
    """A YAML (or JSON) document; ConfigError with line and column when it is not one.

    JSON is YAML except for one thing editors do: indenting with tabs. A document YAML
    refuses is read as JSON before giving up, so a tab-indented JSON file is accepted.
    Documents nested too deeply for the parser are refused, not a RecursionError.
    """
    import yaml

    if _flow_depth(text) > MAX_DEPTH:
        raise ConfigError([Problem("", f"nested more than {MAX_DEPTH} levels deep")], source)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        error = e
    except (RecursionError, MemoryError):
        raise ConfigError([Problem("", "nested too deeply to read")], source) from None
    except ValueError as e:  # an integer of more than 4300 digits
        reason = str(e).split(";")[0]
        raise ConfigError([Problem("", f"a value cannot be read: {reason}")], source) from None
    if text.lstrip()[:1] in ("{", "["):
        try:
            return json.loads(text)
        except (ValueError, RecursionError, MemoryError):
            pass
    mark = getattr(error, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    what = getattr(error, "problem", None) or _reader_error(error)
    raise ConfigError([Problem(where, f"not valid YAML: {what}")], source) from None


def _flow_depth(text: str) -> int:
    """The deepest nesting of [ and { outside quotes: the YAML parser recurses per level,
    slowly, so a document of thousands of brackets is refused before it is parsed."""
    depth = deepest = 0
    quote = ""
    for ch in text:
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(depth - 1, 0)
    return deepest


def _reader_error(error: Exception) -> str:
    """yaml's ReaderError (a control character) has a position, not a mark."""
    character = getattr(error, "character", None)
    position = getattr(error, "position", None)
    if character is not None and position is not None:
        code = ord(character) if isinstance(character, str) else character
        return f"control character {code:#04x} at character {position}; only printable text"
    return str(error)


def check_deep(value: Any, source: str, limit: int = MAX_DEPTH) -> None:
    """Refuse what no configuration needs and later stages cannot take: nesting deeper than
    `limit` (YAML anchors can also make a small file expand into a huge tree), and text
    that is not Unicode (a lone surrogate from a "\\ud800" escape, which YAML readers such as
    Prometheus's refuse). ConfigError, not a RecursionError or an encoding error on output.
    """
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    seen = 0
    while stack:
        node, depth, path = stack.pop()
        if depth > limit:
            raise ConfigError([Problem("", f"nested more than {limit} levels deep")], source)
        seen += 1
        if seen > 1_000_000:
            raise ConfigError([Problem("", "more than a million values")], source)
        if isinstance(node, str):
            if not _is_unicode(node):
                raise ConfigError(
                    [Problem(path, f"{short(node)} holds a lone surrogate, not Unicode text")],
                    source,
                )
        elif isinstance(node, Mapping):
            for k, v in node.items():
                where = f"{path}.{k}" if path else str(k)
                stack.append((v, depth + 1, where))
                stack.append((k, depth + 1, path))
        elif isinstance(node, (list, tuple)):
            stack.extend((v, depth + 1, f"{path}[{i}]") for i, v in enumerate(node))


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def template_problem(text: str) -> str | None:
    """Why `text` cannot go into an alert annotation verbatim, or None.

    Prometheus expands annotations as Go templates: `{{` in a URL would run as template
    code (and usually fail `promtool check rules`).
    """
    if "{{" in text or "}}" in text:
        return f"{short(text)} contains {{{{ or }}}}, which Prometheus would run as a template"
    return None


# --- regular expressions as Prometheus (Go's RE2 syntax) reads them ---------------------------

_GO_FLAGS = set("imsU-")
_UNSUPPORTED_GROUPS = {
    "=": "lookahead (?=...)",
    "!": "negative lookahead (?!...)",
    "<=": "lookbehind (?<=...)",
    "<!": "negative lookbehind (?<!...)",
    ">": "atomic group (?>...)",
    "(": "conditional (?(...)...)",
    "#": "comment (?#...)",
    "P=": "named backreference (?P=...)",
}
_MAX_REPEAT = 1000


def regex_problem(text: str) -> str | None:
    """Why Prometheus would refuse `text` as a label matcher regex ("is ...", "uses ..."),
    or None.

    Prometheus compiles matchers with Go's RE2 syntax, which lacks what needs backtracking:

    >>> regex_problem("bert-.*") is None
    True
    >>> regex_problem("bert-(?!test)")
    "uses a negative lookahead (?!...), which Prometheus's regular expressions (RE2) do not support"
    """
    try:
        import re

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            re.compile(text)
    except re.error as e:
        return f"is not a valid regular expression: {e}"
    except (RecursionError, OverflowError, MemoryError):
        return "is too complex a regular expression"
    what = _go_unsupported(text)
    if what:
        return f"uses {what}, which Prometheus's regular expressions (RE2) do not support"
    return None


def _go_unsupported(text: str) -> str | None:
    i, n, in_class = 0, len(text), False
    while i < n:
        c = text[i]
        if c == "\\":
            nxt = text[i + 1 : i + 2]
            if nxt.isdigit() and nxt != "0":
                return f"a backreference \\{nxt}" if not in_class else f"an octal escape \\{nxt}"
            if nxt == "Z":
                return "\\Z (write $)"
            if nxt in ("u", "U", "N"):
                return f"\\{nxt} escapes (write \\x{{...}})"
            i += 2
            continue
        if in_class:
            if c == "[" and text[i + 1 : i + 2] == ":":
                end = text.find(":]", i + 2)
                i = end + 2 if end != -1 else i + 1
                continue
            if c == "]":
                in_class = False
            i += 1
            continue
        if c == "[":
            in_class = True
            i += 1
            if text[i : i + 1] == "^":
                i += 1
            if text[i : i + 1] == "]":  # a literal ] first in a class
                i += 1
            continue
        if c == "(" and text[i + 1 : i + 2] == "?":
            rest = text[i + 2 :]
            for prefix, what in _UNSUPPORTED_GROUPS.items():
                if rest.startswith(prefix):
                    return f"a {what}"
            if not rest.startswith(("P<", ":")):
                flags = ""
                for ch in rest:
                    if ch in ":)":
                        break
                    flags += ch
                bad = sorted(set(flags) - _GO_FLAGS)
                if bad:
                    return f"the flag{'s' if len(bad) > 1 else ''} {''.join(bad)} in (?{flags})"
        if c in "*+?}" and text[i + 1 : i + 2] == "+" and i > 0:
            return f"a possessive quantifier {c}+"
        if c == "{":
            close = text.find("}", i)
            body = text[i + 1 : close] if close != -1 else ""
            numbers = body.split(",")
            if 1 <= len(numbers) <= 2 and all(p.isdigit() or p == "" for p in numbers):
                if numbers[0] and any(p and int(p) > _MAX_REPEAT for p in numbers):
                    return f"a repeat count above {_MAX_REPEAT} ({{{body}}})"
        i += 1
    return None
