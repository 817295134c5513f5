"""A `cdc` table's history from its staged changes: one version per key for each committed
transaction that changed it, valid from that transaction's commit time (docs/guides/history.md).

The drain keeps each transaction's first sequence number and commit time (pgoutput's Begin
carries it): a change's commit time is found from its sequence number by PostgreSQL's
`width_bucket` over those numbers, bound with the statement (`Commits`). `write_versions`
runs in the apply's own transaction, so versions, copy and log position commit together and
a replayed batch is never written twice:

1. each key's last change in each transaction (an *event*; a delete, or a row the table's
   `where` no longer keeps, ends the key's version without beginning one), with the TOASTed
   values the change left out taken from the key's earlier change, else from the copy;
2. each key's current version closed by its first event, and every current version by a
   TRUNCATE (a version begun by the same transaction, in an earlier part of a transaction
   bigger than a batch, is replaced instead: no reader saw it);
3. a version per event that is not a delete, ended by the key's next event or the next
   TRUNCATE, whichever comes first; `_op` is `insert` when the key had no version just
   before it, else `update`.

A batch that holds each key once, with no TRUNCATE, no `where` and no part before it (the
common case) takes a shorter way: no events to sort, the changes are the events.

A key's current version is its latest (`_valid_from` only grows), which the unique index
on (key, `_valid_from`) finds at its end: a lookup costs the same however many versions the
key has. The planner is held to those lookups, as the copy's apply is (table_apply._write).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from ...postgres.database import execute, nested_loop
from ...postgres.history_tables import (
    HistoryTable,
    Versions,
    current_version,
)
from ..rows.table_stage import OP as STAGED_OP
from ..rows.table_stage import SEQ, UNCHANGED_COLUMNS, TableStage
from .apply_sql import Equals, match

_EVENTS = sql.Identifier("replicator_history_events")
_FIRSTS = sql.Identifier("replicator_history_firsts")
_TRUNCATES = sql.Identifier("replicator_history_truncates")
_AT = sql.Identifier("_replicator_at")  # an event's commit time
# a key's version current before the batch: where it is, when it began, what began it
_TID, _WAS_FROM, _WAS_OP = (
    sql.Identifier("_replicator_tid"),
    sql.Identifier("_replicator_was_from"),
    sql.Identifier("_replicator_was_op"),
)


@dataclass(frozen=True)
class Commits:
    """A batch's transactions: the first sequence number each one's changes may have, and
    its commit time, in commit order."""

    starts: list[int]
    times: list[datetime]

    @classmethod
    def of(cls, transactions: Sequence[tuple[int, datetime]]) -> Commits:
        """From the drain's (sequence number before the first change, commit time)."""
        return cls([seq + 1 for seq, _ in transactions], [at for _, at in transactions])

    def at(self, seq: sql.Composable) -> sql.Composable:
        """The commit time of the change numbered `seq` (bound as `starts` and `times`)."""
        return sql.SQL(
            "(%(times)s::timestamptz[])[pg_catalog.width_bucket({}, %(starts)s::bigint[])]"
        ).format(seq)

    @property
    def params(self) -> dict[str, Any]:
        return {"starts": self.starts, "times": self.times}


def write_versions(
    dest: psycopg.Connection[Any],
    stage: TableStage,
    history: HistoryTable,
    commits: Commits,
    *,
    where: str | None = None,
    parted: bool = False,
) -> Versions:
    """The staged changes' versions in `history` (see the module's docstring), before the
    copy takes them: an unchanged TOASTed value is the copy's still. `parted`: the batch's
    first transaction began in a part applied before, whose versions it replaces."""
    # short statements over temporary tables whose row counts the planner guesses:
    # compiling them costs more than running them
    execute(dest, "SET LOCAL jit = off")
    if stage.simple and not stage.truncates and where is None and not parted:
        return _each_key_once(dest, stage, history, commits)
    return _events(dest, stage, history, commits, where)


