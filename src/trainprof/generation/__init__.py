"""Generation: the committed artifacts (rules, dashboards, alerting, docs, schemas)
and `trainprof export`, all from one generator."""
