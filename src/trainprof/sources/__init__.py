"""Source adapters: recording rules that put dcgm-exporter's and node_exporter's series in
trainprof's units and labels, so a cluster that already runs them needs no second poller.

>>> groups = adapter_groups(("dcgm", "node_exporter"), SourceOptions(node_label="instance"))
>>> [(g["name"], g["interval"], len(g["rules"])) for g in groups]
[('trainprof.sources.devices', '1m', 13), ('trainprof.sources.inventory', '5m', 14), \
('trainprof.sources', '15s', 26)]

With dcgm, `trainprof.sources.devices` (every four scrapes, at most a minute apart) folds
dcgm-exporter's label spellings once into a map from each of its series to trainprof's
labels and the job its GPU works for, records each job GPU's framebuffer use for dashboards
and the report, and holds the `TrainprofRuleInputMissing` alerts naming absent dcgm series;
`trainprof.sources.inventory` (every 20 scrapes, at most five minutes apart) records every
device in trainprof's labels for dashboards and queries, and each device's framebuffer size.
`trainprof.sources` (every scrape) joins dcgm-exporter's utilization to the job map (no label
is rewritten per scrape), takes node_exporter's rates and ratios, and names an absent
node_exporter series. An input missing for some GPUs or nodes is one alert per job, which
counts them in `<scope>:trainprof_health_rule_input_missing:affected` (docs/alerting.md).
The per-GPU rules read dcgm-exporter's framebuffer samples themselves,
joined to the job map at their own evaluation (`gauges.from_samples`). Chained recordings
stay in one group, ordered, so Prometheus, Thanos Ruler, Mimir and vmalert evaluate them
alike; the other groups read the maps as of their last evaluation. The `trainprof` source
needs no normalisation: its exporter already serves trainprof's names.
"""

from trainprof.sources.groups import (
    DEVICE_GROUP,
    GROUP,
    INVENTORY_GROUP,
    adapter_groups,
    default_rules_text,
    device_group,
    inventory_group,
    normalisation_group,
)
from trainprof.sources.options import SOURCES, SourceOptions, parse_sources, signal_sources

__all__ = [
    "DEVICE_GROUP",
    "GROUP",
    "INVENTORY_GROUP",
    "SOURCES",
    "SourceOptions",
    "adapter_groups",
    "default_rules_text",
    "device_group",
    "inventory_group",
    "normalisation_group",
    "parse_sources",
    "signal_sources",
]
