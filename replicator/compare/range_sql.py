"""The statements of a range comparison: bucket checksums, split points, the rows of small
ranges, and the rows a repair copies. Pure: it builds SQL and never talks to a database.

Both sides are read through the same alias (`_replicator_model`), so one expression serves
the source's model and the destination table. Key ranges compare a *sort key* that orders
the same way on every server: text-like key columns are compared as their UTF-8 bytes
(`convert_to`), because two servers' collations (glibc or ICU versions, locales) may order
the same strings differently, and a range must select the same rows on both sides. Other
types compare as themselves, so the destination's primary-key index serves range reads.

Key values travel as their text (the session settings pinned on every connection make that
exact) and are cast back to their type where they are bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import sql

ALIAS = "_replicator_model"


def ident(*parts: str) -> sql.Composable:
    """A quoted identifier for a statement with parameters: psycopg reads a `%` anywhere in
    the text as a placeholder, a quoted name's included, so it is doubled."""
    return sql.SQL(sql.Identifier(*parts).as_string(None).replace("%", "%%"))


Bound = tuple[str, ...]  # one sort-key value, as text, per key column


class EvenCuts(Sequence[Bound]):
    """Cuts of an integer key's first column at `start`, `start + step`, ... up to `stop`:
    three numbers, not a text per cut (a large table's first pass has one every few hundred
    rows), and the statement generates them on the server."""

    def __init__(self, start: int, stop: int, step: int) -> None:
        self.values = range(start, stop + 1, step)

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: int) -> Bound:  # type: ignore[override]
        if not isinstance(index, int):
            raise TypeError("EvenCuts takes one index at a time")
        return (str(self.values[index]),)


@dataclass(frozen=True)
class KeyColumn:
    """A primary-key column of the model, with the type ranges compare it in."""

    name: str
    type: str  # the model's type, format_type() text
    collatable: bool  # text-like: compared as UTF-8 bytes

    @property
    def sort_type(self) -> sql.Composable:
        return sql.SQL("bytea" if self.collatable else self.type)

    @property
    def column(self) -> sql.Composable:
        return sql.SQL("{}.{}").format(ident(ALIAS), ident(self.name))

    @property
    def sort_expr(self) -> sql.Composable:
        if self.collatable:
            return sql.SQL("convert_to({}::text, 'UTF8')").format(self.column)
        return self.column


@dataclass(frozen=True)
class Side:
    """One side's rows: a FROM item aliased `_replicator_model`, and an optional filter."""

    name: str  # "source" or "destination"
    relation: sql.Composable
    filter: sql.Composable | None = None

    def from_clause(self, sample_percent: float | None = None) -> sql.Composable:
        if sample_percent is None:
            return sql.SQL("{} AS {}").format(self.relation, ident(ALIAS))
        return sql.SQL("{} AS {} TABLESAMPLE SYSTEM ({})").format(
            self.relation, ident(ALIAS), sql.Literal(sample_percent)
        )


def source_side(model_sql: str) -> Side:
    """The model's rows. Every statement here binds parameters, so its `%` are doubled."""
    return Side("source", sql.SQL("({})").format(sql.SQL(model_sql.replace("%", "%%"))))


def destination_side(schema: str, name: str, filter: sql.Composable | None = None) -> Side:
    return Side("destination", ident(schema, name), filter)


