"""A GGUF file's metadata and tensor table, read from its header alone.

`gguf.GGUFReader` builds a numpy view of every field, the tokenizer's 262,144 token strings included: 8 s for
the 253 MB embedded model on this machine, where `inspect` needs a few numbers. This reads the same header
(the format is the `gguf` package's own constants: value types, quantization block sizes), skipping large
arrays by their length; a file it cannot read is left to `GGUFReader`.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Sized
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

MAGIC = b"GGUF"
SMALL_ARRAY = 4096  # arrays up to this long are read (per-layer settings); longer ones only counted
SCALARS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}  # fmt: skip


class HeaderError(ValueError):
    """Not a GGUF header this reader knows (another byte order, a future version, a damaged file)."""


@dataclass(frozen=True, slots=True)
class LongArray(Sized):
    """An array too long to be worth reading: its length only (the vocabulary's tokens)."""

    count: int

    def __len__(self) -> int:
        return self.count


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    type_name: str
    n_bytes: int


class _Cursor:
    def __init__(self, data: mmap.mmap) -> None:
        self.data, self.at = data, 0

    def unpack(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.data, self.at)[0]
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.unpack("<Q")
        text = bytes(self.data[self.at : self.at + size]).decode("utf-8", errors="replace")
        self.at += size
        return text

    def skip_string(self) -> None:
        size = self.unpack("<Q")  # read first: `self.at += self.unpack(...)` would add to the old offset
        self.at += size

    def value(self, kind: int) -> Any:
        if kind == GGUFValueType.STRING:
            return self.string()
        if kind == GGUFValueType.ARRAY:
            item, count = self.unpack("<I"), self.unpack("<Q")
            if count > SMALL_ARRAY:
                self._skip_array(item, count)
                return LongArray(count)
            return [self.value(item) for _ in range(count)]
        try:
            return self.unpack(SCALARS[GGUFValueType(kind)])
        except (KeyError, ValueError) as exc:
            raise HeaderError(f"unknown GGUF value type {kind}") from exc

    def _skip_array(self, item: int, count: int) -> None:
        if item == GGUFValueType.STRING:
            for _ in range(count):
                self.skip_string()
        elif item == GGUFValueType.ARRAY:
            raise HeaderError("a long array of arrays")
        else:
            self.at += struct.calcsize(SCALARS[GGUFValueType(item)]) * count


def read_header(path: Path) -> tuple[dict[str, Any], list[TensorInfo]]:
    """The metadata (long arrays as `LongArray`) and each tensor's name, type and size in bytes.

    Raises:
        HeaderError: not a little-endian GGUF of version 2 or 3, or cut short.
    """
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data)
        try:
            if bytes(data[:4]) != MAGIC:
                raise HeaderError("no GGUF magic")
            cursor.at = 4
            version = cursor.unpack("<I")
            if version not in (2, 3):
                raise HeaderError(f"GGUF version {version}")
            tensor_count, kv_count = cursor.unpack("<Q"), cursor.unpack("<Q")
            metadata = {}
            for _ in range(kv_count):
                key = cursor.string()
                metadata[key] = cursor.value(cursor.unpack("<I"))
            tensors = []
            for _ in range(tensor_count):
                name = cursor.string()
                dims = [cursor.unpack("<Q") for _ in range(cursor.unpack("<I"))]
                kind = GGMLQuantizationType(cursor.unpack("<I"))
                cursor.unpack("<Q")  # its offset in the data section
                elements = 1
                for dim in dims:
                    elements *= dim
                block, size = GGML_QUANT_SIZES[kind]
                tensors.append(TensorInfo(name, kind.name, elements // block * size))
        except (struct.error, IndexError, KeyError, ValueError) as exc:
            raise HeaderError(str(exc) or type(exc).__name__) from exc
    return metadata, tensors
