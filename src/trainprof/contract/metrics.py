"""The metric contract: every series the exporter and the training API publish.

This module is the only place metric names are spelled: code writes `contract.TRAINING_LOSS`,
never the string. The rule compiler reads the table (a rule may only select metrics listed
here), the exporter and the training API register from it, and `docs/metrics.md` is
generated from it.

Why the exporter publishes histograms and counters besides the latest-sample gauges:
SageMaker Debugger's rules reason over a sample every 0.5 s while Prometheus scrapes every
15-60 s. Each 0.5 s sample is therefore folded into the exporter's state at sampling time:

* quantile rules (LowGPUUtilization, BatchSize) read `*_sampled_ratio` histograms, whose
  buckets over any range hold every sample of that range, whatever the scrape interval;
* mean rules (GPUMemoryIncrease) read the same histograms' `_sum` / `_count`;
* joint conditions (a core above 90 % while a GPU is below 10 %) are counted per sample by the
  exporter, over a fixed grid of thresholds (see `BUSY_THRESHOLDS`, `GPU_IDLE_THRESHOLDS`);
  the rules select the grid point they need by label. Thresholds off the grid are counted too
  when the exporter is given the same rule configuration (`trainprof exporter --rules.config`).
* step outliers need every step: the training process counts them itself, for a grid of
  `stddev` factors (`OUTLIER_STDDEVS`).

Identity labels are not listed per metric: `training_job` and `node` come either from the
process environment or from scrape-time relabelling (never both, or Prometheus renames one to
`exported_*`); training series add `rank` and `local_rank`.
"""

from __future__ import annotations

import dataclasses

from prometheus_client.utils import floatToGoString

from trainprof.contract.names import JOB_LABEL

EXPORTER_IDENTITY = (JOB_LABEL, "node")
TRAINING_IDENTITY = (JOB_LABEL, "node", "rank", "local_rank")

# Bucket upper bounds of every `*_sampled_ratio` histogram: 0, 0.01, 0.02, 0.05, 0.1, ...,
# 0.95, 1. SageMaker's default thresholds (70, 10 percent) and their usual overrides are
# bucket bounds, so a quantile compared with them is decided by whole buckets, not by
# interpolation; 1 % and 2 % resolve "idle" from "barely used".
UTILIZATION_BUCKETS = (0.0, 0.01, 0.02) + tuple(round(i * 0.05, 2) for i in range(1, 21))

# Step durations from 1 ms to 10 min, 1-2-5 per decade: fine enough for a heatmap.
STEP_DURATION_BUCKETS = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
    20.0,
    50.0,
    100.0,
    200.0,
    600.0,
)

# Kernel launch latency (host call to device start) from 1 us to 1 s.
LAUNCH_LATENCY_BUCKETS = (
    1e-06,
    2e-06,
    5e-06,
    1e-05,
    2e-05,
    5e-05,
    0.0001,
    0.0002,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.1,
    1.0,
)

# LoadBalancing compares per-GPU utilization histograms of 2 % bins, as SageMaker did.
LOAD_BALANCING_BINS = 50

# Threshold grids counted by the exporter without any configuration (ratios).
BUSY_THRESHOLDS = (0.5, 0.7, 0.8, 0.9, 0.95)  # cpu_above, iowait_above
GPU_IDLE_THRESHOLDS = (0.05, 0.1, 0.2, 0.3, 0.5)  # gpu_below
OUTLIER_STDDEVS = (2.0, 3.0, 4.0, 5.0)  # stddev

# Fixed phase names of the training API; user annotations add at most MAX_USER_PHASES more.
PHASES = (
    "dataloader",
    "h2d",
    "forward",
    "backward",
    "optimizer",
    "collective",
    "evaluation",
    "checkpoint",
    "other",
)
MAX_USER_PHASES = 16

# Bounds of the training-health series (trainprof.torch.watch): per-tensor series for at most
# MAX_TENSOR_SERIES tensors matching include_regex, confusion matrices of MAX_CLASSES classes
# (plus "other"), MAX_CHANNELS input channels, MAX_LOGGED_METRICS names of log_metric().
MAX_TENSOR_SERIES = 64
MAX_CLASSES = 20
MAX_CHANNELS = 16
MAX_LOGGED_METRICS = 32
# LossNotDecreasing's num_steps values evaluated in the training process by default.
LOSS_NUM_STEPS = (10,)
MODES = ("train", "eval", "predict", "global")


def threshold_label(value: float) -> str:
    """The label value a threshold is exported under: 0.9 -> "0.9", 3.0 -> "3".

    The exporter, the training API and the rule compiler all format thresholds here, so the
    selector a rule writes matches the series the exporter serves.
    """
    return f"{float(value):.6g}"


def bucket_label(bound: float) -> str:
    """`le` label of a bucket bound exactly as prometheus_client writes it: 1 -> "1.0"."""
    return floatToGoString(bound)


@dataclasses.dataclass(frozen=True)
class Metric:
    name: str  # full exposed name (counters end in _total)
    type: str  # counter | gauge | histogram
    unit: str  # base unit, or "" for plain numbers
    labels: tuple[str, ...]  # labels besides the identity labels
    help: str
    source: str  # exporter | training
    collector: str  # which exporter collector or API part serves it
    used_by: tuple[str, ...] = ()  # rules that read it
    buckets: tuple[float, ...] = ()

    @property
    def identity(self) -> tuple[str, ...]:
        return EXPORTER_IDENTITY if self.source == "exporter" else TRAINING_IDENTITY

    @property
    def base(self) -> str:
        """The name a client library is given: counters lose `_total`."""
        return self.name[: -len("_total")] if self.type == "counter" else self.name


def _m(name, type, unit, labels, help, source, collector, used_by=(), buckets=()):
    return Metric(
        name, type, unit, tuple(labels), help, source, collector, tuple(used_by), tuple(buckets)
    )