def _names(history: HistoryTable, equals: Equals) -> dict[str, sql.Composable]:
    return {
        **history.names(),
        "keys": sql.SQL(", ").join(map(sql.Identifier, history.key)),
        "seq": sql.Identifier(SEQ),
        "op": sql.Identifier(STAGED_OP),
        "at": _AT,
        "tid": _TID,
        "was_from": _WAS_FROM,
        "was_op": _WAS_OP,
        "events": _EVENTS,
        "firsts": _FIRSTS,
        "truncates": _TRUNCATES,
        "ef": match("e", "f", history.key, equals),
        "current": current_version(history, "e", equals),
    }


def _held(dest: psycopg.Connection[Any], on: bool) -> None:
    for statement in nested_loop(on):
        execute(dest, statement)


def _each_key_once(
    dest: psycopg.Connection[Any], stage: TableStage, history: HistoryTable, commits: Commits
) -> Versions:
    """Every key changed once in the batch: its current version ends at the change's commit
    and, unless it was a delete, the change begins the next one."""
    names = _names(history, stage.equals)
    names.update(stage=stage.name, at_of=commits.at(sql.SQL("e.{}").format(names["seq"])))
    _held(dest, True)
    execute(
        dest,
        sql.SQL("CREATE TEMP TABLE {firsts} AS SELECT {keys} FROM {h} WITH NO DATA").format(
            **names
        ),
    )
    closed = execute(
        dest,
        sql.SQL(
            "WITH closed AS (UPDATE {h} AS h SET {valid_to} = e.{at}, {is_current} = false "
            "FROM (SELECT e.*, {at_of} AS {at} FROM {stage} AS e) AS e{current} "
            "WHERE h.ctid = c.{tid} AND c.{is_current} AND h.{valid_from} < e.{at} "
            "RETURNING {h_keys}) "
            "INSERT INTO {firsts} SELECT * FROM closed"
        ).format(h_keys=sql.SQL(", ").join(sql.Identifier("h", k) for k in history.key), **names),
        commits.params,
    ).rowcount
    _held(dest, False)  # the versions are made by hashing the changes with the closed keys
    added = execute(
        dest,
        sql.SQL(
            "INSERT INTO {h} ({columns}, {valid_from}, {hop}) SELECT {e_columns}, {at_of}, "
            "CASE WHEN f.{first_key} IS NULL THEN 'insert' ELSE 'update' END "
            "FROM {stage} AS e LEFT JOIN {firsts} AS f ON {ef} WHERE e.{op} <> 'D'"
        ).format(
            e_columns=sql.SQL(", ").join(sql.Identifier("e", c) for c in history.column_names),
            first_key=sql.Identifier(history.key[0]),
            **names,
        ),
        commits.params,
    ).rowcount
    execute(dest, sql.SQL("DROP TABLE {}").format(_FIRSTS))
    return Versions(added=max(added, 0), closed=max(closed, 0))


