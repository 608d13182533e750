#!/bin/sh
# The fleet table of issue 30: every row of rules_at_scale.py at 1,000 nodes x 8 GPUs x 64
# cores in 100 jobs, every GPU of every job affected, the shipped 60 s scan, one run after
# the other (about 15 minutes each, 2 h 15 min in all), with the machine's load average
# logged every minute beside them. Only a quiet machine gives numbers worth quoting: check
# that load.log stays under about 1.5 plus the run's own load (1 to 2 on two cores).
#
#     sh benchmarks/fleet_table.sh [OUT]      (default OUT: /tmp/fleet-table-<date>/)
#
# Each row's output is OUT/<row>.txt; its last lines are the rules' own CPU per 15 s and the
# engine's ingestion CPU for the same series (per server with --shards).
set -eu
cd "$(dirname "$0")/.."
out=${1:-/tmp/fleet-table-$(date +%Y%m%d-%H%M)}
mkdir -p "$out"
python=${PYTHON:-.venv/bin/python}
(while :; do echo "$(date +%H:%M:%S) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 60; done) \
    >"$out/load.log" &
logger=$!
trap 'kill $logger' EXIT
row() {
    name=$1
    shift
    echo "$(date +%H:%M:%S) $name: $*" | tee -a "$out/load.log"
    "$python" benchmarks/rules_at_scale.py --scan 60s "$@" >"$out/$name.txt" 2>&1
    tail -n 6 "$out/$name.txt"
}
row prometheus-trainprof --source trainprof
row prometheus-dcgm --source dcgm
row prometheus-dcgm-node_exporter --source dcgm,node_exporter
row prometheus-dcgm-node_exporter-2-shards --source dcgm,node_exporter --shards 2
row vmalert-trainprof --source trainprof --engine victoriametrics
row vmalert-dcgm --source dcgm --engine victoriametrics
row vmalert-dcgm-node_exporter --source dcgm,node_exporter --engine victoriametrics
