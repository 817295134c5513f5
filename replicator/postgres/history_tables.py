"""A copy's history table: every version of each row, with the time it was valid.

`tables[].history` keeps one beside the copy (docs/guides/history.md). It has the copy's
columns, then `_valid_from` (when the version began), `_valid_to` (when it ended; NULL while
it is current), `_is_current` and `_op` (what began it: `snapshot`, `insert`, `update`),
and one row per (key, `_valid_from`). The copy stays what it is, a mirror; the history table
only grows: a version is closed, never removed (but for one that a transaction replaced
before it committed, which no reader ever saw).

This module writes the versions a load brings: the first load's rows, each valid from the
load's snapshot, and a later full reload's differences (rows whose text changed or that are
new get a version, rows gone are closed, untouched rows keep theirs). The statements run in
the swap's transaction, after the new table took the copy's name, so the copy and its
history change together. The log's versions (a `cdc` table) are written by
cdc/apply/history_apply.py with the names below.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from psycopg import sql

from ..base.identifiers import TableName
from .catalog import Column
from .database import Step, nested_loop
from .ddl import column_def, create_schema

VALID_FROM, VALID_TO, IS_CURRENT, OP = "_valid_from", "_valid_to", "_is_current", "_op"
HISTORY_COLUMNS = (VALID_FROM, VALID_TO, IS_CURRENT, OP)
# PostgreSQL cuts a longer name silently: a history table's name must fit
MAX_NAME_BYTES = 63


@dataclass(frozen=True)
class Versions:
    """What a run wrote in a history table: versions begun, and versions ended."""

    added: int = 0
    closed: int = 0

    def __add__(self, other: Versions) -> Versions:
        return Versions(self.added + other.added, self.closed + other.closed)


@dataclass(frozen=True)
class HistoryTable:
    """Where one copy's versions are kept, and the copy's shape they follow."""

    name: TableName
    copy: TableName
    key: tuple[str, ...]
    columns: tuple[Column, ...]  # the copy's, in its order

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def names(self) -> dict[str, sql.Composable]:
        """What every statement of the history names, for its `format`: the table (`h`),
        the copy, the four columns (`hop` the version's `_op`), the copy's columns."""
        return {
            "h": self.name.identifier(),
            "copy": self.copy.identifier(),
            "valid_from": sql.Identifier(VALID_FROM),
            "valid_to": sql.Identifier(VALID_TO),
            "is_current": sql.Identifier(IS_CURRENT),
            "hop": sql.Identifier(OP),
            "columns": sql.SQL(", ").join(map(sql.Identifier, self.column_names)),
        }

    def problem(self) -> str | None:
        """Why the table cannot be kept (None: it can)."""
        if not self.key:
            return (
                "a history table needs the copy's key (its versions are found by it): give the "
                'table a primary key, or name one with "primary_key"'
            )
        if len(self.name.name.encode()) > MAX_NAME_BYTES:
            return (
                f"the history table's name {self.name.name} is longer than PostgreSQL's 63 "
                'bytes: name a shorter one with "history": {"table": "schema.name"}'
            )
        clash = sorted(set(self.column_names) & set(HISTORY_COLUMNS))
        if clash:
            return (
                f"the copy has column(s) {', '.join(clash)}, which its history table needs "
                "for its own: rename them in a model"
            )
        return None


def ensure_steps(history: HistoryTable) -> list[Step]:
    """The history table made when missing, and given the columns the copy gained (a
    column the copy lost stays: the past had it)."""
    columns = [dataclasses.replace(c, not_null=False) for c in history.columns]
    unique = sql.SQL(", ").join(map(sql.Identifier, (*history.key, VALID_FROM)))
    create = sql.SQL(
        "CREATE TABLE IF NOT EXISTS {h} ({definitions}, {valid_from} timestamptz NOT NULL, "
        "{valid_to} timestamptz, {is_current} boolean NOT NULL DEFAULT true, "
        "{hop} text NOT NULL, UNIQUE ({unique}))"
    ).format(
        definitions=sql.SQL(", ").join(map(column_def, columns)),
        unique=unique,
        **history.names(),
    )
    steps = [Step("destination", create_schema(history.name.schema)), Step("destination", create)]
    steps += [
        Step(
            "destination",
            sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {}").format(
                history.name.identifier(), column_def(column)
            ),
        )
        for column in columns
    ]
    return steps


def row_text(alias: str, columns: Sequence[str]) -> sql.Composed:
    """The text of a row over the copy's columns: versions differ where it does."""
    return sql.SQL("ROW({})::text").format(
        sql.SQL(", ").join(sql.Identifier(alias, c) for c in columns)
    )


def key_match(
    left: str, right: str, key: Sequence[str], equals: Mapping[str, str] | None = None
) -> sql.Composed:
    """`left` and `right` have the same key, by each key column's own equality (`equals`:
    an operator where `=` may not find it, postgres/types/key_equality.py)."""
    return sql.SQL(" AND ").join(
        sql.SQL("{} {} {}").format(
            sql.Identifier(left, k), sql.SQL((equals or {}).get(k, "=")), sql.Identifier(right, k)
        )
        for k in key
    )


def current_version(
    history: HistoryTable,
    alias: str,
    equals: Mapping[str, str] | None = None,
    *,
    left: bool = False,
    name: str = "c",
) -> sql.Composed:
    """Each row `alias` joined with its key's latest version as `name` (its columns, and its
    `_replicator_tid`): the key's current version when its `_is_current` is true
    (a deleted key's latest version is closed). The latest is the last entry of the key in
    the unique index on (key, `_valid_from`), since a key's versions only begin later: one
    lookup, however many versions the key has. `left`: a key without a current version
    keeps its row, with NULLs in `c`."""
    latest = sql.SQL(
        "LATERAL (SELECT x.ctid AS _replicator_tid, x.* "
        "FROM {h} AS x WHERE {match} ORDER BY x.{valid_from} DESC LIMIT 1) AS {name}"
    ).format(
        match=key_match("x", alias, history.key, equals),
        name=sql.Identifier(name),
        **history.names(),
    )
    if left:
        return sql.SQL(" LEFT JOIN {} ON {}").format(latest, sql.Identifier(name, IS_CURRENT))
    return sql.SQL(" CROSS JOIN {}").format(latest)


def snapshot_steps(history: HistoryTable, taken_at: datetime | str) -> list[Step]:
    """The copy (just swapped in, read whole) against the history's current versions: a
    current version whose row the copy no longer has as it was is closed at `taken_at`, and
    every row of the copy without a current version gets one from then. The first load
    writes a version of every row; a reload of unchanged rows writes none."""
    columns = history.column_names
    names = history.names()
    close = sql.SQL(
        "UPDATE {h} AS h SET {valid_to} = %(at)s, {is_current} = false WHERE h.{is_current} "
        "AND NOT EXISTS (SELECT FROM {copy} AS c WHERE {match} AND {c_text} = {h_text})"
    ).format(
        match=key_match("c", "h", history.key),
        c_text=row_text("c", columns),
        h_text=row_text("h", columns),
        **names,
    )
    open_ = sql.SQL(
        "INSERT INTO {h} ({columns}, {valid_from}, {hop}) SELECT {c_names}, %(at)s, "
        "'snapshot' FROM {copy} AS c WHERE NOT EXISTS (SELECT FROM {h} AS h "
        "WHERE h.{is_current} AND {match})"
    ).format(
        c_names=sql.SQL(", ").join(sql.Identifier("c", c) for c in columns),
        match=key_match("h", "c", history.key),
        **names,
    )
    params = {"at": taken_at}
    return [
        *ensure_steps(history),
        Step("destination", close, params),
        Step("destination", open_, params),
    ]


# A cursor table's versions begin at the replication key's value when it is a time
_TIME_TYPES = ("timestamp with time zone", "timestamp without time zone")
_READ = sql.Identifier("replicator_history_read")


def batch_steps(
    history: HistoryTable,
    staged: sql.Composable,
    taken_at: datetime | str,
    replication_key: str | None,
    key_type: str = "",
    *,
    append: bool = False,
) -> VersionSteps:
    """A cursor batch's versions, after its merge, in the merge's transaction: each key the
    batch read whose row in the copy now differs from its current version (or that has none)
    gets a version, which ends the current one. It begins at the row's replication key
    when that is a time, else at the batch's snapshot (`taken_at`), and always after the
    version it ends. A batch that read rows again as they were writes nothing. (A
    string `taken_at` is what `compile` shows for a time the run binds.) `append`: the copy
    keeps each key's first row (incremental-append), so the rows are the batch's own, the
    newest of each key."""
    columns = history.column_names
    begins = sql.SQL("%(at)s")
    if replication_key is not None and key_type.startswith(_TIME_TYPES):
        begins = sql.SQL("coalesce(c.{}::timestamptz, %(at)s)").format(
            sql.Identifier(replication_key)
        )
    keys = sql.SQL(", ").join(map(sql.Identifier, history.key))
    names = {
        **history.names(),
        "read": _READ,
        "at": sql.Identifier("_replicator_at"),
        "was": sql.Identifier("_replicator_was"),
    }
    rows = sql.SQL("{copy} AS c JOIN (SELECT DISTINCT {keys} FROM {staged}) AS s ON {match_s}")
    if append:
        newest = [sql.SQL("s::text DESC")]
        if replication_key is not None:
            newest.insert(0, sql.SQL("s.{} DESC").format(sql.Identifier(replication_key)))
        rows = sql.SQL(
            "(SELECT DISTINCT ON ({keys}) * FROM {staged} AS s ORDER BY {keys}, {newest}) AS c"
        ).format(keys=keys, staged=staged, newest=sql.SQL(", ").join(newest))
    read = sql.SQL(
        "CREATE TEMP TABLE {read} ON COMMIT DROP AS SELECT {c_names}, "
        "greatest({begins}, h.{valid_from} + interval '1 microsecond') AS {at}, "
        "h.{valid_from} IS NOT NULL AS {was}, h._replicator_tid FROM {rows}{current} "
        "WHERE h.{valid_from} IS NULL OR {c_text} <> {h_text}"
    ).format(
        rows=rows.format(
            copy=history.copy.identifier(),
            keys=keys,
            staged=staged,
            match_s=key_match("c", "s", history.key),
        ),
        c_names=sql.SQL(", ").join(sql.Identifier("c", c) for c in columns),
        begins=begins,
        current=current_version(history, "c", left=True, name="h"),
        c_text=row_text("c", columns),
        h_text=row_text("h", columns),
        **names,
    )
    close = sql.SQL(
        "UPDATE {h} AS h SET {valid_to} = r.{at}, {is_current} = false FROM {read} AS r "
        "WHERE h.ctid = r._replicator_tid"
    ).format(**names)
    open_ = sql.SQL(
        "INSERT INTO {h} ({columns}, {valid_from}, {hop}) SELECT {r_names}, r.{at}, "
        "CASE WHEN r.{was} THEN 'update' ELSE 'insert' END FROM {read} AS r"
    ).format(r_names=sql.SQL(", ").join(sql.Identifier("r", c) for c in columns), **names)
    closing, opening = Step("destination", close), Step("destination", open_)
    held = [Step("destination", statement) for statement in nested_loop(True)]
    let_go = [Step("destination", statement) for statement in nested_loop(False)]
    steps = [
        *held,
        Step("destination", read, {"at": taken_at}),
        closing,
        *let_go,
        opening,
        Step("destination", sql.SQL("DROP TABLE {}").format(_READ)),
    ]
    return VersionSteps(steps, closing, opening)


@dataclass(frozen=True)
class VersionSteps:
    """A batch's version statements, and which of them close and open versions."""

    steps: list[Step]
    close: Step
    open: Step


def gone_steps(history: HistoryTable, at: datetime, present: sql.Composable) -> list[Step]:
    """After a delete check: the current version of each key the copy no longer holds (or,
    `present` false for it, holds marked deleted) ends at the check's time."""
    close = sql.SQL(
        "UPDATE {h} AS h SET {valid_to} = greatest(%(at)s, h.{valid_from}), {is_current} = false "
        "WHERE h.{is_current} AND NOT EXISTS (SELECT FROM {copy} AS c WHERE {match} AND {present})"
    ).format(match=key_match("c", "h", history.key), present=present, **history.names())
    return [Step("destination", close, {"at": at})]