def _events(
    dest: psycopg.Connection[Any],
    stage: TableStage,
    history: HistoryTable,
    commits: Commits,
    where: str | None,
) -> Versions:
    """The general way: a key changed in several transactions of the batch, a TRUNCATE, a
    `where`, or a transaction that began in a part before."""
    key, equals = history.key, stage.equals
    names = _names(history, equals)
    seq = names["seq"]
    execute(
        dest,
        sql.SQL(
            "CREATE TEMP TABLE {events} AS SELECT DISTINCT ON ({s_keys}, {txn}) {at_of} AS {at}, "
            "s.* FROM {stage} AS s ORDER BY {s_keys}, {txn}, s.{seq} DESC"
        ).format(
            s_keys=sql.SQL(", ").join(sql.Identifier("s", k) for k in key),
            txn=sql.SQL("pg_catalog.width_bucket(s.{}, %(starts)s::bigint[])").format(seq),
            at_of=commits.at(sql.SQL("s.{}").format(seq)),
            stage=stage.name,
            **{k: v for k, v in names.items() if k in ("at", "events", "seq")},
        ),
        commits.params,
    )
    execute(
        dest,
        sql.SQL(
            "CREATE TEMP TABLE {truncates} AS SELECT s.seq, {at_of} AS {at} "
            "FROM unnest(%(truncated)s::bigint[]) AS s(seq)"
        ).format(at_of=commits.at(sql.SQL("s.seq")), **names),
        {**commits.params, "truncated": list(stage.truncates)},
    )
    if where is not None:  # a row the filter no longer keeps leaves the copy: its version ends
        execute(
            dest,
            sql.SQL(
                "UPDATE {events} SET {op} = 'D' WHERE {op} <> 'D' AND NOT coalesce(({where}\n), "
                "false)"
            ).format(where=sql.SQL(where), **names),
        )
    if not stage.simple:
        _fill_unchanged(dest, stage, history)
    _held(dest, True)
    execute(
        dest,
        sql.SQL(
            "CREATE TEMP TABLE {firsts} AS SELECT e.*, c.{tid}, c.{valid_from} AS {was_from}, "
            "c.{hop} AS {was_op} FROM (SELECT DISTINCT ON ({keys}) {keys}, {seq}, {at} "
            "FROM {events} ORDER BY {keys}, {seq}) AS e{current_left}"
        ).format(current_left=current_version(history, "e", equals, left=True), **names),
    )
    truncates = bool(stage.truncates)
    first_truncate = sql.SQL("(SELECT min(seq) FROM {})").format(_TRUNCATES)
    # each key's current version ends at its first event (one before any TRUNCATE)
    before = (
        sql.SQL(" AND ({} IS NULL OR f.{} < {})").format(first_truncate, seq, first_truncate)
        if truncates
        else sql.SQL("")
    )
    closed = _rows(
        dest,
        "UPDATE {h} AS h SET {valid_to} = f.{at}, {is_current} = false FROM {firsts} AS f "
        "WHERE h.ctid = f.{tid}{before} AND f.{was_from} < f.{at}",
        names,
        before=before,
    )
    # the version an earlier part of the same transaction began: replaced, no reader saw it
    removed = _rows(
        dest,
        "DELETE FROM {h} AS h USING {firsts} AS f WHERE h.ctid = f.{tid}{before} "
        "AND f.{was_from} >= f.{at}",
        names,
        before=before,
    )
    if truncates:  # every version still current ends at the batch's first TRUNCATE
        when = sql.SQL("(SELECT {} FROM {} ORDER BY seq LIMIT 1)").format(_AT, _TRUNCATES)
        closed += _rows(
            dest,
            "UPDATE {h} AS h SET {valid_to} = {when}, {is_current} = false "
            "WHERE h.{is_current} AND h.{valid_from} < {when}",
            names,
            when=when,
        )
        removed += _rows(
            dest,
            "DELETE FROM {h} AS h WHERE h.{is_current} AND h.{valid_from} >= {when}",
            names,
            when=when,
        )
    _held(dest, False)  # the versions are made by hashing the events
    added, ended = _open(dest, history, names, truncates)
    for table in (_EVENTS, _FIRSTS, _TRUNCATES):
        execute(dest, sql.SQL("DROP TABLE {}").format(table))
    return Versions(added=added - removed, closed=closed + ended)


def _rows(
    dest: psycopg.Connection[Any], statement: str, names: dict[str, sql.Composable], **more: Any
) -> int:
    return max(execute(dest, sql.SQL(statement).format(**names, **more)).rowcount, 0)