# --- metric names ------------------------------------------------------------------------
# Code takes a metric's name from here (contract.TRAINING_LOSS), never spells it again.

# training health
TENSOR_SAVES_TOTAL = "trainprof_tensor_saves_total"
TENSOR_LAST_SAVE_STEP = "trainprof_tensor_last_save_step"
TENSOR_LAST_SAVE_TIMESTAMP_SECONDS = "trainprof_tensor_last_save_timestamp_seconds"
TENSOR_SERIES_CUT = "trainprof_tensor_series_cut"
TENSOR_MEAN_ABS = "trainprof_tensor_mean_abs"
TENSOR_NAN_VALUES = "trainprof_tensor_nan_values"
TENSOR_INF_VALUES = "trainprof_tensor_inf_values"
TENSOR_ZERO_RATIO = "trainprof_tensor_zero_ratio"
TENSOR_VARIANCE = "trainprof_tensor_variance"
TENSOR_L1_NORM = "trainprof_tensor_l1_norm"
TENSOR_L2_NORM = "trainprof_tensor_l2_norm"
TENSOR_UPDATE_RATIO = "trainprof_tensor_update_ratio"
TENSOR_UNCHANGED_SAVES = "trainprof_tensor_unchanged_saves"
TENSOR_DEAD_UNIT_RATIO = "trainprof_tensor_dead_unit_ratio"
TENSOR_SATURATED_UNIT_RATIO = "trainprof_tensor_saturated_unit_ratio"
TENSOR_PERCENTILE_SPREAD = "trainprof_tensor_percentile_spread"
TRAINING_LOSS = "trainprof_training_loss"
TRAINING_LOSS_STEP = "trainprof_training_loss_step"
TRAINING_LOSS_EVALUATED = "trainprof_training_loss_evaluated"
TRAINING_LOSS_BASELINE = "trainprof_training_loss_baseline"
TRAINING_LOSS_SAVES_SINCE_IMPROVEMENT = "trainprof_training_loss_saves_since_improvement"
TRAINING_METRIC = "trainprof_training_metric"
CLASSIFICATION_SAMPLES_TOTAL = "trainprof_classification_samples_total"
CLASSIFICATION_SAVED_SAMPLES = "trainprof_classification_saved_samples"
INPUT_SAMPLES_TOTAL = "trainprof_input_samples_total"
INPUT_CHANNEL_MEAN = "trainprof_input_channel_mean"
INPUT_TOKENS_TOTAL = "trainprof_input_tokens_total"
INPUT_TOKEN_MATCHES_TOTAL = "trainprof_input_token_matches_total"
XGBOOST_FEATURE_IMPORTANCE_TOP_RATIO = "trainprof_xgboost_feature_importance_top_ratio"
XGBOOST_TREE_DEPTH = "trainprof_xgboost_tree_depth"

# exporter health
EXPORTER_BUILD_INFO = "trainprof_exporter_build_info"
COLLECTOR_SUCCESS = "trainprof_collector_success"
COLLECTOR_DURATION_SECONDS = "trainprof_collector_duration_seconds"
COLLECTOR_UNAVAILABLE = "trainprof_collector_unavailable"
SAMPLER_INTERVAL_SECONDS = "trainprof_sampler_interval_seconds"
SAMPLES_TOTAL = "trainprof_samples_total"

# CPU
CPU_CORES = "trainprof_cpu_cores"
CPU_CORE_UTILIZATION_RATIO = "trainprof_cpu_core_utilization_ratio"
CPU_CORE_IOWAIT_RATIO = "trainprof_cpu_core_iowait_ratio"
CPU_BUSIEST_CORE_UTILIZATION_RATIO = "trainprof_cpu_busiest_core_utilization_ratio"
CPU_BUSIEST_CORE_IOWAIT_RATIO = "trainprof_cpu_busiest_core_iowait_ratio"
CPU_UTILIZATION_SAMPLED_RATIO = "trainprof_cpu_utilization_sampled_ratio"
CPU_IOWAIT_SAMPLED_RATIO = "trainprof_cpu_iowait_sampled_ratio"
CPU_BOTTLENECK_SAMPLES_TOTAL = "trainprof_cpu_bottleneck_samples_total"
IO_BOTTLENECK_SAMPLES_TOTAL = "trainprof_io_bottleneck_samples_total"

# memory, disk, network
MEMORY_USED_BYTES = "trainprof_memory_used_bytes"
MEMORY_TOTAL_BYTES = "trainprof_memory_total_bytes"
MEMORY_USED_SAMPLED_RATIO = "trainprof_memory_used_sampled_ratio"
DISK_READ_BYTES_TOTAL = "trainprof_disk_read_bytes_total"
DISK_WRITTEN_BYTES_TOTAL = "trainprof_disk_written_bytes_total"
NETWORK_RECEIVE_BYTES_TOTAL = "trainprof_network_receive_bytes_total"
NETWORK_TRANSMIT_BYTES_TOTAL = "trainprof_network_transmit_bytes_total"

