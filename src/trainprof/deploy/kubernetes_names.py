"""Names and labels as the Kubernetes API server checks them, checked where trainprof takes
them instead (the chart's values schema, `rules compile --format prometheusrule`), so a value
Kubernetes would refuse fails `helm install` or the command, not the apply.

Kubernetes' own rules (apimachinery's validation): a namespace is a DNS-1123 label (63
characters: lower-case letters, digits and `-`, starting and ending with a letter or digit);
an object name a DNS-1123 subdomain (253 characters, dot-separated labels); a label key an
optional DNS-1123 subdomain prefix and `/`, then a name of 63 characters (letters, digits,
`-`, `_`, `.`, starting and ending with a letter or digit); a label value empty or such a
name; annotation keys are label keys, and all of an object's annotations 256 KiB in all.

    >>> label_key_problem("app.kubernetes.io/name") is None
    True
    >>> print(label_key_problem("__name__"))
    '__name__' is not a Kubernetes label key: a name of at most 63 letters, digits, -, _ or ., \
starting and ending with a letter or digit, after an optional DNS subdomain and /
    >>> print(namespace_problem("team-a\\n"))
    'team-a\\n' is not a Kubernetes namespace: at most 63 lower-case letters, digits or -, \
starting and ending with a letter or digit
"""

from __future__ import annotations

import re

from trainprof.contract.validation import short

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_SEGMENT = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = rf"{_SEGMENT}(\.{_SEGMENT})*"  # 253 characters in all
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"

# The JSON schema patterns the chart's values schema uses (Go's regexp reads them as Python's
# re does: anchored, no look-around).
DNS_LABEL_PATTERN = f"^{_DNS_LABEL}$"
DNS_SUBDOMAIN_PATTERN = f"^{_DNS_SUBDOMAIN}$"
LABEL_KEY_PATTERN = f"^({_DNS_SUBDOMAIN}/)?{_NAME}$"
LABEL_VALUE_PATTERN = f"^({_NAME})?$"
DNS_SUBDOMAIN_MAX = 253
LABEL_KEY_MAX = DNS_SUBDOMAIN_MAX + 1 + 63
LABEL_VALUE_MAX = 63
ANNOTATIONS_MAX_BYTES = 256 * 1024

_KEY_RULE = (
    "a name of at most 63 letters, digits, -, _ or ., starting and ending with a letter or "
    "digit, after an optional DNS subdomain and /"
)


def namespace_problem(name: str) -> str | None:
    """Why `name` cannot be a namespace, or None."""
    if re.fullmatch(_DNS_LABEL, name):
        return None
    return (
        f"{short(name)} is not a Kubernetes namespace: at most 63 lower-case letters, digits "
        "or -, starting and ending with a letter or digit"
    )


def object_name_problem(name: str) -> str | None:
    """Why `name` cannot name an object (a DNS-1123 subdomain), or None.

    >>> object_name_problem("trainprof-rules") is None
    True
    """
    if len(name) <= DNS_SUBDOMAIN_MAX and re.fullmatch(_DNS_SUBDOMAIN, name):
        return None
    return (
        f"{short(name)} is not a Kubernetes object name: at most 253 lower-case letters, "
        "digits, - or ., each dot-separated part starting and ending with a letter or digit"
    )


def label_key_problem(key: str) -> str | None:
    """Why `key` cannot be a label (or annotation) key, or None."""
    prefix, _, name = key.rpartition("/")
    if re.fullmatch(_NAME, name) and (
        not prefix or (len(prefix) <= DNS_SUBDOMAIN_MAX and re.fullmatch(_DNS_SUBDOMAIN, prefix))
    ):
        return None
    return f"{short(key)} is not a Kubernetes label key: {_KEY_RULE}"


def label_value_problem(value: str) -> str | None:
    """Why `value` cannot be a label value, or None.

    >>> print(label_value_problem("{{ .Values.x }}"))
    '{{ .Values.x }}' is not a Kubernetes label value: empty, or at most 63 letters, digits, \
-, _ or ., starting and ending with a letter or digit
    """
    if re.fullmatch(f"({_NAME})?", value):
        return None
    return (
        f"{short(value)} is not a Kubernetes label value: empty, or at most 63 letters, "
        "digits, -, _ or ., starting and ending with a letter or digit"
    )
