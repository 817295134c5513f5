"""The statements that compare a table without a key as a multiset of rows, and repair it.
Pure: it builds SQL and never talks to a database.

With no key to match rows by, a row is its whole text: both sides hash every row
(`Shape.row_hash`, as the keyed comparison does) and count each hash. Buckets of hashes
(`mod(hash, buckets)`) are summed first, one scan per side; only the buckets whose count or
sum differs are counted hash by hash. Two equal rows have the same hash, so a hash's count
is how many copies of that row a side holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import sql

from . import range_sql as q
from .range_sql import Shape, Side

Query = tuple[sql.Composable, list[Any]]


def _hashed(shape: Shape, side: Side, values: bool = False) -> sql.Composable:
    """The side's rows as `h` (the row's hash) and, with `values`, every column as text."""
    texts = [
        sql.SQL(", {}.{}::text AS {}").format(q.ident(q.ALIAS), q.ident(c), q.ident(f"v{i}"))
        for i, c in enumerate(shape.columns)
    ]
    where = sql.SQL(" WHERE {}").format(side.filter) if side.filter is not None else sql.SQL("")
    return sql.SQL("(SELECT {hash} AS h{texts} FROM {src}{where}) AS r").format(
        hash=shape.row_hash,
        texts=sql.SQL("").join(texts) if values else sql.SQL(""),
        src=side.from_clause(),
        where=where,
    )


def bucket_sums(shape: Shape, side: Side, buckets: int) -> Query:
    """Per bucket of hashes: its label, rows and the sum of their hashes. One scan."""
    query = sql.SQL(
        "SELECT mod(r.h, %s::bigint) AS bucket, count(*), coalesce(sum(r.h), 0) FROM {} GROUP BY 1"
    ).format(_hashed(shape, side))
    return query, [buckets]


def hash_counts(shape: Shape, side: Side, buckets: int, labels: Sequence[int]) -> Query:
    """Every distinct row hash in these buckets, with how many rows have it. One scan."""
    query = sql.SQL(
        "SELECT r.h, count(*) FROM {} WHERE mod(r.h, %s::bigint) = ANY(%s::bigint[]) GROUP BY 1"
    ).format(_hashed(shape, side))
    return query, [buckets, list(labels)]


def rows_of(shape: Shape, side: Side, hashes: Sequence[int]) -> Query:
    """One row per hash (its copies are alike): the hash, then every column as text."""
    values = sql.SQL(", ").join(q.ident("r", f"v{i}") for i in range(len(shape.columns)))
    query = sql.SQL(
        "SELECT DISTINCT ON (r.h) r.h, {values} FROM {rows} WHERE r.h = ANY(%s::bigint[]) "
        "ORDER BY r.h"
    ).format(values=values, rows=_hashed(shape, side, values=True))
    return query, [list(hashes)]


def delete_copies(shape: Shape, target: sql.Composable, copies: Sequence[tuple[int, int]]) -> Query:
    """Delete `n` of the destination's copies of the row with hash `h`, per (h, n): any `n`
    of them, since they are alike."""
    query = sql.SQL(
        "DELETE FROM {target} WHERE ctid = ANY(ARRAY("
        "SELECT r.ctid FROM (SELECT s.ctid, s.h, row_number() OVER (PARTITION BY s.h) AS n "
        "FROM (SELECT {alias}.ctid, {hash} AS h FROM {target} AS {alias}) AS s "
        "WHERE s.h = ANY(%s::bigint[])) AS r "
        "JOIN unnest(%s::bigint[], %s::bigint[]) AS u(h, n) ON u.h = r.h WHERE r.n <= u.n))"
    ).format(target=target, alias=q.ident(q.ALIAS), hash=shape.row_hash)
    hashes = [h for h, _ in copies]
    return query, [hashes, hashes, [n for _, n in copies]]


def insert_copies(
    target: sql.Composable,
    columns: Sequence[tuple[str, str]],
    rows: Sequence[tuple[int, Sequence[str | None]]],
) -> Query:
    """Insert `n` copies of each row (every value as text, cast to its column's type), per
    (n, values)."""
    names = [q.ident(f"v{i}") for i in range(len(columns))]
    query = sql.SQL(
        "INSERT INTO {target} ({idents}) SELECT {typed} FROM unnest({arrays}, %s::int[]) "
        "AS u({names}, n) CROSS JOIN LATERAL generate_series(1, u.n)"
    ).format(
        target=target,
        idents=sql.SQL(", ").join(q.ident(c) for c, _ in columns),
        typed=sql.SQL(", ").join(
            sql.SQL("u.{}::{}").format(n, sql.SQL(t))
            for n, (_, t) in zip(names, columns, strict=True)
        ),
        arrays=sql.SQL(", ").join(sql.SQL("%s::text[]") for _ in columns),
        names=sql.SQL(", ").join(names),
    )
    values = [list(column) for column in zip(*(v for _, v in rows), strict=True)]
    return query, [*values, [n for n, _ in rows]]