# GPU
GPU_INFO = "trainprof_gpu_info"
GPU_UTILIZATION_RATIO = "trainprof_gpu_utilization_ratio"
GPU_UTILIZATION_SAMPLED_RATIO = "trainprof_gpu_utilization_sampled_ratio"
NODE_GPU_UTILIZATION_SAMPLED_RATIO = "trainprof_node_gpu_utilization_sampled_ratio"
GPU_MEMORY_USED_BYTES = "trainprof_gpu_memory_used_bytes"
GPU_MEMORY_TOTAL_BYTES = "trainprof_gpu_memory_total_bytes"
GPU_MEMORY_USED_SAMPLED_RATIO = "trainprof_gpu_memory_used_sampled_ratio"
NODE_GPU_MEMORY_USED_SAMPLED_RATIO = "trainprof_node_gpu_memory_used_sampled_ratio"
GPU_UTILIZATION_JS_DISTANCE = "trainprof_gpu_utilization_js_distance"
GPU_POWER_WATTS = "trainprof_gpu_power_watts"
GPU_ENERGY_JOULES_TOTAL = "trainprof_gpu_energy_joules_total"
GPU_TEMPERATURE_CELSIUS = "trainprof_gpu_temperature_celsius"
GPU_SM_CLOCK_HERTZ = "trainprof_gpu_sm_clock_hertz"
GPU_SM_ACTIVE_RATIO = "trainprof_gpu_sm_active_ratio"
GPU_SM_OCCUPANCY_RATIO = "trainprof_gpu_sm_occupancy_ratio"
GPU_TENSOR_ACTIVE_RATIO = "trainprof_gpu_tensor_active_ratio"
GPU_DRAM_ACTIVE_RATIO = "trainprof_gpu_dram_active_ratio"

# training process: its process, step and phase series all start with TRAINING_SERIES
TRAINING_SERIES = "trainprof_training_"
TRAINING_INFO = "trainprof_training_info"
TRAINING_START_TIMESTAMP_SECONDS = "trainprof_training_start_timestamp_seconds"
TRAINING_FIRST_STEP_TIMESTAMP_SECONDS = "trainprof_training_first_step_timestamp_seconds"
TRAINING_LAST_STEP_TIMESTAMP_SECONDS = "trainprof_training_last_step_timestamp_seconds"
TRAINING_DATALOADER_WORKERS = "trainprof_training_dataloader_workers"
TRAINING_STEPS_TOTAL = "trainprof_training_steps_total"
TRAINING_STEP_DURATION_SECONDS = "trainprof_training_step_duration_seconds"
TRAINING_STEP_OUTLIERS_TOTAL = "trainprof_training_step_outliers_total"
TRAINING_PHASE_SECONDS_TOTAL = "trainprof_training_phase_seconds_total"
TRAINING_SAMPLES_TOTAL = "trainprof_training_samples_total"
TRAINING_TOKENS_TOTAL = "trainprof_training_tokens_total"
GPU_ASSIGNMENT_INFO = "trainprof_gpu_assignment_info"

# kernel profile windows (trainprof.start(kernel_profile=...))
KERNEL_PROFILE_WINDOWS_TOTAL = "trainprof_kernel_profile_windows_total"
KERNEL_PROFILED_STEPS_TOTAL = "trainprof_kernel_profiled_steps_total"
KERNEL_PROFILE_OVERHEAD_SECONDS_TOTAL = "trainprof_kernel_profile_overhead_seconds_total"
KERNEL_LAST_WINDOW_TIMESTAMP_SECONDS = "trainprof_kernel_last_window_timestamp_seconds"
KERNEL_GPU_INFO = "trainprof_kernel_gpu_info"
KERNEL_SPAN_SECONDS_TOTAL = "trainprof_kernel_span_seconds_total"
KERNEL_GPU_IDLE_SECONDS_TOTAL = "trainprof_kernel_gpu_idle_seconds_total"
KERNEL_GPU_BUSY_SECONDS_TOTAL = "trainprof_kernel_gpu_busy_seconds_total"
KERNEL_STEP_WINDOW_SECONDS_TOTAL = "trainprof_kernel_step_window_seconds_total"
KERNEL_STEP_IDLE_SECONDS_TOTAL = "trainprof_kernel_step_idle_seconds_total"
KERNEL_SECONDS_TOTAL = "trainprof_kernel_seconds_total"
KERNEL_LAUNCHES_TOTAL = "trainprof_kernel_launches_total"
KERNEL_ACTIVITY_SECONDS_TOTAL = "trainprof_kernel_activity_seconds_total"
KERNEL_PRECISION_SECONDS_TOTAL = "trainprof_kernel_precision_seconds_total"
KERNEL_MEMCPY_BYTES_TOTAL = "trainprof_kernel_memcpy_bytes_total"
KERNEL_MEMCPY_PAGEABLE_SECONDS_TOTAL = "trainprof_kernel_memcpy_pageable_seconds_total"
KERNEL_LAUNCH_LATENCY_SECONDS = "trainprof_kernel_launch_latency_seconds"
KERNEL_HOST_DEVICE_BUSY_SECONDS_TOTAL = "trainprof_kernel_host_device_busy_seconds_total"
KERNEL_CPU_OP_SECONDS_TOTAL = "trainprof_kernel_cpu_op_seconds_total"
INSTRUMENTATION_ERRORS_TOTAL = "trainprof_instrumentation_errors_total"

_TENSOR = ("collection", "tensor", "aggregate")
_HEALTH = "health"


def _tensor_gauge(name, unit, what, used_by=()):
    return _m(
        name,
        "gauge",
        unit,
        _TENSOR,
        f"{what} at the tensor's latest save; per collection the smallest (aggregate=min) and "
        "largest (aggregate=max) over its tensors, per tensor (aggregate empty) only for "
        "tensors matching include_regex.",
        "training",
        _HEALTH,
        used_by,
    )


