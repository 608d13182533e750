"""StopTraining for trainprof: an Alertmanager webhook receiver that stops training jobs.

SageMaker Debugger could stop a training job when a rule fired. `trainprof actions serve`
does it for alerts routed to it: it signals a local process (by PID file or process group) or
suspends or deletes a Kubernetes Job, PyTorchJob or JobSet, for the rules a configuration opts
into, and only in allow-listed namespaces and jobs. Dry run by default; every decision goes to
an audit log.

    config.py      the receiver's configuration, checked all at once
    payload.py     Alertmanager's webhook payload (v4), read strictly
    decide.py      one decision per alert, applied at most once
    local.py       signals to local processes
    kubernetes.py  the REST calls, and the RBAC they need
    audit.py       JSON-lines audit log
    server.py      authentication, limits, HTTP status codes
    cli.py         `trainprof actions serve | check | rbac`
"""
