"""The source table a config name that the source lacks was likely meant to be
(`shop.ordrs` for `shop.orders`), as `sync -s` suggests a configured name. The catalog is
read only when a table is missing: a run whose tables all exist pays nothing."""

from __future__ import annotations

import difflib
from typing import Any

import psycopg

from ..base.identifiers import TableName
from .selection import source_tables


def near_table(conn: psycopg.Connection[Any], missing: TableName) -> TableName | None:
    """The source's table a typo (or another case) away from `missing`, if one is close.
    Schema and table are compared apart: a long schema name shared by two tables would
    make any two of their names look close."""

    def close(a: str, b: str) -> float:
        return difflib.SequenceMatcher(None, a.lower(), b.lower()).ratio()

    scored = [
        (close(missing.schema, t.schema) * close(missing.name, t.name), str(t), t)
        for t in source_tables(conn)
    ]
    best = max(scored, default=None)
    return best[2] if best is not None and best[0] >= 0.75 else None
