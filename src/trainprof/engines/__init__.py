"""Rule engines trainprof drives: promtool as a batch engine, a local Prometheus and
Alertmanager on 127.0.0.1, and the client of Prometheus' HTTP API (`prometheus_api`) that
reads any Prometheus."""