HEALTH_METRICS: tuple[Metric, ...] = (
    _m(
        TENSOR_SAVES_TOTAL,
        "counter",
        "",
        (),
        "Steps at which the watched tensors were saved (reduced and published).",
        "training",
        _HEALTH,
    ),
    _m(
        TENSOR_LAST_SAVE_STEP,
        "gauge",
        "",
        (),
        "Training step of the latest save of the watched tensors.",
        "training",
        _HEALTH,
        ("PoorWeightInitialization", "SimilarAcrossRuns"),
    ),
    _m(
        TENSOR_LAST_SAVE_TIMESTAMP_SECONDS,
        "gauge",
        "seconds",
        (),
        "Unix time of the latest save of the watched tensors or of a logged loss.",
        "training",
        _HEALTH,
        ("StalledTrainingRule",),
    ),
    _m(
        TENSOR_SERIES_CUT,
        "gauge",
        "",
        ("collection",),
        "Tensors matching include_regex beyond the per-tensor series cap, published only in "
        "their collection's aggregates.",
        "training",
        _HEALTH,
    ),
    _tensor_gauge(TENSOR_MEAN_ABS, "", "Mean absolute value", used_by=("VanishingGradient",)),
    _tensor_gauge(TENSOR_NAN_VALUES, "", "Number of NaN elements", used_by=("ExplodingTensor",)),
    _tensor_gauge(
        TENSOR_INF_VALUES,
        "",
        "Number of infinite elements",
        used_by=("ExplodingTensor",),
    ),
    _tensor_gauge(
        TENSOR_ZERO_RATIO,
        "ratio",
        "Fraction of elements equal to zero",
        used_by=("AllZero",),
    ),
    _tensor_gauge(
        TENSOR_VARIANCE,
        "",
        "Population variance (ddof 0)",
        used_by=("TensorVariance", "PoorWeightInitialization"),
    ),
    _tensor_gauge(TENSOR_L1_NORM, "", "L1 norm"),
    _tensor_gauge(TENSOR_L2_NORM, "", "L2 norm", used_by=("SimilarAcrossRuns",)),
    _tensor_gauge(
        TENSOR_UPDATE_RATIO,
        "",
        "L2 norm of the optimizer step's change over the weights' L2 norm (plus 1e-9)",
        used_by=("WeightUpdateRatio",),
    ),
    _tensor_gauge(
        TENSOR_UNCHANGED_SAVES,
        "",
        "Consecutive earlier saves the tensor is allclose to (rtol 1e-5, atol 1e-8 unless "
        "watch() is given others)",
        used_by=("UnchangedTensor",),
    ),
    _tensor_gauge(
        TENSOR_DEAD_UNIT_RATIO,
        "ratio",
        "Fraction of a layer's units (channels) active (> 0) in fewer than 1 % of the "
        "batch's positions",
        used_by=("DeadRelu",),
    ),
    _tensor_gauge(
        TENSOR_SATURATED_UNIT_RATIO,
        "ratio",
        "Fraction of a tanh/sigmoid layer's units whose input lies inside the bounds in fewer "
        "than 1 % of the batch's positions",
        used_by=("SaturatedActivation",),
    ),
    _tensor_gauge(
        TENSOR_PERCENTILE_SPREAD,
        "",
        "95th minus 5th percentile of the elements (gradients only)",
        used_by=("PoorWeightInitialization",),
    ),
    _m(
        TRAINING_LOSS,
        "gauge",
        "",
        ("mode",),
        "The latest saved loss of a mode (trainprof.log_loss, the framework callbacks).",
        "training",
        _HEALTH,
        ("ExplodingTensor", "Overfit"),
    ),
    _m(
        TRAINING_LOSS_STEP,
        "gauge",
        "",
        ("mode",),
        "Training step of the latest saved loss of a mode.",
        "training",
        _HEALTH,
        ("Overfit",),
    ),
    _m(
        TRAINING_LOSS_EVALUATED,
        "gauge",
        "",
        ("mode", "num_steps"),
        "LossNotDecreasing's evaluated loss: the saved loss at the latest step at least "
        "num_steps after the previous evaluation that has a saved loss num_steps or more "
        "steps before it.",
        "training",
        _HEALTH,
        ("LossNotDecreasing",),
    ),
    _m(
        TRAINING_LOSS_BASELINE,
        "gauge",
        "",
        ("mode", "num_steps"),
        "LossNotDecreasing's baseline: the newest saved loss at a step at least num_steps "
        "before the evaluated loss's step.",
        "training",
        _HEALTH,
        ("LossNotDecreasing",),
    ),
    _m(
        TRAINING_LOSS_SAVES_SINCE_IMPROVEMENT,
        "gauge",
        "",
        ("mode",),
        "Saved losses of a mode since the best one improved by more than delta (0.01 unless "
        "watch() is given another).",
        "training",
        _HEALTH,
        ("Overtraining", "PoorWeightInitialization"),
    ),
    _m(
        TRAINING_METRIC,
        "gauge",
        "",
        ("metric", "mode"),
        "The latest value of a metric logged with trainprof.log_metric (at most 32 names).",
        "training",
        _HEALTH,
    ),
    _m(
        CLASSIFICATION_SAMPLES_TOTAL,
        "counter",
        "",
        ("label_class", "predicted_class"),
        "Saved samples by true and predicted class: the confusion matrix (classes beyond 20 "
        'are counted as class "other").',
        "training",
        _HEALTH,
        ("ClassImbalance",),
    ),
    _m(
        CLASSIFICATION_SAVED_SAMPLES,
        "gauge",
        "",
        ("label_class", "predicted_class"),
        "The latest save's samples by true and predicted class: the confusion matrix of one "
        "saved step, which Confusion judges (SageMaker invoked it at each saved step).",
        "training",
        _HEALTH,
        ("Confusion",),
    ),
    _m(
        INPUT_SAMPLES_TOTAL,
        "counter",
        "",
        (),
        "Saved input samples (images) whose channels are averaged in trainprof_input_channel_mean.",
        "training",
        _HEALTH,
        ("CheckInputImages",),
    ),
    _m(
        INPUT_CHANNEL_MEAN,
        "gauge",
        "",
        ("channel",),
        "Mean value of one input channel over all saved input samples (at most 16 channels).",
        "training",
        _HEALTH,
        ("CheckInputImages",),
    ),
    _m(
        INPUT_TOKENS_TOTAL,
        "counter",
        "",
        (),
        "Token positions in the saved input sequences.",
        "training",
        _HEALTH,
        ("NLPSequenceRatio",),
    ),
    _m(
        INPUT_TOKEN_MATCHES_TOTAL,
        "counter",
        "",
        ("token",),
        "Token positions in the saved input sequences equal to a watched token value "
        "(default 0, the usual padding id).",
        "training",
        _HEALTH,
        ("NLPSequenceRatio",),
    ),
    _m(
        XGBOOST_FEATURE_IMPORTANCE_TOP_RATIO,
        "gauge",
        "ratio",
        ("top",),
        "Share of the total feature importance held by the `top` most important features "
        "(top 1 to 10).",
        "training",
        _HEALTH,
        ("FeatureImportanceOverweight",),
    ),
    _m(
        XGBOOST_TREE_DEPTH,
        "gauge",
        "",
        (),
        "Depth of the deepest tree of the booster (root at depth 0).",
        "training",
        _HEALTH,
        ("TreeDepth",),
    ),
)

