"""Depth of XGBoost trees, the one definition TreeDepth uses live and in replay.

A tree's depth is the number of splits on its longest root-to-leaf path (a single leaf is
depth 0), measured on the tree itself. Live, the XGBoost callback reads the booster's JSON
dump (`tree_depth`); in replay, SageMaker Debugger's `trees` collection holds the same
trees as the columns of XGBoost's `trees_to_dataframe` (`trees/Tree`, `trees/Node`,
`trees/Yes`, `trees/No`, ...), which `trees_from_columns` turns back into that JSON shape.

    >>> leaf = {"leaf": 0.1}
    >>> tree_depth({"children": [leaf, {"children": [leaf, leaf]}]})
    2
    >>> columns = {"Tree": [3, 3, 3], "Node": [0, 1, 2],
    ...            "Yes": ["3-1", "nan", "nan"], "No": ["3-2", "nan", "nan"]}
    >>> {tree: tree_depth(root) for tree, root in trees_from_columns(columns).items()}
    {3: 1}
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any

# The columns a tree's shape is read from; the others (Feature, Split, Gain, ...) are not
# needed for its depth, but must be as long as these.
TREE_COLUMNS = ("Tree", "Node", "Yes", "No")
_REFERENCE = re.compile(r"[0-9]+-[0-9]+")


class DamagedTrees(ValueError):
    """The saved columns do not describe trees; the message says what is wrong."""


def tree_depth(node: Mapping[str, Any]) -> int:
    """Depth of a tree of XGBoost's JSON dump (nodes with `children`): 0 for a single leaf."""
    depth, stack = 0, [(node, 0)]
    while stack:
        current, d = stack.pop()
        depth = max(depth, d)
        stack.extend((child, d + 1) for child in current.get("children") or ())
    return depth


def trees_from_columns(columns: Mapping[str, Collection[Any]]) -> dict[int, dict]:
    """The trees held by `trees_to_dataframe`-style columns, by tree number, each as the
    root of XGBoost's JSON dump shape (`{"nodeid": 0, "children": [...]}`).

    Raises DamagedTrees for a missing column, columns of different lengths, a node number
    or child reference that is not a number, a node listed twice, a child that is not in
    its tree or has two parents, or a tree without its root (node 0).
    """
    missing = [c for c in TREE_COLUMNS if c not in columns]
    if missing:
        raise DamagedTrees(f"missing column(s) {', '.join(missing)}")
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        usual = Counter(lengths.values()).most_common(1)[0][0]
        odd = ", ".join(f"{name} {n}" for name, n in sorted(lengths.items()) if n != usual)
        raise DamagedTrees(f"columns of different lengths: {odd}, the others {usual}")
    nodes: dict[tuple[int, int], dict] = {}
    links: list[tuple[tuple[int, int], tuple[int, int]]] = []
    for tree_value, node_value, yes, no in zip(*(columns[c] for c in TREE_COLUMNS)):
        key = (_number(tree_value, "Tree"), _number(node_value, "Node"))
        if key in nodes:
            raise DamagedTrees(f"node {_ref(key)} listed twice")
        nodes[key] = {"nodeid": key[1], "children": []}
        links.extend((key, child) for child in (_child(yes), _child(no)) if child is not None)
    parents: dict[tuple[int, int], tuple[int, int]] = {}
    for parent, child in links:
        if child not in nodes or child[0] != parent[0]:
            raise DamagedTrees(f"node {_ref(parent)} points to {_ref(child)}, not in its tree")
        if child[1] == 0:
            raise DamagedTrees(f"node {_ref(parent)} points to the root of its tree")
        if child in parents:
            raise DamagedTrees(f"node {_ref(child)} has two parents")
        parents[child] = parent
        nodes[parent]["children"].append(nodes[child])
    roots: dict[int, dict] = {}
    for tree in sorted({t for t, _ in nodes}):
        if (tree, 0) not in nodes:
            raise DamagedTrees(f"tree {tree} has no root (node 0)")
        roots[tree] = nodes[(tree, 0)]
    return roots


def _number(value: Any, column: str) -> int:
    shown = repr(str(value)) if isinstance(value, str) else str(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise DamagedTrees(f"{column} {shown} is not a number") from None
    if not math.isfinite(number) or number != int(number) or number < 0:
        raise DamagedTrees(f"{column} {shown} is not a node or tree number")
    return int(number)


def _child(reference: Any) -> tuple[int, int] | None:
    """A Yes/No reference "<tree>-<node>"; a leaf's is NaN (saved as the string "nan")."""
    text = str(reference).strip()
    if text.lower() in ("", "nan", "none"):
        return None
    if not _REFERENCE.fullmatch(text):
        raise DamagedTrees(f"child reference {text!r} is not <tree>-<node>")
    tree, _, node = text.partition("-")
    return int(tree), int(node)


def _ref(key: tuple[int, int]) -> str:
    return f"{key[0]}-{key[1]}"