@dataclass(frozen=True)
class Shape:
    """What is compared: the key, and the columns whose values are hashed with it."""

    key: tuple[KeyColumn, ...]
    columns: tuple[str, ...]
    # hashtextextended (about twice as fast as md5) when both servers agree on its value
    # (`agree_on_fast_hash`); md5 otherwise.
    fast_hash: bool = True

    def sort_key_of(self, width: int) -> sql.Composable:
        """The sort key's first `width` columns: a bound of that many values compares them."""
        exprs = [k.sort_expr for k in self.key[:width]]
        if len(exprs) == 1:
            return exprs[0]
        return sql.SQL("ROW({})").format(sql.SQL(", ").join(exprs))

    @property
    def sort_key(self) -> sql.Composable:
        return self.sort_key_of(len(self.key))

    @property
    def row_hash(self) -> sql.Composable:
        """A 64-bit hash of the row's text: summed per range, and compared per row."""
        values = sql.SQL(", ").join(
            sql.SQL("{}.{}").format(ident(ALIAS), ident(c)) for c in self.columns
        )
        if self.fast_hash:
            return sql.SQL('hashtextextended(ROW({})::text COLLATE "C", 0)').format(values)
        return sql.SQL("('x' || left(md5(ROW({})::text), 16))::bit(64)::bigint").format(values)

    def key_text(self) -> sql.Composable:
        return sql.SQL(", ").join(sql.SQL("{}::text").format(k.column) for k in self.key)

    def bound(self, value: Bound, params: list[Any]) -> sql.Composable:
        """A sort-key value, or a prefix of one, as a typed expression; its text goes into
        `params`."""
        params.extend(value)
        parts = [sql.SQL("%s::{}").format(k.sort_type) for k in self.key[: len(value)]]
        if len(parts) == 1:
            return parts[0]
        return sql.SQL("ROW({})").format(sql.SQL(", ").join(parts))

    def within(self, lo: Bound | None, hi: Bound | None, params: list[Any]) -> sql.Composable:
        """`lo <= key < hi` (an open end where None); a bound of fewer values than the key
        has columns compares that prefix of the key."""
        terms = []
        for op, value in ((">=", lo), ("<", hi)):
            if value is not None:
                terms.append(
                    sql.SQL("{} {} {}").format(
                        self.sort_key_of(len(value)), sql.SQL(op), self.bound(value, params)
                    )
                )
        return sql.SQL(" AND ").join(terms) if terms else sql.SQL("TRUE")

    def bucket(self, thresholds: Sequence[Bound], params: list[Any]) -> sql.Composable:
        """The bucket number of a row: 0 below the first threshold, i from threshold i-1
        up to (not including) threshold i (PostgreSQL's `width_bucket`).

        Thresholds of one value each cut on the key's first column: a constant array, which
        `width_bucket` searches fast. Thresholds of a composite key become an array of rows
        built by a subquery, which costs per row in proportion to its length: the bisection
        keeps those short."""
        if not thresholds:
            return sql.SQL("0")
        if isinstance(thresholds, EvenCuts):
            cuts = thresholds.values
            params.extend([cuts.start, cuts[-1], cuts.step])
            return sql.SQL(
                "width_bucket({}, ARRAY(SELECT generate_series(%s::bigint, %s::bigint, "
                "%s::bigint))::{}[])"
            ).format(self.sort_key_of(1), self.key[0].sort_type)
        columns = list(zip(*thresholds, strict=True))
        if len(columns) == 1:
            params.append(list(columns[0]))
            return sql.SQL("width_bucket({}, %s::text[]::{}[])").format(
                self.sort_key_of(1), self.key[0].sort_type
            )
        params.extend(list(c) for c in columns)
        names = [ident(f"c{i}") for i in range(len(self.key))]
        return sql.SQL(
            "width_bucket({key}, (SELECT array_agg(ROW({typed}) ORDER BY b.o) "
            "FROM unnest({arrays}) WITH ORDINALITY AS b({names}, o)))"
        ).format(
            key=self.sort_key,
            typed=sql.SQL(", ").join(
                sql.SQL("b.{}::{}").format(n, k.sort_type)
                for n, k in zip(names, self.key, strict=True)
            ),
            arrays=sql.SQL(", ").join(sql.SQL("%s::text[]") for _ in self.key),
            names=sql.SQL(", ").join(names),
        )


def _where(side: Side, condition: sql.Composable) -> sql.Composable:
    if side.filter is None:
        return condition
    return sql.SQL("({}) AND ({})").format(side.filter, condition)


