"""TFRecord files of TensorFlow `Event`s, as SageMaker Debugger (smdebug) wrote its tensors.

A small reader with no dependency beyond numpy: the record framing, CRC-32C and the few
protobuf messages smdebug writes (Event -> Summary -> Value -> TensorProto). A record is

    uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)

(little-endian). smdebug's writer, at its default `write_checksum=False`, puts in place of the
data's checksum the masked CRC of its fixed bytes `CHECKSUM_MAGIC_BYTES` (b"0x12345678"), the
same in every record; its reader accepts that footer. So a footer is accepted when it is the
data's own checksum or that fixed one. A record whose footer is neither is skipped and
reported; a damaged length ends the file (nothing after it can be framed), also reported. The
file is read one record at a time, and a record over `MAX_RECORD` bytes is skipped unread: a
stray file or a forged length costs 12 bytes of reading, not the file.

A record whose messages do not parse (a field of the wrong wire type, a shape of more values
than the record carries) raises `DecodeError`, a ValueError naming the field; nothing is
allocated for a shape before it is checked against the bytes that hold its values.

    >>> hex(crc32c(b"123456789"))
    '0xe3069283'
    >>> hex(SMDEBUG_FOOTER)
    '0x62dc0b3'
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np

_MASK_DELTA = 0xA282EAD8
# A record longer than this is skipped unread: 256 Mi float32 values, more than one tensor of
# any model smdebug was used with (it saves one tensor per record).
MAX_RECORD = 1 << 30


class DecodeError(ValueError):
    """A record whose protobuf messages are not the Event smdebug writes."""


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
    """CRC-32C (Castagnoli), as TFRecord uses it: google-crc32c's C code when installed
    (0.2 ms per MiB), else `crc32c_python` (0.4 s per MiB)."""
    if _fast_crc32c is not None:
        return int(_fast_crc32c(data))
    return crc32c_python(data)


def crc32c_python(data: bytes) -> int:
    """CRC-32C in Python, table-driven.

    >>> hex(crc32c_python(b"123456789"))
    '0xe3069283'
    """
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


try:
    from google_crc32c import value as _fast_crc32c
except ImportError:  # the C extension is optional: the Python table gives the same values
    _fast_crc32c = None


def masked_crc32c(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


# smdebug/core/tfrecord/record_writer.py: CHECKSUM_MAGIC_BYTES, whose masked CRC is every
# record's footer when the writer is not asked to checksum the data (its default).
CHECKSUM_MAGIC_BYTES = b"0x12345678"


def read_records(path: Path, problems: list[str], check_data: bool = True) -> Iterator[bytes]:
    """The records of one TFRecord file; damage is appended to `problems`, never raised."""
    try:
        with open(path, "rb") as stream:
            yield from _records(stream, path, problems, check_data)
    except OSError as e:
        problems.append(f"{path}: cannot read ({e.strerror or e}); the rest of the file is skipped")


def _records(stream, path: Path, problems: list[str], check_data: bool) -> Iterator[bytes]:
    size = Path(stream.name).stat().st_size
    pos, index = 0, 0
    while pos < size:
        header = stream.read(12)
        if len(header) < 12:
            problems.append(f"{path}: record {index}: truncated header ({len(header)} bytes)")
            return
        (length,) = struct.unpack("<Q", header[:8])
        (length_crc,) = struct.unpack("<I", header[8:])
        if masked_crc32c(header[:8]) != length_crc:
            problems.append(
                f"{path}: record {index} at byte {pos}: length checksum mismatch; "
                "the rest of the file is skipped"
            )
            return
        start, end = pos + 12, pos + 12 + length
        if end + 4 > size:
            problems.append(f"{path}: record {index} at byte {pos}: truncated data")
            return
        if length > MAX_RECORD:
            problems.append(
                f"{path}: record {index} at byte {pos}: {length:,} bytes, more than one "
                f"record replay reads ({MAX_RECORD:,}); skipped unread"
            )
            stream.seek(end + 4)
        else:
            payload = stream.read(length)
            (data_crc,) = struct.unpack("<I", stream.read(4))
            if check_data and data_crc != SMDEBUG_FOOTER and masked_crc32c(payload) != data_crc:
                problems.append(
                    f"{path}: record {index} at byte {start - 12}: data checksum mismatch "
                    "(neither the data's CRC nor smdebug's fixed footer); skipped"
                )
            else:
                yield payload
        pos = end + 4
        index += 1


SMDEBUG_FOOTER = masked_crc32c(CHECKSUM_MAGIC_BYTES)


# --- protobuf wire format -----------------------------------------------------------------


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result, shift = 0, 0
    while True:
        if pos >= len(buf):
            raise DecodeError("a varint runs past the message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise DecodeError("varint too long")


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
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        else:
            raise DecodeError(f"field {number}: unsupported wire type {wire}")
        if pos > end:
            raise DecodeError(f"field {number} runs past the message")
        out.setdefault(number, []).append(value)
    return out


def _bytes_fields(f: dict[int, list], number: int, what: str) -> list[bytes]:
    """Field `number`'s values, each a length-delimited (or fixed-size) one, as `what` must be."""
    values = f.get(number, [])
    if any(not isinstance(v, bytes) for v in values):
        raise DecodeError(f"{what} (field {number}) is a varint, not a message or bytes")
    return values


