"""Writes SageMaker Debugger trials the way smdebug's FileWriter did, for the reader's tests.

Independent of `trainprof.replay.tfrecord`: written from the TFRecord format description
(length, masked CRC-32C of the length, data, masked CRC-32C of the data) with a bit-by-bit
CRC, and the protobuf encoding of smdebug's messages spelled out field by field:
Event{wall_time=1 double, step=2 int64, summary=5}, Summary{value=1},
Value{tag=1, tensor=8, metadata=9}, SummaryMetadata{plugin_data=1 repeated},
PluginData{plugin_name=1, content=2}, TensorProto{dtype=1, tensor_shape=2,
tensor_content=4, string_val=8}, TensorShapeProto{dim=2}, Dim{size=1, name=2}.
smdebug's make_tensor_proto writes `tensor_content` (raw bytes), names each dimension
"<tag>_<size>", tags float16 as DT_INT32, and turns scalars into shape-[1] arrays.
"""

from __future__ import annotations

import json
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


def write_trial(
    root: Path,
    steps: dict[int, dict[str, object]],
    collections: dict[str, list[str]] | None = None,
    modes: dict[str, str] | None = None,
    worker: str = "worker_0",
    ended: bool = True,
    wall_times: dict[int, float] | None = None,
) -> Path:
    """A trial at `root`: per step, tensor name -> value; `collections` name -> tensor names;
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
    if collections:
        folder = root / "collections" / "000000000"
        folder.mkdir(parents=True, exist_ok=True)
        body = {
            "meta": {"num_workers": 1, "worker_name": worker},
            "collections": {
                name: {"name": name, "include_regex": [], "tensor_names": names}
                for name, names in collections.items()
            },
        }
        (folder / f"{worker}_collections.json").write_text(json.dumps(body))
    if ended:
        (root / "training_job_end.ts").write_text("")
    return root