_GPU = ("gpu", "uuid")
_SYSTEM_USAGE = "OverallSystemUsage"

# The percentiles since the exporter started that OverallSystemUsage records per node.
USAGE_QUANTILES = (0.5, 0.95, 0.99)


def usage_quantiles_of(histogram: str) -> str:
    """The summary serving a node histogram's USAGE_QUANTILES.

    >>> usage_quantiles_of("trainprof_cpu_utilization_sampled_ratio")
    'trainprof_cpu_utilization_quantile_ratio'
    """
    return histogram.replace("_sampled_ratio", "_quantile_ratio")


def _usage_quantiles(histogram: str, collector: str) -> Metric:
    return _m(
        usage_quantiles_of(histogram),
        "summary",
        "ratio",
        (),
        f"{histogram} as a summary: its 0.5, 0.95 and 0.99 quantiles since the exporter "
        "started, as histogram_quantile() computes them from its buckets (served so that a "
        "fleet's rules need not read every bucket), and its sum and count.",
        "exporter",
        collector,
        (_SYSTEM_USAGE,),
    )


# The summaries OverallSystemUsage reads, named after their histograms.
CPU_UTILIZATION_QUANTILE_RATIO = usage_quantiles_of(CPU_UTILIZATION_SAMPLED_RATIO)
CPU_IOWAIT_QUANTILE_RATIO = usage_quantiles_of(CPU_IOWAIT_SAMPLED_RATIO)
MEMORY_USED_QUANTILE_RATIO = usage_quantiles_of(MEMORY_USED_SAMPLED_RATIO)
NODE_GPU_UTILIZATION_QUANTILE_RATIO = usage_quantiles_of(NODE_GPU_UTILIZATION_SAMPLED_RATIO)
NODE_GPU_MEMORY_USED_QUANTILE_RATIO = usage_quantiles_of(NODE_GPU_MEMORY_USED_SAMPLED_RATIO)