def _open(
    dest: psycopg.Connection[Any],
    history: HistoryTable,
    names: dict[str, sql.Composable],
    truncates: bool,
) -> tuple[int, int]:
    """A version per event that is not a delete; returns how many, and how many of them
    ended in the batch. Without a TRUNCATE in the batch, the statement has no lookups of
    them (one per event, which made the planner's estimate large enough to compile it)."""
    more = {
        "next_seq": sql.Identifier("_replicator_next_seq"),
        "next_at": sql.Identifier("_replicator_next_at"),
        "prev_seq": sql.Identifier("_replicator_prev_seq"),
        "prev_op": sql.Identifier("_replicator_prev_op"),
        "ends": sql.Identifier("_replicator_ends"),
        "kind": sql.Identifier("_replicator_kind"),
        "v_columns": sql.SQL(", ").join(sql.Identifier("v", c) for c in history.column_names),
        "vf": match("v", "f", history.key),
    }
    if truncates:
        ends = (
            "CASE WHEN v.{next_seq} IS NOT NULL AND (t.seq IS NULL OR v.{next_seq} < t.seq) "
            "THEN v.{next_at} ELSE t.{at} END"
        )
        between = (
            " AND NOT EXISTS (SELECT FROM {truncates} AS b WHERE b.seq > "
            "coalesce(v.{prev_seq}, 0) AND b.seq < v.{seq})"
        )
        next_truncate = (
            " LEFT JOIN LATERAL (SELECT b.seq, b.{at} FROM {truncates} AS b "
            "WHERE b.seq > v.{seq} ORDER BY b.seq LIMIT 1) AS t ON true"
        )
    else:
        ends, between, next_truncate = "v.{next_at}", "", ""
    statement = (
        "WITH v AS (SELECT e.*, lead(e.{seq}) OVER w AS {next_seq}, "
        "lead(e.{at}) OVER w AS {next_at}, lag(e.{seq}) OVER w AS {prev_seq}, "
        "lag(e.{op}) OVER w AS {prev_op} FROM {events} AS e "
        "WINDOW w AS (PARTITION BY {keys} ORDER BY e.{seq})), "
        # a version ends at the key's next event, or at the next TRUNCATE if that is first
        "o AS (SELECT v.*, " + ends + " AS {ends}, "
        # the version a transaction's earlier part began keeps its kind
        "CASE WHEN v.{prev_seq} IS NULL AND f.{was_from} = v.{at} THEN f.{was_op} "
        "WHEN (CASE WHEN v.{prev_seq} IS NULL THEN f.{was_from} IS NOT NULL "
        "ELSE v.{prev_op} <> 'D' END)" + between + " THEN 'update' "
        "ELSE 'insert' END AS {kind} "
        "FROM v JOIN {firsts} AS f ON {vf}" + next_truncate + " WHERE v.{op} <> 'D'), "
        "ins AS (INSERT INTO {h} ({columns}, {valid_from}, {valid_to}, {is_current}, {hop}) "
        "SELECT {v_columns}, v.{at}, v.{ends}, v.{ends} IS NULL, v.{kind} FROM o AS v "
        "WHERE v.{ends} IS NULL OR v.{ends} > v.{at} RETURNING {valid_to} IS NOT NULL AS ended) "
        "SELECT count(*), count(*) FILTER (WHERE ended) FROM ins"
    )
    added, ended = execute(dest, sql.SQL(statement).format(**names, **more)).fetchone()
    return int(added), int(ended)


def _fill_unchanged(
    dest: psycopg.Connection[Any], stage: TableStage, history: HistoryTable
) -> None:
    """An event's TOASTed values its change left as they were: from the key's newest earlier
    change that carried the column, else from the copy (a TOASTed value is never NULL)."""
    unchanged = sql.Identifier(UNCHANGED_COLUMNS)
    seq, op = sql.Identifier(SEQ), sql.Identifier(STAGED_OP)
    (positions,) = execute(
        dest,
        sql.SQL(
            "SELECT coalesce(array_agg(DISTINCT p.n), '{{}}') FROM {events} AS e, "
            "unnest(e.{u}) AS p(n) WHERE e.{op} <> 'D'"
        ).format(events=_EVENTS, u=unchanged, op=op),
    ).fetchone()
    for position in positions:
        column = sql.Identifier(stage.columns[position - 1])
        execute(
            dest,
            sql.SQL(
                "UPDATE {events} AS e SET {c} = coalesce((SELECT x.{c} FROM {stage} AS x WHERE "
                "{match_x} AND x.{seq} < e.{seq} AND x.{op} <> 'D' AND NOT {p} = ANY(x.{u}) "
                "ORDER BY x.{seq} DESC LIMIT 1), (SELECT d.{c} FROM {copy} AS d WHERE {match_d})) "
                "WHERE {p} = ANY(e.{u}) AND e.{op} <> 'D'"
            ).format(
                events=_EVENTS,
                c=column,
                stage=stage.name,
                match_x=match("x", "e", history.key, stage.equals),
                seq=seq,
                op=op,
                p=sql.Literal(position),
                u=unchanged,
                copy=history.copy.identifier(),
                match_d=match("d", "e", history.key, stage.equals),
            ),
        )
