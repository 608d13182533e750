"""TFRecord files of TensorFlow `Event`s, as SageMaker Debugger (smdebug) wrote its tensors.

A small reader with no dependency beyond numpy: the record framing, CRC-32C and the few
protobuf messages smdebug writes (Event -> Summary -> Value -> TensorProto). A record is

    uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)

(little-endian). smdebug's writer, at its default `write_checksum=False`, puts in place of the
data's checksum the masked CRC of its fixed bytes `CHECKSUM_MAGIC_BYTES` (b"0x12345678"), the
same in every record; its reader accepts that footer. So a footer is accepted when it is the
data's own checksum or that fixed one. A record whose footer is neither is skipped and
reported; a damaged length ends the file (nothing after it can be framed), also reported.

    >>> hex(crc32c(b"123456789"))
    '0xe3069283'
    >>> hex(SMDEBUG_FOOTER)
    '0x62dc0b3'
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

_MASK_DELTA = 0xA282EAD8


def _table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord uses it."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


# smdebug/core/tfrecord/record_writer.py: CHECKSUM_MAGIC_BYTES, whose masked CRC is every
# record's footer when the writer is not asked to checksum the data (its default).
CHECKSUM_MAGIC_BYTES = b"0x12345678"


def read_records(path: Path, problems: list[str], check_data: bool = True) -> Iterator[bytes]:
    """The records of one TFRecord file; damage is appended to `problems`, never raised."""
    data = Path(path).read_bytes()
    pos, index = 0, 0
    while pos < len(data):
        if len(data) - pos < 12:
            problems.append(f"{path}: record {index}: truncated header ({len(data) - pos} bytes)")
            return
        header = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        if masked_crc32c(header) != length_crc:
            problems.append(
                f"{path}: record {index} at byte {pos}: length checksum mismatch; "
                "the rest of the file is skipped"
            )
            return
        start, end = pos + 12, pos + 12 + length
        if end + 4 > len(data):
            problems.append(f"{path}: record {index} at byte {pos}: truncated data")
            return
        payload = data[start:end]
        (data_crc,) = struct.unpack("<I", data[end : end + 4])
        pos = end + 4
        if check_data and data_crc != SMDEBUG_FOOTER and masked_crc32c(payload) != data_crc:
            problems.append(
                f"{path}: record {index} at byte {start - 12}: data checksum mismatch "
                "(neither the data's CRC nor smdebug's fixed footer); skipped"
            )
        else:
            yield payload
        index += 1


SMDEBUG_FOOTER = masked_crc32c(CHECKSUM_MAGIC_BYTES)


# --- protobuf wire format -----------------------------------------------------------------


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def fields(buf: bytes) -> dict[int, list]:
    """Field number -> values (ints for varint/fixed, bytes for length-delimited)."""
    out: dict[int, list] = {}
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos : pos + n], pos + n
            if pos > end:
                raise ValueError("length-delimited field runs past the message")
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        out.setdefault(number, []).append(value)
    return out


# TensorFlow DataType enum -> numpy dtype (DT_STRING handled apart).
DTYPES = {
    1: np.float32,
    2: np.float64,
    3: np.int32,
    4: np.uint8,
    5: np.int16,
    6: np.int8,
    9: np.int64,
    10: np.bool_,
    17: np.uint16,
    19: np.float16,
    22: np.uint32,
    23: np.uint64,
}
_REPEATED = {  # TensorProto field -> dtype of its packed values
    5: np.float32,
    6: np.float64,
    7: np.int32,
    10: np.int64,
}


@dataclasses.dataclass
class TensorEvent:
    """One tensor of one Event: name, training step, wall time, mode and its value."""

    name: str
    step: int
    wall_time: float
    mode: str  # train | eval | predict | global
    mode_step: int
    value: np.ndarray
    worker: str = ""  # from the event file's name (<step>_<worker>.tfevents)


_MODES = {"1": "train", "2": "eval", "3": "predict", "4": "global"}


def decode_tensor(buf: bytes) -> np.ndarray:
    """A TensorProto's value as a numpy array."""
    f = fields(buf)
    dtype_id = f.get(1, [1])[0]
    shape: list[int] = []
    for shape_msg in f.get(2, []):
        for dim in fields(shape_msg).get(2, []):
            shape.append(int(fields(dim).get(1, [0])[0]))
    numel = int(np.prod(shape)) if shape else 1
    if dtype_id == 7 or 8 in f and 4 not in f:
        strings = [s.decode("utf-8", "replace") for s in f.get(8, [])]
        return np.array(strings).reshape(shape) if shape else np.array(strings)
    if 4 in f:
        content = b"".join(f[4])
        dtype = DTYPES.get(dtype_id)
        if dtype is None:
            raise ValueError(f"unsupported tensor dtype {dtype_id}")
        if dtype_id == 3 and len(content) == 2 * numel and numel:
            dtype = np.float16  # smdebug wrote float16 tensors tagged DT_INT32
        array = np.frombuffer(content, dtype=np.dtype(dtype).newbyteorder("<"))
    else:
        values: list = []
        for number, dtype in _REPEATED.items():
            for chunk in f.get(number, []):
                if isinstance(chunk, bytes):
                    values.extend(np.frombuffer(chunk, dtype=np.dtype(dtype).newbyteorder("<")))
                else:
                    values.append(chunk)
        array = np.array(values, dtype=DTYPES.get(dtype_id, np.float64))
        if array.size == 1 and numel > 1:
            array = np.full(numel, array[0])
    if array.size != numel:
        raise ValueError(f"tensor holds {array.size} values for shape {shape}")
    return array.reshape(shape)


def decode_event(record: bytes) -> Iterator[TensorEvent]:
    """The tensors of one serialized Event (an Event without a summary yields nothing)."""
    f = fields(record)
    wall_time = struct.unpack("<d", f[1][0])[0] if 1 in f else 0.0
    step = _signed(f.get(2, [0])[0])
    for summary in f.get(5, []):
        for value in fields(summary).get(1, []):
            v = fields(value)
            if 8 not in v:
                continue
            name = v.get(1, [b""])[0].decode("utf-8", "replace")
            mode, mode_step = "global", step
            for metadata in v.get(9, []):
                for plugin in fields(metadata).get(1, []):
                    p = fields(plugin)
                    plugin_name = p.get(1, [b""])[0]
                    content = p.get(2, [b""])[0].decode("utf-8", "replace")
                    if plugin_name == b"mode":
                        mode = _MODES.get(content, "global")
                    elif plugin_name == b"mode_step" and content.lstrip("-").isdigit():
                        mode_step = int(content)
            yield TensorEvent(name, step, wall_time, mode, mode_step, decode_tensor(v[8][0]))


def _signed(n: int) -> int:
    return n - (1 << 64) if n >= 1 << 63 else n
