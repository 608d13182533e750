"""TreeDepth from a SageMaker Debugger trial: the XGBoost hook's `trees` collection (the
`trees_to_dataframe` columns of each saved round's tree) read back into trees, measured
on the trees themselves, and damaged columns skipped and reported."""

from __future__ import annotations

import numpy as np
import pytest

from trainprof.replay.smdebug import fold, read_trial
from trainprof.replay.tensors import replay_trial
from trainprof.rules.config import load_config
from trainprof.training.health.trees import DamagedTrees, tree_depth, trees_from_columns

from smdebug_writer import write_trial, xgboost_trees

CONFIG = load_config({"rules": [{"rule": "TreeDepth"}]})
LEAVES = np.full(5, "nan")  # Yes/No of five leaves


def chain(tree: int, splits: int) -> dict[str, np.ndarray]:
    """A tree whose every split sends `yes` to a leaf and `no` one level down, numbered as
    XGBoost's lossguide policy numbers nodes (in the order they are made): node ids reach
    only 2 x splits, so log2 of the largest id (3 for 4 splits) is not its depth (4)."""
    nodes, yes, no, feature = [], [], [], []
    for level in range(splits):
        split, leaf, below = 2 * level, 2 * level + 1, 2 * level + 2
        nodes += [split, leaf]
        yes += [f"{tree}-{leaf}", "nan"]
        no += [f"{tree}-{below}", "nan"]
        feature += ["f0", "Leaf"]
    nodes.append(2 * splits)
    yes.append("nan")
    no.append("nan")
    feature.append("Leaf")
    order = np.argsort(nodes)
    n = len(nodes)
    columns = {
        "Tree": np.full(n, tree, dtype=np.int64),
        "Node": np.array(nodes, dtype=np.int64),
        "ID": np.array([f"{tree}-{i}" for i in nodes]),
        "Feature": np.array(feature),
        "Yes": np.array(yes),
        "No": np.array(no),
        "Missing": np.array(no),
        "Gain": np.ones(n),
        "Cover": np.ones(n),
    }
    return {f"trees/{k}": v[order] for k, v in columns.items()}


def bare(columns: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k.removeprefix("trees/"): v for k, v in columns.items()}


def test_depth_is_measured_on_the_tree_not_as_log2_of_its_largest_node_id(tmp_path):
    columns = chain(0, 4)
    assert int(np.log2(columns["trees/Node"].max())) == 3
    assert [tree_depth(root) for root in trees_from_columns(bare(columns)).values()] == [4]
    # without a collections file the reader knows the hook's tensor names
    trial = read_trial(write_trial(tmp_path / "t", {0: columns}))
    assert [s.state.tree_depth for s in fold(trial)] == [4.0]


def test_a_single_leaf_is_depth_0_and_the_deepest_saved_tree_so_far_is_kept(tmp_path):
    leaf = chain(0, 0)
    trial = read_trial(write_trial(tmp_path / "t", {0: leaf, 1: chain(1, 2), 2: chain(2, 1)}))
    assert [s.state.tree_depth for s in fold(trial)] == [0.0, 2.0, 2.0]


def test_a_column_saved_twice_at_a_step_is_two_workers_trees(tmp_path):
    root = write_trial(tmp_path / "t", {3: chain(3, 1)}, worker="worker_0")
    write_trial(root, {3: chain(3, 3)}, worker="worker_1")
    trial = read_trial(root)
    assert [s.state.tree_depth for s in fold(trial)] == [3.0]
    assert not [p for p in trial.problems if "trees" in p]


