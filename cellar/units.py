"""Parsing and printing of sizes ("4GiB") and durations ("500ms"), used by every config."""

from __future__ import annotations

import math
import re

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "ki": 1 << 10, "kib": 1 << 10, "mi": 1 << 20, "mib": 1 << 20, "gi": 1 << 30, "gib": 1 << 30,
    "ti": 1 << 40, "tib": 1 << 40,
}
_DURATION_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "m": 60.0, "min": 60.0, "h": 3600.0}
_NUMBER_WITH_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size_bytes(text: str | int) -> int:
    """'4GiB' -> 4294967296; '1.5MB' -> 1500000; plain integers are bytes."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        return text
    match = _NUMBER_WITH_UNIT.match(str(text))
    if not match or match.group(2).lower() not in _SIZE_UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 4096, 64KiB, 4GiB, 1.5GB)")
    size = float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]
    if not math.isfinite(size):  # '1e400GiB': int() of infinity raised OverflowError
        raise ValueError(f"not a size: {text!r} (too large)")
    return int(size)


def parse_duration_s(text: str | float) -> float:
    """'500ms' -> 0.5; '10s' or '10' -> 10.0; '2m' -> 120.0."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, (int, float)):
        return float(text)
    match = _NUMBER_WITH_UNIT.match(str(text))
    if not match or match.group(2).lower() not in _DURATION_UNITS:
        raise ValueError(f"not a duration: {text!r} (use e.g. 10s, 500ms, 2m)")
    return float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()]


def format_size(nbytes: int) -> str:
    """4294967296 -> '4GiB'; exact binary multiples print without decimals."""
    for unit, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= factor:
            value = nbytes / factor
            return f"{value:.0f}{unit}" if nbytes % factor == 0 else f"{value:.2f}{unit}"
    return f"{nbytes}B"


# Hosts that listen on every interface: an address to bind, never one to give others (a
# server listening on one names itself by its advertised host instead)
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]", ""})


def parse_host_port(text: str, *, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """'127.0.0.1:50051' -> ('127.0.0.1', 50051); ':50051' uses default_host; '[::1]:1' works."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"not HOST:PORT: {text!r}")
    host = host.strip("[]") or default_host
    return host, int(port)
