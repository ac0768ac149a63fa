"""Hostile zip archives: a directory of many entries written directly (zipfile
takes minutes for 250,000), and a member whose data no longer matches its CRC."""

from __future__ import annotations

import struct

import numpy as np


def many_entries(n: int) -> bytes:
    """A zip of ``n`` empty members, written directly (zipfile takes minutes for 250,000)."""
    local, central, offset = bytearray(), bytearray(), 0
    for i in range(n):
        name = f"{i}.npy".encode()
        header = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, 0, 0, len(name), 0) + name
        central += struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, 0, 0, 0, len(name),
                               0, 0, 0, 0, 0, offset) + name
        local += header
        offset += len(header)
    count = min(n, 0xFFFF)
    return bytes(local + central + struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, count, count, len(central),
                                               offset, 0))


def bad_crc(data: bytes, array: np.ndarray) -> bytes:
    """The .npz with a byte of ``array``'s data flipped: a valid header, a CRC that no longer matches."""
    out = bytearray(data)
    out[data.index(array.tobytes()) + 10] ^= 0xFF
    return bytes(out)