def test_the_writer_saves_the_rows_xgboost_trees_to_dataframe_gives():
    xgboost = pytest.importorskip("xgboost")
    pytest.importorskip("pandas")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 4))
    y = (x.sum(axis=1) > 0).astype(float)
    booster = xgboost.train(
        {"max_depth": 3, "nthread": 1}, xgboost.DMatrix(x, label=y), num_boost_round=3
    )
    frame = booster.trees_to_dataframe()
    saved = xgboost_trees(booster, 2)
    rows = frame[frame.Tree == 2].reset_index(drop=True)
    for name in ("Tree", "Node", "ID", "Feature", "Yes", "No", "Missing"):
        assert [str(v) for v in rows[name]] == [str(v) for v in saved[f"trees/{name}"]], name
    for name in ("Split", "Gain", "Cover"):
        np.testing.assert_allclose(rows[name].to_numpy(float), saved[f"trees/{name}"], 1e-6)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda c: c.pop("No"), "missing column(s) No"),
        (lambda c: c.update(Node=c["Node"][:-1]), "columns of different lengths"),
        (lambda c: c.update(Node=c["Node"].astype(float) + 0.5), "not a node or tree number"),
        (lambda c: c.update(Yes=np.where(c["Yes"] == "0-1", "0-x", c["Yes"])), "0-x"),
        (lambda c: c.update(Yes=np.where(c["Yes"] == "0-1", "0-99", c["Yes"])), "not in its"),
        (lambda c: c.update(Yes=np.where(c["Yes"] == "0-1", "7-1", c["Yes"])), "not in its"),
        (lambda c: c.update(Yes=np.where(c["Yes"] == "0-3", "0-1", c["Yes"])), "two parents"),
        (lambda c: c.update(Yes=np.where(c["Yes"] == "0-3", "0-0", c["Yes"])), "the root"),
        (lambda c: c.update(Node=np.where(c["Node"] == 0, 2, c["Node"])), "listed twice"),
        (lambda c: c.update(Yes=np.array(["0-9"] + ["nan"] * 4)), "0-9, not in its tree"),
        (lambda c: c.update(Node=c["Node"] + 10, Yes=LEAVES, No=LEAVES), "tree 0 has no root"),
    ],
)
def test_damaged_columns_name_what_is_wrong(damage, message):
    columns = bare(chain(0, 2))
    damage(columns)
    with pytest.raises(DamagedTrees, match=message.replace("(", r"\(").replace(")", r"\)")):
        trees_from_columns(columns)


def test_a_loop_away_from_the_root_does_not_hang_the_walk():
    columns = bare(chain(0, 1))  # nodes 0 (split), 1 and 2 (leaves)
    columns["Tree"] = np.append(columns["Tree"], [0, 0])
    columns["Node"] = np.append(columns["Node"], [5, 6])
    for name, extra in (("Yes", ["0-6", "0-5"]), ("No", ["nan", "nan"])):
        columns[name] = np.append(columns[name], extra)
    columns = {k: v for k, v in columns.items() if k in ("Tree", "Node", "Yes", "No")}
    assert tree_depth(trees_from_columns(columns)[0]) == 1


def test_damaged_trees_steps_are_skipped_and_reported_the_rest_is_judged(promtool, tmp_path):
    missing = chain(0, 5)
    del missing["trees/No"]
    uneven = chain(1, 5)
    uneven["trees/Node"] = uneven["trees/Node"][:-2]
    steps = {0: missing, 1: uneven, 2: chain(2, 1), 3: chain(3, 2)}
    result = replay_trial(str(write_trial(tmp_path / "job", steps)), CONFIG)
    verdict = result.rules["TreeDepth"]
    # steps 0 and 1 (deep trees: the deepest so far would stay >= 4) are skipped, so the
    # shallow trees of steps 2 and 3 fire
    assert verdict.fired and verdict.first_fired_step == 2
    notes = "\n".join(result.notes)
    assert "missing column(s) No" in notes and "events/000000000000" in notes
    assert "columns of different lengths" in notes and "events/000000000001" in notes
    assert "Node 9, the others 11" in notes and "events/000000000002" not in notes


def test_a_trial_of_deep_trees_is_quiet_and_one_of_only_damaged_trees_is_not_judged(
    promtool, tmp_path
):
    deep = replay_trial(str(write_trial(tmp_path / "deep", {0: chain(0, 5)})), CONFIG)
    assert not deep.rules["TreeDepth"].fired
    broken = chain(0, 1)
    del broken["trees/Tree"]
    damaged = replay_trial(str(write_trial(tmp_path / "damaged", {0: broken})), CONFIG)
    assert not damaged.rules["TreeDepth"].fired
    assert any("missing column(s) Tree" in n for n in damaged.notes)
