"""The layout of one safetensors file, checked without reading its tensors.

A safetensors file is an 8-byte little-endian header size, a JSON header
(tensor name -> dtype, shape, ``data_offsets`` into the data part), then the
data. A copy cut short keeps a readable header while its last tensors' bytes
are missing; ``safetensors`` then fails inside the checkpoint load (a Rust
error, on every rank, after the model is built). ``read_header`` compares
every tensor's byte range with the file's size instead, so a cut file is one
line naming the file, the tensor and the bytes, before anything loads.
"""

from __future__ import annotations

import json
import math
import os
import struct

from skrull_ext.errors import DataError

DTYPE_BYTES = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2,
               "U16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
"""Bytes per element of each safetensors dtype (others are not size-checked)."""


def read_header(path: str) -> dict:
    """``path``'s tensors (name -> dtype, shape, data_offsets), after checking that
    the header and every tensor's bytes lie inside the file and that the data
    part ends where the last tensor does. DataError naming the file otherwise."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise DataError(f"{path}: {size} bytes, shorter than a safetensors file's 8-byte header size "
                            "(truncated?)")
        (n,) = struct.unpack("<Q", raw)
        if 8 + n > size:
            raise DataError(f"{path}: the safetensors header needs bytes 8-{8 + n} but the file has {size} bytes "
                            "(truncated, or not a safetensors file)")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{path}: not a safetensors file (its header is not JSON: {e})") from None
    if not isinstance(header, dict):
        raise DataError(f"{path}: not a safetensors file (its header is not a JSON object)")
    header.pop("__metadata__", None)
    end = 0
    for name, info in sorted(header.items(), key=lambda kv: _offsets(path, *kv)[0]):
        begin, stop = _offsets(path, name, info)
        if 8 + n + stop > size:
            raise DataError(f"{path}: tensor {name!r} needs bytes {8 + n + begin}-{8 + n + stop} but the file has "
                            f"{size} bytes (truncated?)")
        want = DTYPE_BYTES.get(info["dtype"])
        if want is not None and stop - begin != want * math.prod(info["shape"]):
            raise DataError(f"{path}: tensor {name!r} has {stop - begin} bytes, but {info['dtype']} "
                            f"{list(info['shape'])} needs {want * math.prod(info['shape'])}")
        end = max(end, stop)
    if 8 + n + end != size:
        raise DataError(f"{path}: the tensors end at byte {8 + n + end} but the file has {size} bytes "
                        "(a partial or concatenated write?)")
    return header


def _offsets(path: str, name: str, info) -> tuple[int, int]:
    try:
        begin, stop = (int(x) for x in info["data_offsets"])
        valid = isinstance(info["dtype"], str) and all(int(d) >= 0 for d in info["shape"])
    except (TypeError, KeyError, ValueError):
        valid = False
    if not valid:
        raise DataError(f"{path}: tensor {name!r} has no valid dtype, shape and data_offsets in the header")
    if not 0 <= begin <= stop:
        raise DataError(f"{path}: tensor {name!r} has data_offsets {[begin, stop]}, not a byte range")
    return begin, stop
