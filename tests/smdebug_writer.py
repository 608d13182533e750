"""Writes SageMaker Debugger trials the way smdebug's FileWriter did, for the reader's tests.

Independent of `trainprof.replay.tfrecord`: written from the TFRecord format description
(length, masked CRC-32C of the length, data, masked CRC-32C of the data) with a bit-by-bit
CRC, and the protobuf encoding of smdebug's messages spelled out field by field:
Event{wall_time=1 double, step=2 int64, summary=5}, Summary{value=1},
Value{tag=1, tensor=8, metadata=9}, SummaryMetadata{plugin_data=1 repeated},
PluginData{plugin_name=1, content=2}, TensorProto{dtype=1, tensor_shape=2,
tensor_content=4, string_val=8}, TensorShapeProto{dim=2}, Dim{size=1, name=2}.
smdebug's make_tensor_proto writes `tensor_content` (raw bytes), names each dimension
"<tag>_<size>", tags float16 as DT_INT32, turns scalars into shape-[1] arrays, and writes
string arrays as `string_val` with no dtype.

`xgboost_trees` gives the `trees/<column>` tensors SageMaker's XGBoost hook saved at a
boosting round, read here from the booster's text dump (not from trainprof).
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import numpy as np

_DT = {
    np.dtype(np.float16): 3,  # smdebug's own mapping: float16 -> "DT_INT32"
    np.dtype(np.float32): 1,
    np.dtype(np.float64): 2,
    np.dtype(np.int32): 3,
    np.dtype(np.int64): 9,
    np.dtype(np.uint8): 4,
    np.dtype(np.bool_): 10,
}
MODES = {"train": 1, "eval": 2, "predict": 3, "global": 4}


def crc32c_bitwise(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 * (crc & 1))
    return crc ^ 0xFFFFFFFF


def masked(data: bytes) -> int:
    crc = crc32c_bitwise(data)
    rotated = ((crc >> 15) | (crc << 17)) & 0xFFFFFFFF
    return (rotated + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", masked(length)) + data + struct.pack("<I", masked(data))


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _key(field: int, wire: int) -> bytes:
    return _varint(field << 3 | wire)


def _bytes(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _varint(len(payload)) + payload


def _int(field: int, value: int) -> bytes:
    return _key(field, 0) + _varint(value)


def tensor_proto(value: np.ndarray, tag: str) -> bytes:
    dims = b"".join(_bytes(2, _int(1, d) + _bytes(2, f"{tag}_{d}".encode())) for d in value.shape)
    shape = _bytes(2, dims)
    if value.dtype.kind == "U":
        return shape + b"".join(_bytes(8, s.encode()) for s in value.reshape(-1))
    return _int(1, _DT[value.dtype]) + shape + _bytes(4, value.tobytes())


def event(tag: str, value, step: int, mode: str = "train", wall_time: float = 1.7e9) -> bytes:
    array = value if isinstance(value, np.ndarray) else np.array([value])
    plugins = _bytes(1, _bytes(1, b"mode_step") + _bytes(2, str(step).encode())) + _bytes(
        1, _bytes(1, b"mode") + _bytes(2, str(MODES[mode]).encode())
    )
    summary_value = (
        _bytes(1, tag.encode()) + _bytes(9, plugins) + _bytes(8, tensor_proto(array, tag))
    )
    summary = _bytes(1, summary_value)
    return _key(1, 1) + struct.pack("<d", wall_time + step) + _int(2, step) + _bytes(5, summary)


_DUMP_LINE = re.compile(r"^\s*(\d+):(?:\[([^\]]*)\] (\S*)|leaf=(\S*))$")


def xgboost_trees(booster, iteration: int) -> dict[str, np.ndarray]:
    """The `trees/<column>` tensors the XGBoost hook saved at round `iteration`: the rows of
    `trees_to_dataframe` for the tree numbered `iteration` only (the hook's choice; one
    tree per round for a single-output booster), sorted by node, as its arrays: Tree/Node
    int, Split/Gain/Cover float, the others strings ("nan" for a leaf's Yes/No/Missing).
    """
    rows = []
    dump = booster.get_dump(with_stats=True)
    for line in dump[iteration].splitlines() if iteration < len(dump) else ():
        match = _DUMP_LINE.match(line)
        if not match:
            continue
        node, condition, stats, leaf = match.groups()
        ref = f"{iteration}-{{}}".format
        if condition is None:  # "<node>:leaf=<value>,cover=<cover>"
            value, cover = (part.split("=")[-1] for part in leaf.split(","))
            row = ("Leaf", "nan", "nan", "nan", "nan", value, cover, "nan")
        else:
            fields = dict(part.split("=") for part in stats.split(","))
            feature, less, split = condition.partition("<")
            category = "nan"
            if not less:  # a categorical split "<feature>:{a,b}"
                feature, _, category = condition.partition(":")
                split = "nan"
            row = (
                feature,
                split,
                ref(fields["yes"]),
                ref(fields["no"]),
                ref(fields["missing"]),
                fields["gain"],
                fields["cover"],
                category,
            )
        rows.append((int(node), row))
    rows.sort(key=lambda r: r[0])
    nodes = [n for n, _ in rows]
    columns = list(zip(*(r for _, r in rows))) or [()] * 8
    feature, split, yes, no, missing, gain, cover, category = columns
    named = {
        "Tree": np.full(len(nodes), iteration, dtype=np.int64),
        "Node": np.array(nodes, dtype=np.int64),
        "ID": np.array([f"{iteration}-{n}" for n in nodes], dtype=str),
        "Feature": np.array(feature, dtype=str),
        "Split": np.array(split, dtype=np.float64),
        "Yes": np.array(yes, dtype=str),
        "No": np.array(no, dtype=str),
        "Missing": np.array(missing, dtype=str),
        "Gain": np.array(gain, dtype=np.float64),
        "Cover": np.array(cover, dtype=np.float64),
        "Category": np.array(category, dtype=str),
    }
    return {f"trees/{name}": values for name, values in named.items()}


def write_trial(
    root: Path,
    steps: dict[int, dict[str, object]],
    collections: dict[str, list[str]] | None = None,
    modes: dict[str, str] | None = None,
    worker: str = "worker_0",
    ended: bool = True,
    wall_times: dict[int, float] | None = None,
    regexes: dict[str, list[str]] | None = None,
) -> Path:
    """A trial at `root`: per step, tensor name -> value; `collections` name -> tensor names,
    `regexes` name -> include_regex (as the XGBoost hook's `trees`: ["^trees/.*"]);
    `wall_times`: step -> the Unix time its events carry (else 1.7e9 + step)."""
    modes = modes or {}
    for step, tensors in steps.items():
        folder = root / "events" / f"{step:012d}"
        stamp = {"wall_time": wall_times[step] - step} if wall_times else {}
        folder.mkdir(parents=True, exist_ok=True)
        data = b"".join(
            record(event(name, value, step, modes.get(name, "train"), **stamp))
            for name, value in tensors.items()
        )
        (folder / f"{step:012d}_{worker}.tfevents").write_bytes(data)
        index = root / "index" / f"{step // 1000:09d}"
        index.mkdir(parents=True, exist_ok=True)
        (index / f"{step:012d}_{worker}.json").write_text(
            json.dumps({"meta": {"mode": "TRAIN", "mode_step": step}, "tensor_payload": []})
        )
    if collections or regexes:
        collections, regexes = collections or {}, regexes or {}
        folder = root / "collections" / "000000000"
        folder.mkdir(parents=True, exist_ok=True)
        body = {
            "meta": {"num_workers": 1, "worker_name": worker},
            "collections": {
                name: {
                    "name": name,
                    "include_regex": regexes.get(name, []),
                    "tensor_names": collections.get(name, []),
                }
                for name in {**collections, **regexes}
            },
        }
        (folder / f"{worker}_collections.json").write_text(json.dumps(body))
    if ended:
        (root / "training_job_end.ts").write_text("")
    return root
