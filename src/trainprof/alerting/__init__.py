"""Alertmanager routing for trainprof's alerts, derived from the rule catalog.

`routing` decides (which severity pages, what inhibits what, which receiver each alert
reaches); `model` holds routes and inhibit rules and writes them in Alertmanager's own
configuration format or as a prometheus-operator AlertmanagerConfig; `files` renders the
committed artifacts under `alerting/` and `docs/alerting.md`.
"""