METRICS: tuple[Metric, ...] = (
    # --- exporter health -------------------------------------------------------------------
    _m(
        EXPORTER_BUILD_INFO,
        "gauge",
        "",
        ("version",),
        "Always 1; the trainprof version serving these metrics.",
        "exporter",
        "exporter",
    ),
    _m(
        COLLECTOR_SUCCESS,
        "gauge",
        "",
        ("collector",),
        "1 if the collector's last sample succeeded, 0 if its source failed.",
        "exporter",
        "exporter",
    ),
    _m(
        COLLECTOR_UNAVAILABLE,
        "gauge",
        "",
        ("collector", "reason"),
        "1 while the collector has nothing to read on this host, which is not a failure "
        '(reason="no_nvidia_driver": no NVIDIA driver at all); absent otherwise.',
        "exporter",
        "exporter",
    ),
    _m(
        COLLECTOR_DURATION_SECONDS,
        "gauge",
        "seconds",
        ("collector",),
        "Time the collector's last sample took.",
        "exporter",
        "exporter",
    ),
    _m(
        SAMPLER_INTERVAL_SECONDS,
        "gauge",
        "seconds",
        (),
        "Configured time between two samples: what one SageMaker datapoint lasts.",
        "exporter",
        "exporter",
        ("all system rules",),
    ),
    _m(
        SAMPLES_TOTAL,
        "counter",
        "",
        (),
        "Samples taken since the exporter started (SageMaker's datapoints).",
        "exporter",
        "exporter",
        ("CPUBottleneck", "IOBottleneck"),
    ),
    # --- CPU -----------------------------------------------------------------------------
    _m(CPU_CORES, "gauge", "", (), "Logical CPU cores of the host.", "exporter", "cpu"),
    _m(
        CPU_CORE_UTILIZATION_RATIO,
        "gauge",
        "ratio",
        ("cpu",),
        "Busy fraction of one logical core over the latest sample period.",
        "exporter",
        "cpu",
    ),
    _m(
        CPU_CORE_IOWAIT_RATIO,
        "gauge",
        "ratio",
        ("cpu",),
        "I/O-wait fraction of one logical core over the latest sample period.",
        "exporter",
        "cpu",
    ),
    _m(
        CPU_BUSIEST_CORE_UTILIZATION_RATIO,
        "gauge",
        "ratio",
        (),
        "Busy fraction of the host's busiest core over the latest sample period.",
        "exporter",
        "cpu",
        ("CPUBottleneck",),
    ),
    _m(
        CPU_BUSIEST_CORE_IOWAIT_RATIO,
        "gauge",
        "ratio",
        (),
        "I/O-wait fraction of the core waiting most over the latest sample period.",
        "exporter",
        "cpu",
        ("IOBottleneck",),
    ),
    _m(
        CPU_UTILIZATION_SAMPLED_RATIO,
        "histogram",
        "ratio",
        (),
        "Busy fraction averaged over all cores, one observation per sample.",
        "exporter",
        "cpu",
        ("BatchSize",),
        UTILIZATION_BUCKETS,
    ),
    _usage_quantiles(CPU_UTILIZATION_SAMPLED_RATIO, "cpu"),
    _m(
        CPU_IOWAIT_SAMPLED_RATIO,
        "histogram",
        "ratio",
        (),
        "I/O-wait fraction averaged over all cores, one observation per sample.",
        "exporter",
        "cpu",
        (),
        UTILIZATION_BUCKETS,
    ),
    _usage_quantiles(CPU_IOWAIT_SAMPLED_RATIO, "cpu"),
    _m(
        CPU_BOTTLENECK_SAMPLES_TOTAL,
        "counter",
        "",
        ("cpu_above", "gpu_below"),
        "Samples in which some core was busier than cpu_above while some GPU was less busy "
        "than gpu_below.",
        "exporter",
        "cpu",
        ("CPUBottleneck",),
    ),
    _m(
        IO_BOTTLENECK_SAMPLES_TOTAL,
        "counter",
        "",
        ("iowait_above", "gpu_below"),
        "Samples in which some core's I/O wait was above iowait_above while some GPU was "
        "less busy than gpu_below.",
        "exporter",
        "cpu",
        ("IOBottleneck",),
    ),
    # --- memory, disk, network -------------------------------------------------------------
    _m(
        MEMORY_USED_BYTES,
        "gauge",
        "bytes",
        (),
        "Host memory in use (total minus available) at the latest sample.",
        "exporter",
        "memory",
    ),
    _m(
        MEMORY_TOTAL_BYTES,
        "gauge",
        "bytes",
        (),
        "Host memory installed.",
        "exporter",
        "memory",
    ),
    _m(
        MEMORY_USED_SAMPLED_RATIO,
        "histogram",
        "ratio",
        (),
        "Fraction of host memory in use, one observation per sample.",
        "exporter",
        "memory",
        (),
        UTILIZATION_BUCKETS,
    ),
    _usage_quantiles(MEMORY_USED_SAMPLED_RATIO, "memory"),
    _m(
        DISK_READ_BYTES_TOTAL,
        "counter",
        "bytes",
        ("device",),
        "Bytes read from a whole block device (loop, RAM and partition devices excluded).",
        "exporter",
        "disk",
    ),
    _m(
        DISK_WRITTEN_BYTES_TOTAL,
        "counter",
        "bytes",
        ("device",),
        "Bytes written to a whole block device (loop, RAM and partition devices excluded).",
        "exporter",
        "disk",
    ),
    _m(
        NETWORK_RECEIVE_BYTES_TOTAL,
        "counter",
        "bytes",
        ("device",),
        "Bytes received on a network interface (loopback excluded).",
        "exporter",
        "network",
        (_SYSTEM_USAGE,),
    ),
    _m(
        NETWORK_TRANSMIT_BYTES_TOTAL,
        "counter",
        "bytes",
        ("device",),
        "Bytes sent on a network interface (loopback excluded).",
        "exporter",
        "network",
        (_SYSTEM_USAGE,),
    ),
    # --- GPU -----------------------------------------------------------------------------
    _m(
        GPU_INFO,
        "gauge",
        "",
        _GPU + ("name", "driver_version"),
        "Always 1; static facts of one GPU.",
        "exporter",
        "gpu",
    ),
    _m(
        GPU_UTILIZATION_RATIO,
        "gauge",
        "ratio",
        _GPU,
        "Fraction of the latest sample period in which a kernel ran on the GPU (NVML).",
        "exporter",
        "gpu",
    ),
    _m(
        GPU_UTILIZATION_SAMPLED_RATIO,
        "histogram",
        "ratio",
        _GPU,
        "GPU utilization, one observation per sample.",
        "exporter",
        "gpu",
        ("LowGPUUtilization", "BatchSize", "LoadBalancing"),
        UTILIZATION_BUCKETS,
    ),
    _m(
        NODE_GPU_UTILIZATION_SAMPLED_RATIO,
        "histogram",
        "ratio",
        (),
        "GPU utilization of every GPU of the host pooled, one observation per GPU per sample "
        "(the per-GPU histograms summed, served so a fleet's rules need not sum them).",
        "exporter",
        "gpu",
        (),
        UTILIZATION_BUCKETS,
    ),
    _usage_quantiles(NODE_GPU_UTILIZATION_SAMPLED_RATIO, "gpu"),
    _m(
        GPU_MEMORY_USED_BYTES,
        "gauge",
        "bytes",
        _GPU,
        "GPU framebuffer memory in use at the latest sample.",
        "exporter",
        "gpu",
    ),
    _m(
        GPU_MEMORY_TOTAL_BYTES,
        "gauge",
        "bytes",
        _GPU,
        "GPU framebuffer memory installed.",
        "exporter",
        "gpu",
    ),
    _m(
        GPU_MEMORY_USED_SAMPLED_RATIO,
        "histogram",
        "ratio",
        _GPU,
        "Fraction of GPU memory in use (SageMaker's GPUMemoryUtilization), one observation "
        "per sample.",
        "exporter",
        "gpu",
        ("GPUMemoryIncrease", "BatchSize"),
        UTILIZATION_BUCKETS,
    ),
    _m(
        NODE_GPU_MEMORY_USED_SAMPLED_RATIO,
        "histogram",
        "ratio",
        (),
        "Fraction of GPU memory in use of every GPU of the host pooled, one observation per "
        "GPU per sample.",
        "exporter",
        "gpu",
        (),
        UTILIZATION_BUCKETS,
    ),
    _usage_quantiles(NODE_GPU_MEMORY_USED_SAMPLED_RATIO, "gpu"),
    _m(
        GPU_UTILIZATION_JS_DISTANCE,
        "gauge",
        "",
        _GPU + ("peer_gpu", "peer_uuid"),
        "Jensen-Shannon distance (natural log, 0 to 0.83) between the utilization "
        "distributions of two GPUs of this host, in 2 % bins since the exporter started.",
        "exporter",
        "gpu",
        ("LoadBalancing",),
    ),
    _m(
        GPU_POWER_WATTS,
        "gauge",
        "watts",
        _GPU,
        "GPU power draw at the latest sample.",
        "exporter",
        "gpu",
    ),
    _m(
        GPU_ENERGY_JOULES_TOTAL,
        "counter",
        "joules",
        _GPU,
        "Energy the GPU consumed since the driver loaded.",
        "exporter",
        "gpu",
    ),
    _m(
        GPU_TEMPERATURE_CELSIUS,
        "gauge",
        "celsius",
        _GPU,
        "GPU core temperature at the latest sample.",
        "exporter",
        "gpu",
    ),
    _m(
        GPU_SM_CLOCK_HERTZ,
        "gauge",
        "hertz",
        _GPU,
        "SM clock at the latest sample.",
        "exporter",
        "gpu",
    ),
    _m(
        GPU_SM_ACTIVE_RATIO,
        "gauge",
        "ratio",
        _GPU,
        "Fraction of cycles an SM had a warp resident (NVML GPM; Hopper and newer).",
        "exporter",
        "gpu",
    ),
    _m(
        GPU_SM_OCCUPANCY_RATIO,
        "gauge",
        "ratio",
        _GPU,
        "Resident warps as a fraction of the maximum (NVML GPM; Hopper and newer).",
        "exporter",
        "gpu",
    ),
    _m(
        GPU_TENSOR_ACTIVE_RATIO,
        "gauge",
        "ratio",
        _GPU,
        "Fraction of cycles the tensor pipes were active (NVML GPM; Hopper and newer).",
        "exporter",
        "gpu",
    ),
    _m(
        GPU_DRAM_ACTIVE_RATIO,
        "gauge",
        "ratio",
        _GPU,
        "Fraction of cycles device memory was read or written (NVML GPM; Hopper and newer).",
        "exporter",
        "gpu",
    ),
    # --- training process ------------------------------------------------------------------
    _m(
        TRAINING_INFO,
        "gauge",
        "",
        ("world_size", "node_rank", "restart_count", "framework", "framework_version"),
        "Always 1; facts about this training process.",
        "training",
        "training",
    ),
    _m(
        TRAINING_START_TIMESTAMP_SECONDS,
        "gauge",
        "seconds",
        (),
        "Unix time the training process started.",
        "training",
        "training",
        ("MaxInitializationTime", "OverallFrameworkMetrics"),
    ),
    _m(
        TRAINING_FIRST_STEP_TIMESTAMP_SECONDS,
        "gauge",
        "seconds",
        (),
        "Unix time the first training step began; absent until then.",
        "training",
        "training",
        ("OverallFrameworkMetrics",),
    ),
    _m(
        TRAINING_LAST_STEP_TIMESTAMP_SECONDS,
        "gauge",
        "seconds",
        (),
        "Unix time the latest step ended.",
        "training",
        "training",
        ("StalledTrainingRule",),
    ),
    _m(
        TRAINING_DATALOADER_WORKERS,
        "gauge",
        "",
        (),
        "Worker processes of the data loader trainprof.data() iterates (its num_workers; 0: "
        "it loads in the training process); absent for loaders that do not say.",
        "training",
        "training",
        ("Dataloader",),
    ),
    _m(
        TRAINING_STEPS_TOTAL,
        "counter",
        "",
        ("mode",),
        "Training steps completed, per mode (train, eval, ...).",
        "training",
        "training",
        ("MaxInitializationTime",),
    ),
    _m(
        TRAINING_STEP_DURATION_SECONDS,
        "histogram",
        "seconds",
        ("mode",),
        "Duration of each step.",
        "training",
        "training",
        ("OverallFrameworkMetrics",),
        STEP_DURATION_BUCKETS,
    ),
    _m(
        TRAINING_STEP_OUTLIERS_TOTAL,
        "counter",
        "",
        ("mode", "stddev"),
        "Steps, after the first 100 of their mode, slower than the mean plus stddev standard "
        "deviations of all earlier steps of that mode.",
        "training",
        "training",
        ("StepOutlier",),
    ),
    _m(
        TRAINING_PHASE_SECONDS_TOTAL,
        "counter",
        "seconds",
        ("phase",),
        "Time spent in each phase of the training loop.",
        "training",
        "training",
        ("OverallFrameworkMetrics",),
    ),
    _m(
        TRAINING_SAMPLES_TOTAL,
        "counter",
        "",
        (),
        "Training samples (examples) processed.",
        "training",
        "training",
    ),
    _m(
        TRAINING_TOKENS_TOTAL,
        "counter",
        "",
        (),
        "Tokens processed, as reported by the training loop.",
        "training",
        "training",
    ),
    _m(
        GPU_ASSIGNMENT_INFO,
        "gauge",
        "",
        _GPU,
        "Always 1; a GPU this rank uses, for joining node-level GPU metrics to the job.",
        "training",
        "training",
    ),
    # --- training health (trainprof.torch.watch, trainprof.log_loss) ------------------------
    *HEALTH_METRICS,
    # --- kernel profile windows (trainprof.start(kernel_profile=...)) -------------------------
    _m(
        KERNEL_PROFILE_WINDOWS_TOTAL,
        "counter",
        "",
        ("gpu_activity",),
        "Profiled windows aggregated; gpu_activity=no when the trace held no GPU kernel, "
        "memcpy or memset (a CPU-only run): the GPU series are then absent.",
        "training",
        "kernel_profile",
    ),
    _m(
        KERNEL_PROFILED_STEPS_TOTAL,
        "counter",
        "",
        (),
        "Training steps run under the profiler.",
        "training",
        "kernel_profile",
    ),
    _m(
        KERNEL_PROFILE_OVERHEAD_SECONDS_TOTAL,
        "counter",
        "seconds",
        (),
        "Time the training thread spent starting and stopping the profiler (the export and "
        "aggregation run on a background thread).",
        "training",
        "kernel_profile",
    ),
    _m(
        KERNEL_LAST_WINDOW_TIMESTAMP_SECONDS,
        "gauge",
        "seconds",
        (),
        "Unix time the latest profiled window was aggregated.",
        "training",
        "kernel_profile",
    ),
    _m(
        KERNEL_GPU_INFO,
        "gauge",
        "",
        ("gpu_name", "tensor_cores"),
        "Always 1; the GPU of the profiled windows and whether it has tensor cores "
        "(NVIDIA compute capability 7.0 or later, AMD Instinct gfx9 matrix cores).",
        "training",
        "kernel_profile",
    ),
    _m(
        KERNEL_SPAN_SECONDS_TOTAL,
        "counter",
        "seconds",
        (),
        "Profiled GPU time span: first GPU activity to the last, summed over windows.",
        "training",
        "kernel_profile",
    ),
    _m(
        KERNEL_GPU_IDLE_SECONDS_TOTAL,
        "counter",
        "seconds",
        (),
        "Time within the profiled spans when no kernel, memcpy or memset ran.",
        "training",
        "kernel_profile",
    ),
    _m(
        KERNEL_GPU_BUSY_SECONDS_TOTAL,
        "counter",
        "seconds",
        ("overlap",),
        "GPU busy time split by which classes ran at once (compute, communication, memory "
        "and their combinations such as compute+communication); each instant counted once.",
        "training",
        "kernel_profile",
    ),
    _m(
        KERNEL_STEP_WINDOW_SECONDS_TOTAL,
        "counter",
        "seconds",
        (),
        "Per profiled step, the device time from the first to the last GPU event the step "
        "launched, summed.",
        "training",
        "kernel_profile",
    ),
    _m(
        KERNEL_STEP_IDLE_SECONDS_TOTAL,
        "counter",
        "seconds",
        (),
        "GPU idle time between kernels inside those step windows.",
        "training",
        "kernel_profile",
    ),
    _m(
        KERNEL_SECONDS_TOTAL,
        "counter",
        "seconds",
        ("kernel",),
        "GPU time by kernel (memcpy and memset included): each window's top kernels by "
        "time under a shortened name, the rest under kernel=other.",
        "training",
        "kernel_profile",
    ),
    _m(
        KERNEL_LAUNCHES_TOTAL,
        "counter",
        "",
        ("kernel",),
        "Launches by kernel, with the same kernel labels as trainprof_kernel_seconds_total.",
        "training",
        "kernel_profile",
    ),
    _m(
        KERNEL_ACTIVITY_SECONDS_TOTAL,
        "counter",
        "seconds",
        ("activity",),
        "GPU time by activity: kernel, collective, memcpy_htod, memcpy_dtoh, memcpy_dtod, "
        "memcpy_other, memset, sync.",
        "training",
        "kernel_profile",
    ),
    _m(
        KERNEL_PRECISION_SECONDS_TOTAL,
        "counter",
        "seconds",
        ("precision", "kernel_class"),
        "Kernel time by precision inferred from kernel names (fp64, fp32, tf32, bf16, fp16, "
        "fp8, int8, int, unknown) and class (matmul: GEMM and convolution kernels; other).",
        "training",
        "kernel_profile",
    ),
    _m(
        KERNEL_MEMCPY_BYTES_TOTAL,
        "counter",
        "bytes",
        ("activity",),
        "Bytes copied by memcpy, by direction (memcpy_htod, memcpy_dtoh, ...).",
        "training",
        "kernel_profile",
    ),
    _m(
        KERNEL_MEMCPY_PAGEABLE_SECONDS_TOTAL,
        "counter",
        "seconds",
        (),
        "Time of host-device copies through pageable (not pinned) host memory.",
        "training",
        "kernel_profile",
    ),
    _m(
        KERNEL_LAUNCH_LATENCY_SECONDS,
        "histogram",
        "seconds",
        (),
        "Host launch call start to device start, per kernel, memcpy or memset.",
        "training",
        "kernel_profile",
        (),
        LAUNCH_LATENCY_BUCKETS,
    ),
    _m(
        KERNEL_HOST_DEVICE_BUSY_SECONDS_TOTAL,
        "counter",
        "seconds",
        ("side",),
        "CPU-GPU overlap in profiled windows: time the host ran operators (side=cpu), the "
        "GPU ran anything (side=gpu), and both at once (side=both).",
        "training",
        "kernel_profile",
    ),
    _m(
        KERNEL_CPU_OP_SECONDS_TOTAL,
        "counter",
        "seconds",
        ("op",),
        "Host time of each window's top operators (aten::mm, ...; inclusive of the "
        "operators they call), the rest under op=other.",
        "training",
        "kernel_profile",
    ),
    _m(
        INSTRUMENTATION_ERRORS_TOTAL,
        "counter",
        "",
        (),
        "Exceptions raised inside trainprof instrumentation and kept from the training loop.",
        "training",
        "training",
    ),
)

BY_NAME = {m.name: m for m in METRICS}


def metric(name: str) -> Metric:
    """The contract entry for `name`; a KeyError names the close matches."""
    try:
        return BY_NAME[name]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(name, BY_NAME, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"{name} is not in the metric contract{hint}") from None


def series_names(m: Metric) -> tuple[str, ...]:
    """The sample names a metric appears under in an exposition."""
    if m.type == "histogram":
        return (m.name + "_bucket", m.name + "_sum", m.name + "_count")
    if m.type == "summary":
        return (m.name, m.name + "_sum", m.name + "_count")
    return (m.name,)
