"""`trainprof compare`: what changed between two runs, and SageMaker's verdicts beside
trainprof's.

    trainprof compare before/ after/ -o compare.html --json compare.json
    trainprof compare bert-v1 bert-v2 --prometheus http://prometheus:9090
    trainprof compare before.pt.trace.json.gz after.pt.trace.json.gz
    trainprof compare --sagemaker s3-copy/my-job/

Each run's numbers come from the profiling report's collection (`report.collect`: the job
dashboard's queries, against Prometheus or over a replay) plus a few of its own
(`compare.queries`); `figures` reads one run's, `runs` compares two into the JSON contract
(docs/compare.md), `traces` diffs two Kineto traces as Holistic Trace Analysis does,
`sagemaker` reads SageMaker's ProfilerReport verdicts, and `page` and `table` show the result.
"""

from trainprof.compare.runs import VERSION, Comparison, compare_runs

__all__ = ["VERSION", "Comparison", "compare_runs"]
