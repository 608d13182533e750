"""What the model is fed: CheckInputImages (channel means) and NLPSequenceRatio (token
shares), from Watcher.log_inputs and log_tokens."""

from __future__ import annotations

import dataclasses

from trainprof.contract import metrics as contract
from trainprof.rules.catalog._text import JOB
from trainprof.rules.catalog.health.common import (
    one_alert,
    tensor_rule,
    threshold_signal,
    warn_process_default,
)
from trainprof.rules.model import (
    NUMBER_UNIT,
    RATIO_UNIT,
    Build,
    Population,
    RuleOutput,
    Selects,
    Threshold,
    Units,
)
from trainprof.rules.params import param, scan_interval_param
from trainprof.rules.tensor_params import NUMBER, NUMBERS, REGEX, WHOLE

# --- CheckInputImages, NLPSequenceRatio -----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CheckInputImagesParams:
    threshold_mean: float = param(0.2, NUMBER, "|mean| of a channel above which it fires.")
    threshold_samples: int = param(500, WHOLE, "Images to see before deciding.")
    regex: str | None = param(".*hybridsequential0_input_0", REGEX, "Accepted: log_inputs().")
    channel: int = param(1, WHOLE, "Axis of the channels (the process uses axis 1).")
    scan_interval_us: int = scan_interval_param()


def _input_images(b: Build[CheckInputImagesParams]) -> RuleOutput:
    p = b.p
    if p.channel != 1:
        b.warnings.append(
            f"{b.path('channel')}: the training process averages axis 1 (N x C x H x W); "
            "pass channel-first images to Watcher.log_inputs"
        )
    means = b.sel(contract.INPUT_CHANNEL_MEAN)
    count = b.sel(contract.INPUT_SAMPLES_TOTAL)
    return one_alert(
        expr=(
            f"max {b.by_job} (abs({means})) > {p.threshold_mean:g}\n"
            f"and {b.on_job}\nmax {b.by_job} ({count}) >= {p.threshold_samples}"
        ),
        summary="Input images are not normalised.",
        description=(
            f"Job {JOB}: an input channel's mean is {{{{ $value }}}}, beyond ±{p.threshold_mean:g}."
        ),
    )


CHECK_INPUT_IMAGES = tensor_rule(
    name="CheckInputImages",
    summary="Input images not normalised",
    detects=(
        "Once `threshold_samples` images were saved, the mean of some input channel over "
        "all of them beyond ±`threshold_mean`."
    ),
    recommendation="Normalise the inputs (subtract the dataset mean, divide by its std).",
    severity="warning",
    parameters=CheckInputImagesParams,
    build=_input_images,
    signals=threshold_signal(
        "Input channel means",
        NUMBER_UNIT,
        contract.INPUT_CHANNEL_MEAN,
        lambda p: Threshold(p.threshold_mean, f"±{p.threshold_mean:g}", "above"),
    ),
    differences=(
        "Inputs come from Watcher.log_inputs (channels on axis 1) on saving steps; the mean "
        "is over all saved images since the process started."
    ),
)


@dataclasses.dataclass(frozen=True)
class NLPSequenceRatioParams:
    tokens_regex: str | None = param(".*embedding0_input_0", REGEX, "Accepted: log_tokens().")
    token_values: tuple = param((0.0,), NUMBERS, "Token ids to count (comma-separated).")
    token_thresholds_percent: tuple = param(
        (50.0,), NUMBERS, "Percent of tokens, one per token value, above which it fires."
    )
    scan_interval_us: int = scan_interval_param()


def _nlp_ratio(b: Build[NLPSequenceRatioParams]) -> RuleOutput:
    p = b.p
    total = b.sel(contract.INPUT_TOKENS_TOTAL)
    parts = []
    for token, percent in zip(p.token_values, p.token_thresholds_percent):
        matches = b.sel(contract.INPUT_TOKEN_MATCHES_TOTAL, token=str(int(token)))
        parts.append(f"{matches}\n/ ignoring (token) group_left\n{total}\n> {percent / 100:.10g}")
    return one_alert(
        expr="\nor\n".join(parts),
        units=Units(
            "rank_token",
            "rank and token",
            "ranks and tokens",
            "rank {{ .Labels.rank }} token {{ .Labels.token }}",
            Population(contract.INPUT_TOKEN_MATCHES_TOTAL),
            "{{ .Value | humanizePercentage }}",
            "share of the input tokens",
        ),
        summary="Sequences are mostly one token (padding?).",
        description=(
            "saw one token take more of their input than its threshold ("
            + ", ".join(
                f"token {int(t)}: {pc:g}%"
                for t, pc in zip(p.token_values, p.token_thresholds_percent)
            )
            + ")"
        ),
    )


def _nlp_check(p: NLPSequenceRatioParams):
    if len(p.token_values) != len(p.token_thresholds_percent):
        return (
            (
                "token_thresholds_percent",
                f"{len(p.token_thresholds_percent)} threshold(s) for "
                f"{len(p.token_values)} token value(s); give one per token value",
            ),
        )
    return ()


def _nlp_inputs(b: Build[NLPSequenceRatioParams]):
    if tuple(p for p in b.p.token_values) != (0.0,):
        warn_process_default(b, "token_values", "counts token 0")
    return {"token_values": tuple(int(t) for t in b.p.token_values)}


def _token_share(scope: Selects) -> str:
    return (
        f"{scope.sel('trainprof_input_token_matches_total')}\n/ ignoring (token) group_left\n"
        f"{scope.sel('trainprof_input_tokens_total')}"
    )


def _first_token_line(p: NLPSequenceRatioParams) -> Threshold:
    t = p.token_thresholds_percent[0] if p.token_thresholds_percent else 50
    return Threshold(t / 100, f"{t:g}%", "above")


NLP_SEQUENCE_RATIO = tensor_rule(
    name="NLPSequenceRatio",
    summary="Sequences dominated by one token",
    detects=(
        "The share of saved input token positions equal to each of `token_values` above its "
        "`token_thresholds_percent` (by default: more than half padding)."
    ),
    recommendation=(
        "Bucket sequences by length or pack them, so batches carry less padding; check the "
        "tokenizer's truncation and padding settings."
    ),
    severity="warning",
    parameters=NLPSequenceRatioParams,
    build=_nlp_ratio,
    signals=threshold_signal("Token share", RATIO_UNIT, _token_share, _first_token_line),
    check=_nlp_check,
    inputs=_nlp_inputs,
    differences=(
        "Token ids come from Watcher.log_tokens on saving steps and are counted since the "
        "process started; token values other than 0 must be given to watch(token_values=) or "
        "watch(rules_config=)."
    ),
)
