"""The tensor rules' default configuration: what replay of a tensor trial evaluates unasked."""

from __future__ import annotations

from trainprof.rules.catalog import registry
from trainprof.rules.config import RulesConfig, load_config


def default_tensor_config() -> RulesConfig:
    """Every tensor rule with its defaults, except those that have no usable defaults
    (TensorVariance needs a threshold)."""
    names = [
        r.name
        for r in registry.CATALOG
        if r.family == "health" and not (r.check and r.check(r.values(r.defaults())))
    ]
    return load_config({"rules": [{"rule": n} for n in names]}, "tensor-rule defaults")


def example_tensor_config() -> RulesConfig:
    """Every tensor rule, TensorVariance with an example max_threshold: what the docs show."""
    example = {
        "TensorVariance": {"max_threshold": 10},
        "SimilarAcrossRuns": {"other_trials": "reference-job"},
    }
    rules = [
        {"rule": r.name, **({"parameters": example[r.name]} if r.name in example else {})}
        for r in registry.CATALOG
        if r.family == "health"
    ]
    return load_config({"rules": rules}, "tensor-rule examples")
