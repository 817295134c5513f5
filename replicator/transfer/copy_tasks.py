"""The COPY tasks of a load, built on the driver: one per partition query (copy_stream.py
runs them, in this process or in Spark's workers)."""

from __future__ import annotations

from psycopg import sql

from ..postgres.naming import MARKER_TABLE
from .copy_stream import CopyTask


def copy_tasks(
    load_id: str,
    source_url: str,
    dest_url: str,
    snapshot: str,
    queries: list[sql.Composable],
    table: tuple[str, str],
    columns: list[str],
    *,
    freeze: bool = False,
    origin: str = "",
    parts: list[int] | None = None,
    text: bool = False,
) -> list[CopyTask]:
    """One task per query: binary COPY of its rows into `table` (schema, name).

    `text`: in COPY's text format instead, for the types the binary one cannot carry to
    another database (type_closure.TEXT_COPIED_TYPES).
    `freeze`: the table is this load's alone; a single task truncates it and copies frozen.
    `parts`: the partition number of each query (default 0, 1, ...): a resumed load copies
    only the partitions its first run did not finish, under their first numbers."""
    freeze = freeze and len(queries) == 1
    form = "text" if text else "binary"
    copy_in = (
        sql.SQL("COPY {} ({}) FROM STDIN (FORMAT {}{})")
        .format(
            sql.Identifier(*table),
            sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.SQL(form),
            sql.SQL(", FREEZE" if freeze else ""),
        )
        .as_string(None)
    )
    truncate = (
        sql.SQL("TRUNCATE {}").format(sql.Identifier(*table)).as_string(None) if freeze else None
    )
    return [
        CopyTask(
            load_id,
            index,
            source_url,
            dest_url,
            snapshot,
            sql.SQL("COPY ({}) TO STDOUT (FORMAT {})").format(query, sql.SQL(form)).as_string(None),
            copy_in,
            (MARKER_TABLE.schema, MARKER_TABLE.name),
            truncate,
            origin,
            names=text,
        )
        for index, query in zip(parts or range(len(queries)), queries, strict=True)
    ]
