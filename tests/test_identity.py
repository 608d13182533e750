"""Identity: explicit arguments, then the launcher's environment, then defaults."""

from __future__ import annotations

import pytest

from trainprof.training.identity import resolve

TORCHRUN = {
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "TORCHELASTIC_RESTART_COUNT": "2",
    "TORCHELASTIC_RUN_ID": "run-7",
}
SLURM = {
    "SLURM_PROCID": "9",
    "SLURM_LOCALID": "3",
    "SLURM_NTASKS": "16",
    "SLURM_NTASKS_PER_NODE": "4(x4)",
    "SLURM_NODEID": "2",
    "SLURMD_NODENAME": "gpu-17",
    "SLURM_JOB_NAME": "llama",
    "SLURM_JOB_ID": "4242",
}


def test_torchrun_environment():
    ident = resolve(env=TORCHRUN, hostname="host-a")
    assert ident.labels() == {
        "training_job": "run-7",
        "node": "host-a",
        "rank": "5",
        "local_rank": "1",
    }
    assert ident.info() == {"world_size": "8", "node_rank": "1", "restart_count": "2"}
    assert ident.local_world_size == 4
    assert ident.sources["rank"] == "RANK"


def test_slurm_environment():
    ident = resolve(env=SLURM, hostname="ignored")
    assert ident.labels() == {
        "training_job": "llama-4242",
        "node": "gpu-17",
        "rank": "9",
        "local_rank": "3",
    }
    assert (ident.world_size, ident.local_world_size, ident.node_rank) == (16, 4, 2)


def test_torchrun_under_slurm_wins_for_ranks():
    ident = resolve(env={**SLURM, **TORCHRUN}, hostname="h")
    assert (ident.rank, ident.local_rank) == (5, 1)
    assert ident.training_job == "llama-4242"  # SLURM's job name before the run id


def test_trainprof_variables_beat_the_launcher():
    env = {**SLURM, "TRAINPROF_JOB": "named", "TRAINPROF_NODE": "rack3-n2"}
    assert resolve(env=env).labels()["training_job"] == "named"
    assert resolve(env=env).labels()["node"] == "rack3-n2"


def test_explicit_arguments_beat_everything():
    env = {**TORCHRUN, "TRAINPROF_JOB": "env-job", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    ident = resolve(
        training_job="arg-job", node="arg-node", rank=0, local_rank=0, world_size=1, env=env
    )
    assert ident.labels() == {
        "training_job": "arg-job",
        "node": "arg-node",
        "rank": "0",
        "local_rank": "0",
    }
    assert ident.sources["training_job"] == "argument"


def test_inside_kubernetes_job_and_node_are_left_to_relabelling():
    env = {**TORCHRUN, **SLURM, "KUBERNETES_SERVICE_HOST": "10.0.0.1"}
    ident = resolve(env=env, hostname="pod-xyz")
    assert "training_job" not in ident.labels() and "node" not in ident.labels()
    assert ident.labels()["rank"] == "5"
    assert ident.sources["node"] == "scrape relabelling (Kubernetes)"


def test_inside_kubernetes_without_a_rank_variable_the_pod_index_is_left_to_relabelling():
    ident = resolve(env={"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, hostname="pod-xyz")
    assert ident.labels() == {"local_rank": "0"}
    outside = resolve(env={}, hostname="pod-xyz")
    assert outside.labels()["rank"] == "0"


def test_inside_kubernetes_the_downward_api_variables_still_count():
    env = {
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "TRAINPROF_NODE": "node-a",
        "TRAINPROF_JOB": "pytorchjob-1",
    }
    assert resolve(env=env).labels()["node"] == "node-a"
    assert resolve(env=env).labels()["training_job"] == "pytorchjob-1"


def test_defaults_outside_any_launcher():
    ident = resolve(env={}, hostname="laptop")
    assert ident.labels() == {"node": "laptop", "rank": "0", "local_rank": "0"}
    assert ident.info() == {"world_size": "1", "node_rank": "", "restart_count": "0"}


def test_torchrun_placeholder_run_id_is_not_a_job_name():
    assert resolve(env={"TORCHELASTIC_RUN_ID": "none"}, hostname="h").training_job is None


@pytest.mark.parametrize("raw", ["", "abc", "-1", "1.5", "3x"])
def test_unusable_numbers_fall_through_to_the_next_source(raw):
    ident = resolve(env={"RANK": raw, "SLURM_PROCID": "4"}, hostname="h")
    assert ident.rank == 4
    assert bool(ident.problems) == bool(raw)


def test_unusable_arguments_are_reported_not_raised():
    ident = resolve(rank="zero", env={"RANK": "2"}, hostname="h")  # type: ignore[arg-type]
    assert ident.rank == 2
    assert "rank argument='zero'" in ident.problems[0]


def test_long_and_hostile_values_are_bounded():
    ident = resolve(env={"TRAINPROF_JOB": "j" * 10_000 + "\udcff"}, hostname="h\nx")
    labels = ident.labels()
    assert len(labels["training_job"]) == 128
    assert labels["node"] == "h\nx"  # escaped by the exposition, not altered here
