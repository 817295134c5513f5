"""Log positions (LSNs) as integers, and PostgreSQL's notation for them (`16/B374D848`)."""

from __future__ import annotations


def lsn_text(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)
