"""The bytes of an ``.npz`` file (:func:`npz_bytes`), as ``np.savez`` writes it: a zip archive whose
members ``<name>.npy`` are stored uncompressed. ``np.savez`` goes through ``zipfile`` in Python,
copying each array three times while holding the GIL; this builds the archive's headers and joins
them with the arrays' buffers in one copy. ``np.load`` reads the result as it reads savez's."""

from __future__ import annotations

import io
import struct
import zlib
from typing import Mapping

import numpy as np

__all__ = ["npz_bytes", "npz_parts"]

_LOCAL = struct.Struct("<IHHHHHIIIHH")  # local file header, before the name
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")  # central directory header, before the name
_END = struct.Struct("<IHHHHIIH")  # end of central directory record
_DOS_DATE = (1980 - 1980) << 9 | 1 << 5 | 1  # 1980-01-01 (np.savez writes its own clock; no reader uses it)
_LIMIT = 0xFFFFFFFF  # past this a zip needs its 64-bit extension: np.savez writes it


def _npy(array: np.ndarray) -> tuple[bytes, np.ndarray]:
    """The ``.npy`` header of ``array`` (NumPy's own writer: format 1.0, or 2.0 for a header
    too long for it) and its C-ordered data."""
    a = np.ascontiguousarray(array)
    head = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(head, np.lib.format.header_data_from_array_1_0(a))
    except ValueError:
        head = io.BytesIO()
        np.lib.format.write_array_header_2_0(head, np.lib.format.header_data_from_array_1_0(a))
    return head.getvalue(), a


def npz_parts(arrays: Mapping[str, np.ndarray]) -> list[bytes | memoryview]:
    """The ``.npz`` of ``arrays`` (no object arrays) as consecutive buffers (the arrays' own, not
    copied: written and hashed part by part); archives past 4 GiB go through ``np.savez``."""
    members = [(f"{name}.npy".encode("utf-8"), *_npy(a)) for name, a in arrays.items()]
    if sum(len(h) + a.nbytes + 100 for _, h, a in members) >= _LIMIT or any(a.dtype.hasobject for _, _, a in members):
        buf = io.BytesIO()
        np.savez(buf, **arrays)
        return [buf.getvalue()]
    parts: list[bytes | memoryview] = []
    central: list[bytes] = []
    offset = 0
    for name, head, a in members:
        data = memoryview(a.reshape(-1).view(np.uint8))
        crc = zlib.crc32(data, zlib.crc32(head))
        size = len(head) + len(data)
        flags = 0 if name.isascii() else 0x800  # (bit 11: the name is UTF-8)
        local = _LOCAL.pack(0x04034B50, 20, flags, 0, 0, _DOS_DATE, crc, size, size, len(name), 0) + name
        central.append(_CENTRAL.pack(0x02014B50, 20, 20, flags, 0, 0, _DOS_DATE, crc, size, size, len(name), 0, 0, 0,
                                     0, 0o600 << 16, offset) + name)
        parts += [local, head, data]
        offset += len(local) + size
    directory = b"".join(central)
    return parts + [directory, _END.pack(0x06054B50, 0, 0, len(central), len(central), len(directory), offset, 0)]


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """The ``.npz`` of ``arrays`` in one piece (:func:`npz_parts` joined)."""
    return b"".join(npz_parts(arrays))
