"""Rule engines trainprof drives: promtool as a batch engine, and a local Prometheus and
Alertmanager on 127.0.0.1."""