def _int_field(f: dict[int, list], number: int, what: str, default: int = 0) -> int:
    value = f.get(number, [default])[0]
    if not isinstance(value, int):
        raise DecodeError(f"{what} (field {number}) is not a varint")
    return value


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
    """A TensorProto's value as a numpy array.

    A shape is checked against the bytes before anything is allocated: a record of n bytes
    holds at most n values (one value repeated over the shape, TensorFlow's short form, is
    only taken that far).

    >>> dims = bytes([0x12, 0x04, 0x08, 0xA0, 0x8D, 0x06]) * 2  # dim {size: 100000}, twice
    >>> one_float = bytes([0x2D, 0, 0, 0x80, 0x3F])  # float_val: 1.0
    >>> try:
    ...     decode_tensor(bytes([0x08, 0x01, 0x12, len(dims)]) + dims + one_float)
    ... except DecodeError as e:
    ...     print(e)
    shape [100000, 100000] is 10,000,000,000 values; the tensor's 21 bytes hold at most 21
    """
    f = fields(buf)
    dtype_id = _int_field(f, 1, "dtype", 1)
    shape: list[int] = []
    for shape_msg in _bytes_fields(f, 2, "tensor_shape"):
        for dim in _bytes_fields(fields(shape_msg), 2, "tensor_shape.dim"):
            shape.append(_int_field(fields(dim), 1, "dim.size"))
    numel = math.prod(shape)
    if numel > len(buf):
        raise DecodeError(
            f"shape {shape} is {numel:,} values; the tensor's {len(buf)} bytes hold at most "
            f"{len(buf)}"
        )
    if dtype_id == 7 or 8 in f and 4 not in f:
        strings = [s.decode("utf-8", "replace") for s in _bytes_fields(f, 8, "string_val")]
        if shape and len(strings) != numel:
            raise DecodeError(f"tensor holds {len(strings)} strings for shape {shape}")
        return np.array(strings).reshape(shape) if shape else np.array(strings)
    if 4 in f:
        content = b"".join(_bytes_fields(f, 4, "tensor_content"))
        dtype = DTYPES.get(dtype_id)
        if dtype is None:
            raise DecodeError(f"unsupported tensor dtype {dtype_id}")
        if dtype_id == 3 and len(content) == 2 * numel and numel:
            dtype = np.float16  # smdebug wrote float16 tensors tagged DT_INT32
        itemsize = np.dtype(dtype).itemsize
        if len(content) != numel * itemsize:
            raise DecodeError(
                f"tensor_content is {len(content)} bytes, not {numel * itemsize} for shape "
                f"{shape} of {np.dtype(dtype).name}"
            )
        array = np.frombuffer(content, dtype=np.dtype(dtype).newbyteorder("<"))
    else:
        values: list = []
        for number, dtype in _REPEATED.items():
            for chunk in f.get(number, []):
                if isinstance(chunk, bytes):
                    width = np.dtype(dtype).itemsize
                    if len(chunk) % width:
                        raise DecodeError(f"packed field {number} is not whole values")
                    values.extend(np.frombuffer(chunk, dtype=np.dtype(dtype).newbyteorder("<")))
                else:
                    values.append(chunk)
        array = np.array(values, dtype=DTYPES.get(dtype_id, np.float64))
        if array.size == 1 and numel > 1:
            array = np.full(numel, array[0])
    if array.size != numel:
        raise DecodeError(f"tensor holds {array.size} values for shape {shape}")
    return array.reshape(shape)


def decode_event(record: bytes) -> Iterator[TensorEvent]:
    """The tensors of one serialized Event (an Event without a summary yields nothing)."""
    f = fields(record)
    wall_time = 0.0
    if 1 in f:
        (stamp,) = _bytes_fields(f, 1, "wall_time")[:1]
        if len(stamp) != 8:
            raise DecodeError("wall_time (field 1) is not a double")
        wall_time = struct.unpack("<d", stamp)[0]
    step = _signed(_int_field(f, 2, "step"))
    for summary in _bytes_fields(f, 5, "summary"):
        for value in _bytes_fields(fields(summary), 1, "summary.value"):
            v = fields(value)
            if 8 not in v:
                continue
            name = _bytes_fields(v, 1, "tag")[:1] or [b""]
            mode, mode_step = "global", step
            for metadata in _bytes_fields(v, 9, "metadata"):
                for plugin in _bytes_fields(fields(metadata), 1, "plugin_data"):
                    p = fields(plugin)
                    plugin_name = (_bytes_fields(p, 1, "plugin_name") or [b""])[0]
                    content = (_bytes_fields(p, 2, "content") or [b""])[0]
                    text = content.decode("utf-8", "replace")
                    if plugin_name == b"mode":
                        mode = _MODES.get(text, "global")
                    elif plugin_name == b"mode_step" and text.lstrip("-").isdigit():
                        mode_step = int(text)
            tensor = _bytes_fields(v, 8, "tensor")[0]
            yield TensorEvent(
                name[0].decode("utf-8", "replace"),
                step,
                wall_time,
                mode,
                mode_step,
                decode_tensor(tensor),
            )


def _signed(n: int) -> int:
    return n - (1 << 64) if n >= 1 << 63 else n