def checksums(
    shape: Shape,
    side: Side,
    thresholds: Sequence[Bound],
    lo: Bound | None,
    hi: Bound | None,
) -> tuple[sql.Composable, list[Any]]:
    """Per bucket of `thresholds` within [lo, hi): its number, rows and the sum of their
    hashes. One scan of the range."""
    params: list[Any] = []
    bucket = shape.bucket(thresholds, params)
    where = _where(side, shape.within(lo, hi, params))
    query = sql.SQL(
        "SELECT {bucket} AS bucket, count(*), coalesce(sum({hash}), 0) FROM {src} "
        "WHERE {where} GROUP BY 1"
    ).format(bucket=bucket, hash=shape.row_hash, src=side.from_clause(), where=where)
    return query, params


def _sort_texts(shape: Shape, source: str) -> sql.Composable:
    return sql.SQL(", ").join(
        sql.SQL("{}.{}::text").format(ident(source), ident(f"s{i}")) for i in range(len(shape.key))
    )


def _sort_columns(shape: Shape) -> sql.Composable:
    return sql.SQL(", ").join(
        sql.SQL("{} AS {}").format(k.sort_expr, ident(f"s{i}")) for i, k in enumerate(shape.key)
    )


def sample(shape: Shape, side: Side, percent: float) -> tuple[sql.Composable, list[Any]]:
    """Distinct values of the key's first column in a random sample of the side's pages, in
    order (a table only): cuts of the first pass."""
    first = shape.key[0]
    where = side.filter if side.filter is not None else sql.SQL("TRUE")
    query = sql.SQL(
        "SELECT q.s0::text FROM (SELECT DISTINCT {expr} AS s0 FROM {src} WHERE {where}) AS q "
        "ORDER BY q.s0"
    ).format(expr=first.sort_expr, src=side.from_clause(percent), where=where)
    return query, []


def split_points(
    shape: Shape, side: Side, lo: Bound | None, hi: Bound | None, every: int
) -> tuple[sql.Composable, list[Any]]:
    """Every `every`-th sort key of the side's rows in [lo, hi), in order: the thresholds
    that cut a range into buckets of that many rows."""
    params: list[Any] = []
    where = _where(side, shape.within(lo, hi, params))
    order = sql.SQL(", ").join(k.sort_expr for k in shape.key)
    query = sql.SQL(
        "SELECT {texts} FROM (SELECT {cols}, row_number() OVER (ORDER BY {order}) AS rn "
        "FROM {src} WHERE {where}) AS q WHERE q.rn %% {every} = 0 ORDER BY q.rn"
    ).format(
        texts=_sort_texts(shape, "q"),
        cols=_sort_columns(shape),
        order=order,
        src=side.from_clause(),
        where=where,
        every=sql.Literal(every),
    )
    return query, params


def any_of(
    shape: Shape, ranges: Sequence[tuple[Bound | None, Bound | None]], params: list[Any]
) -> sql.Composable:
    return sql.SQL(" OR ").join(
        sql.SQL("({})").format(shape.within(lo, hi, params)) for lo, hi in ranges
    )


def row_hashes(
    shape: Shape,
    side: Side,
    ranges: Sequence[tuple[Bound | None, Bound | None]],
    fresh: sql.Composable | None = None,
    fresh_params: Sequence[Any] = (),
) -> tuple[sql.Composable, list[Any]]:
    """Every row of the ranges: its key (text), its hash and, on the source, whether the
    cursor has yet to reach it (`fresh`).

    A key whose columns compare as themselves gets one SELECT per range, joined by UNION
    ALL: each is an index range scan (a single scan testing hundreds of ORed ranges per row
    would cost more than hashing the table). A text-like key column has no index in byte
    order to use: one scan tests the ranges."""
    params: list[Any] = []

    def select(spans: Sequence[tuple[Bound | None, Bound | None]]) -> sql.Composable:
        params.extend(fresh_params)  # the SELECT list's, before the WHERE clause's
        return sql.SQL("SELECT {keys}, {hash}, {fresh} FROM {src} WHERE {where}").format(
            keys=shape.key_text(),
            hash=shape.row_hash,
            fresh=fresh if fresh is not None else sql.SQL("false"),
            src=side.from_clause(),
            where=_where(side, any_of(shape, spans, params)),
        )

    if any(k.collatable for k in shape.key):
        return select(ranges), params
    return sql.SQL(" UNION ALL ").join(select([span]) for span in ranges), params


