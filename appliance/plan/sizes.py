"""Byte sizes as people write them: 4GiB, 512MiB, 1.5GB, 1048576."""

from __future__ import annotations

import re

UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
         "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1024, "mib": 1024**2,
         "gib": 1024**3, "tib": 1024**4}


def parse_size(value) -> int:
    """Bytes in `value` (int, or a number with a unit); ValueError naming the valid units."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not m or m.group(2).lower() not in UNITS:
        raise ValueError(f"{value!r} is not a size; write e.g. 4GiB, 512MiB, 2GB or a byte count")
    return int(float(m.group(1)) * UNITS[m.group(2).lower()])


def format_size(n: int) -> str:
    """`n` bytes the way people read them: 1.5 GiB, 512.0 MiB, 12 B."""
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
