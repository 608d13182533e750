"""Template snippets shared by the alert descriptions."""

JOB = '{{ or $labels.training_job "(no training_job label)" }}'
HOST = "{{ or $labels.node $labels.instance }}"
GPU = f"GPU {{{{ $labels.gpu }}}} on {HOST}"
PCT = "{{ $value | humanizePercentage }}"
# Naming one unit of a per-unit alert from a query result (trainprof.rules.job_alerts).
RANK_NAME = "rank {{ .Labels.rank }} on {{ or .Labels.node .Labels.instance }}"