def keys_in(shape: Shape, keys: Sequence[tuple[str, ...]], params: list[Any]) -> sql.Composable:
    """`(key columns) IN (the given keys)`, the keys bound as text arrays."""
    names = [ident(f"k{i}") for i in range(len(shape.key))]
    params.extend(list(column) for column in zip(*keys, strict=True))
    return sql.SQL("({cols}) IN (SELECT {typed} FROM unnest({arrays}) AS u({names}))").format(
        cols=sql.SQL(", ").join(k.column for k in shape.key),
        typed=sql.SQL(", ").join(
            sql.SQL("u.{}::{}").format(n, sql.SQL(k.type))
            for n, k in zip(names, shape.key, strict=True)
        ),
        arrays=sql.SQL(", ").join(sql.SQL("%s::text[]") for _ in shape.key),
        names=sql.SQL(", ").join(names),
    )


def rows_of(
    shape: Shape, side: Side, columns: Sequence[str], keys: Sequence[tuple[str, ...]]
) -> tuple[sql.Composable, list[Any]]:
    """The rows with these keys: key text, then every column as text."""
    params: list[Any] = []
    where = _where(side, keys_in(shape, keys, params))
    query = sql.SQL("SELECT {keys}, {values} FROM {src} WHERE {where}").format(
        keys=shape.key_text(),
        values=sql.SQL(", ").join(
            sql.SQL("{}.{}::text").format(ident(ALIAS), ident(c)) for c in columns
        ),
        src=side.from_clause(),
        where=where,
    )
    return query, params


def delete_keys(
    shape: Shape, target: sql.Composable, keys: Sequence[tuple[str, ...]]
) -> tuple[sql.Composable, list[Any]]:
    params: list[Any] = []
    query = sql.SQL("DELETE FROM {} AS {} WHERE {}").format(
        target, ident(ALIAS), keys_in(shape, keys, params)
    )
    return query, params


def upsert_rows(
    shape: Shape,
    target: sql.Composable,
    columns: Sequence[tuple[str, str]],
    rows: Sequence[Sequence[str | None]],
    extra: Sequence[tuple[str, sql.Composable]] = (),
) -> tuple[sql.Composable, list[Any]]:
    """Insert the rows (every value as text, cast to its column's type), or update the row
    with the same key. `extra` columns are set to an expression on insert and update (the
    delete mark, reset when a row comes back)."""
    names = [ident(f"v{i}") for i in range(len(columns))]
    key = {k.name for k in shape.key}
    idents = [ident(c) for c, _ in columns] + [ident(c) for c, _ in extra]
    updates = [
        sql.SQL("{0} = EXCLUDED.{0}").format(ident(c)) for c, _ in columns if c not in key
    ] + [sql.SQL("{0} = EXCLUDED.{0}").format(ident(c)) for c, _ in extra]
    query = sql.SQL(
        "INSERT INTO {target} ({idents}) SELECT {typed} FROM unnest({arrays}) AS u({names}) "
        "ON CONFLICT ({key}) DO {action}"
    ).format(
        target=target,
        idents=sql.SQL(", ").join(idents),
        typed=sql.SQL(", ").join(
            [
                sql.SQL("u.{}::{}").format(n, sql.SQL(t))
                for n, (_, t) in zip(names, columns, strict=True)
            ]
            + [e for _, e in extra]
        ),
        arrays=sql.SQL(", ").join(sql.SQL("%s::text[]") for _ in columns),
        names=sql.SQL(", ").join(names),
        key=sql.SQL(", ").join(ident(k.name) for k in shape.key),
        action=(
            sql.SQL("UPDATE SET {}").format(sql.SQL(", ").join(updates))
            if updates
            else sql.SQL("NOTHING")
        ),
    )
    return query, [list(column) for column in zip(*rows, strict=True)]


FAST_HASH_PROBE = "SELECT hashtextextended('replicator: one hash for both sides?', 0)"
