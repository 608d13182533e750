"""Names trainprof gives things outside itself: alerts, rule groups, recordings, dashboards,
exit codes.

Every identifier a user, Prometheus, Alertmanager or Grafana sees is spelled here once, so a
rename moves the rules, the routing, the dashboards and the docs together.

    >>> alert_name("CPUBottleneck"), group_name("CPUBottleneck")
    ('TrainingCPUBottleneck', 'trainprof.CPUBottleneck')
    >>> record_name("gpu", "trainprof_gpu_utilization_sampled_ratio", "p95_rate4m10s")
    'gpu:trainprof_gpu_utilization_sampled_ratio:p95_rate4m10s'
    >>> rule_metric("LowGPUUtilization"), rule_metric("NLPSequenceRatio")
    ('trainprof_rule_low_gpu_utilization', 'trainprof_rule_nlp_sequence_ratio')
    >>> record_name("gpu", "Util", "p95")
    Traceback (most recent call last):
    ...
    ValueError: recording part 'Util' is not lower_snake_case
"""

from __future__ import annotations

import re

# --- alerts and rule groups -------------------------------------------------------------------

ALERT_PREFIX = "Training"  # TrainingCPUBottleneck: SageMaker's rule name behind a prefix
GROUP_PREFIX = "trainprof."
STATE_GROUP = GROUP_PREFIX + "state"
HEALTH_GROUP = GROUP_PREFIX + "health"
# The `rule` label of alerts that are not a rule's verdict.
HEALTH_RULE = "TrainprofHealth"  # the rules are blind: exporters do not serve their inputs
# A job's state rather than a verdict: alerts with this `rule` label exist for Alertmanager
# to inhibit on (a job that has not started is not bottlenecked yet); no one acts on them.
STATE_RULE = "TrainprofState"
NOT_STARTED_ALERT = "TrainingNotStarted"
# Fired when what a rule reads is absent (an exporter, a series, a counted threshold).
INPUT_MISSING_ALERT = "TrainprofRuleInputMissing"


def alert_name(rule: str) -> str:
    return ALERT_PREFIX + rule


def group_name(rule: str) -> str:
    return GROUP_PREFIX + rule


# --- labels -----------------------------------------------------------------------------------

# The label naming a training job: on every series of the exporter and the training API, and
# on every alert (with `namespace`, the default `job_labels`).
JOB_LABEL = "training_job"
# The labels that name a job by default (`job_labels` of a rule configuration).
JOB_LABELS = ("namespace", JOB_LABEL)
# On every alert trainprof's rules raise: the rule's version (RuleSpec.version).
VERSION_LABEL = "trainprof_rule_version"


# --- recording rules --------------------------------------------------------------------------

# The metric part of recordings OverallFrameworkMetrics writes (not served by any exporter).
RECORDED_INITIALIZATION = "trainprof_training_initialization_seconds"
RECORDED_PHASE = "trainprof_training_phase_seconds"

# A rule's recording of what its alert found, one series per unit it concerns (GPU, node,
# rank, ...): `<level>:trainprof_rule_<rule>:affected` (rule_metric, AFFECTED).
RULE_METRIC_PREFIX = "trainprof_rule_"
AFFECTED = "affected"

RECORD_NAME = re.compile(r"^[a-z][a-z0-9_]*:[a-z][a-z0-9_]*:[a-z][a-z0-9_]*$")
_PART = re.compile(r"^[a-z][a-z0-9_]*$")


def record_name(level: str, metric: str, operation: str) -> str:
    """Prometheus' `level:metric:operations` convention: the labels kept, the metric, what
    was done to it."""
    for part in (level, metric, operation):
        if not _PART.match(part):
            raise ValueError(f"recording part {part!r} is not lower_snake_case")
    return f"{level}:{metric}:{operation}"


def rule_metric(rule: str) -> str:
    """The metric part of a rule's `affected` recording: its name in snake case."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", rule).lower()
    return RULE_METRIC_PREFIX + re.sub(r"[^a-z0-9]+", "_", snake).strip("_")


# --- dashboards -------------------------------------------------------------------------------


class Dashboard:
    """A Grafana dashboard's identity: its uid, title and the slug Grafana derives from it."""

    def __init__(self, uid: str, title: str):
        self.uid = uid
        self.title = title
        self.slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
        self.file = f"dashboards/{uid}.json"

    def url(self, base: str = "") -> str:
        return f"{base}/d/{self.uid}/{self.slug}"


JOB_DASHBOARD = Dashboard("trainprof-job", "Trainprof job")
FLEET_DASHBOARD = Dashboard("trainprof-fleet", "Trainprof fleet")
COMPARE_DASHBOARD = Dashboard("trainprof-compare", "Trainprof compare")


# --- exit codes of every command --------------------------------------------------------------

EXIT_OK = 0
EXIT_FAILED = 1  # the command could not do its job (a server down, a file not writable)
EXIT_BAD_INPUT = 2  # what the user gave is wrong; the message says what and where
