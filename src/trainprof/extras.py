"""Which pip extra installs each optional module, and the one line that says so.

`import trainprof` needs only prometheus-client; everything else comes with an extra
(pyproject.toml's `[project.optional-dependencies]`, which a test keeps in step with
`EXTRA`). A feature whose module is missing raises `MissingExtra`, a ModuleNotFoundError
whose message is one line naming the extra; the command line prints it and exits 2.

    >>> print(missing("numpy", "trainprof replay"))
    trainprof replay needs numpy, which is not installed: pip install 'trainprof[all]'
    >>> print(missing("yaml", "trainprof exporter", extra="exporter"))
    trainprof exporter needs yaml, which is not installed: pip install 'trainprof[exporter]'
"""

from __future__ import annotations

# Import name -> the smallest extra that installs it. The exporter's modules are also in
# `all`, which holds the whole command line.
EXTRA = {
    "psutil": "exporter",
    "pynvml": "exporter",
    "bcrypt": "exporter",
    "yaml": "all",
    "grafanalib": "all",
    "attr": "all",
    "numpy": "all",
    "re2": "all",
    "google_crc32c": "all",
    "torch": "torch",
    "lightning": "lightning",
    "transformers": "huggingface",
    "accelerate": "huggingface",
    "keras": "keras",
    "xgboost": "xgboost",
}


class MissingExtra(ModuleNotFoundError):
    """An optional module is missing; the message names the extra that installs it."""

    def __init__(self, message: str, module: str, extra: str):
        super().__init__(message, name=module)
        self.extra = extra


def extra_of(module: str | None) -> str | None:
    """The extra that installs `module` (a dotted name counts by its top package), or None
    for a module no extra installs."""
    return EXTRA.get((module or "").partition(".")[0])


def missing(module: str, feature: str, extra: str | None = None) -> MissingExtra:
    """The error for `feature` without `module`; `extra` overrides the smallest extra (the
    exporter's own commands name `exporter` for PyYAML, say)."""
    top = module.partition(".")[0]
    extra = extra or EXTRA.get(top, "all")
    return MissingExtra(
        f"{feature} needs {top}, which is not installed: pip install 'trainprof[{extra}]'",
        top,
        extra,
    )


def reraise(error: ModuleNotFoundError, feature: str, extra: str | None = None) -> Exception:
    """What to raise for `error` during `feature`'s imports: a MissingExtra for an optional
    module, the error itself for anything else (a missing trainprof module is a bug).

        try:
            import torch
        except ModuleNotFoundError as e:
            raise extras.reraise(e, "trainprof.torch.watch()") from None
    """
    if isinstance(error, MissingExtra) or extra_of(error.name) is None:
        return error
    return missing(error.name or "", feature, extra)
