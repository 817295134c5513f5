"""A `cdc` table's history from its staged changes: one version per key for each committed
transaction that changed it, valid from that transaction's commit time (docs/guides/history.md).

The drain keeps each transaction's first sequence number and commit time (pgoutput's Begin
carries it), which `record_transactions` puts in a temporary table beside the staging
tables; `write_versions` then runs, in the apply's own transaction (so versions, copy and
log position commit together and a replayed batch is never written twice):

1. each key's last change in each transaction (an *event*; a delete, or a row the table's
   `where` no longer keeps, ends the key's version without beginning one), with the TOASTed
   values the change left out taken from the key's earlier change, else from the copy;
2. each key's current version closed by its first event, and every current version by a
   TRUNCATE (a version begun by the same transaction, in an earlier part of a transaction
   bigger than a batch, is replaced instead: no reader saw it);
3. a version per event that is not a delete, ended by the key's next event or the next
   TRUNCATE, whichever comes first; `_op` is `insert` when the key had no version just
   before it, else `update`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from ...postgres.database import execute
from ...postgres.history_tables import (
    IS_CURRENT,
    OP,
    VALID_FROM,
    VALID_TO,
    HistoryTable,
    Versions,
)
from ..rows.table_stage import OP as STAGED_OP
from ..rows.table_stage import SEQ, UNCHANGED_COLUMNS, TableStage
from .apply_sql import match

TRANSACTIONS = sql.Identifier("replicator_transactions")
_EVENTS = sql.Identifier("replicator_history_events")
_FIRSTS = sql.Identifier("replicator_history_firsts")
_TRUNCATES = sql.Identifier("replicator_history_truncates")
_AT = sql.Identifier("_replicator_at")  # an event's commit time
# a key's version current before the batch: when it began, and what began it
_WAS_FROM, _WAS_OP = sql.Identifier("_replicator_was_from"), sql.Identifier("_replicator_was_op")
_TRUE, _NULL = sql.SQL("true"), sql.SQL("NULL")


def record_transactions(
    dest: psycopg.Connection[Any], transactions: Sequence[tuple[int, datetime]]
) -> None:
    """The batch's transactions, each as the sequence number its changes come after and its
    commit time, in a temporary table of the session (emptied first)."""
    execute(
        dest,
        sql.SQL(
            "CREATE TEMP TABLE IF NOT EXISTS {} (seq bigint PRIMARY KEY, "
            "committed_at timestamptz NOT NULL)"
        ).format(TRANSACTIONS),
    )
    execute(dest, sql.SQL("TRUNCATE {}").format(TRANSACTIONS))
    with dest.cursor().copy(
        sql.SQL("COPY {} (seq, committed_at) FROM STDIN").format(TRANSACTIONS)
    ) as copy:
        for row in transactions:
            copy.write_row(row)


def write_versions(
    dest: psycopg.Connection[Any],
    stage: TableStage,
    history: HistoryTable,
    truncates: Sequence[int],
    where: str | None,
) -> Versions:
    """The staged changes' versions in `history` (see the module's docstring), before the
    copy takes them: an unchanged TOASTed value is the copy's still."""
    key, equals = history.key, stage.equals
    keys = sql.SQL(", ").join(map(sql.Identifier, key))
    seq, op = sql.Identifier(SEQ), sql.Identifier(STAGED_OP)
    execute(
        dest,
        sql.SQL(
            "CREATE TEMP TABLE {events} AS SELECT DISTINCT ON ({s_keys}, x.seq) x.committed_at "
            "AS {at}, s.* FROM {stage} AS s CROSS JOIN LATERAL (SELECT t.seq, t.committed_at "
            "FROM {txns} AS t WHERE t.seq < s.{seq} ORDER BY t.seq DESC LIMIT 1) AS x "
            "ORDER BY {s_keys}, x.seq, s.{seq} DESC"
        ).format(
            events=_EVENTS,
            s_keys=sql.SQL(", ").join(sql.Identifier("s", k) for k in key),
            at=_AT,
            stage=stage.name,
            txns=TRANSACTIONS,
            seq=seq,
        ),
    )
    execute(
        dest,
        sql.SQL(
            "CREATE TEMP TABLE {truncates} AS SELECT s.seq, (SELECT t.committed_at FROM {txns} "
            "AS t WHERE t.seq < s.seq ORDER BY t.seq DESC LIMIT 1) AS {at} "
            "FROM unnest(%s::bigint[]) AS s(seq)"
        ).format(truncates=_TRUNCATES, txns=TRANSACTIONS, at=_AT),
        (list(truncates),),
    )
    if where is not None:  # a row the filter no longer keeps leaves the copy: its version ends
        execute(
            dest,
            sql.SQL(
                "UPDATE {events} SET {op} = 'D' WHERE {op} <> 'D' AND NOT coalesce(({where}\n), "
                "false)"
            ).format(events=_EVENTS, op=op, where=sql.SQL(where)),
        )
    if not stage.simple:
        _fill_unchanged(dest, stage, history)
    execute(
        dest,
        sql.SQL(
            "CREATE TEMP TABLE {firsts} AS SELECT f.*, h.{valid_from} AS {was_from}, "
            "h.{hop} AS {was_op} FROM (SELECT DISTINCT ON ({keys}) {keys}, {seq}, {at} "
            "FROM {events} ORDER BY {keys}, {seq}) AS f "
            "LEFT JOIN {h} AS h ON {match} AND h.{is_current}"
        ).format(
            was_from=_WAS_FROM,
            was_op=_WAS_OP,
            firsts=_FIRSTS,
            valid_from=sql.Identifier(VALID_FROM),
            hop=sql.Identifier(OP),
            keys=keys,
            seq=seq,
            at=_AT,
            events=_EVENTS,
            h=history.name.identifier(),
            match=match("f", "h", key, equals),
            is_current=sql.Identifier(IS_CURRENT),
        ),
    )
    first_truncate = sql.SQL("(SELECT min(seq) FROM {})").format(_TRUNCATES)
    closed = removed = 0
    # each key's current version, ended by its first event (one before any TRUNCATE)
    before_truncate = sql.SQL("({} IS NULL OR f.{} < {})").format(
        first_truncate, seq, first_truncate
    )
    closed += _rows(
        dest,
        sql.SQL(
            "UPDATE {h} AS h SET {valid_to} = f.{at}, {is_current} = false FROM {firsts} AS f "
            "WHERE {match} AND h.{is_current} AND {before} AND h.{valid_from} < f.{at}"
        ),
        history,
        match("f", "h", key, equals),
        before_truncate,
    )
    removed += _rows(
        dest,
        sql.SQL(
            "DELETE FROM {h} AS h USING {firsts} AS f WHERE {match} AND h.{is_current} AND "
            "{before} AND h.{valid_from} >= f.{at}"
        ),
        history,
        match("f", "h", key, equals),
        before_truncate,
    )
    if truncates:  # every version still current ends at the batch's first TRUNCATE
        truncated_at = sql.SQL("(SELECT {at} FROM {t} ORDER BY seq LIMIT 1)").format(
            at=_AT, t=_TRUNCATES
        )
        closed += _rows(
            dest,
            sql.SQL(
                "UPDATE {h} AS h SET {valid_to} = {when}, {is_current} = false "
                "WHERE h.{is_current} AND h.{valid_from} < {when}"
            ),
            history,
            when=truncated_at,
        )
        removed += _rows(
            dest,
            sql.SQL("DELETE FROM {h} AS h WHERE h.{is_current} AND h.{valid_from} >= {when}"),
            history,
            when=truncated_at,
        )
    added, ended = _open(dest, history, equals)
    for table in (_EVENTS, _FIRSTS, _TRUNCATES):
        execute(dest, sql.SQL("DROP TABLE {}").format(table))
    return Versions(added=added - removed, closed=closed + ended)


def _rows(
    dest: psycopg.Connection[Any],
    statement: sql.SQL,
    history: HistoryTable,
    match_: sql.Composable = _TRUE,
    before: sql.Composable = _TRUE,
    when: sql.Composable = _NULL,
) -> int:
    composed = statement.format(
        h=history.name.identifier(),
        valid_to=sql.Identifier(VALID_TO),
        valid_from=sql.Identifier(VALID_FROM),
        is_current=sql.Identifier(IS_CURRENT),
        at=_AT,
        firsts=_FIRSTS,
        match=match_,
        before=before,
        when=when,
    )
    return max(execute(dest, composed).rowcount, 0)


def _open(dest: psycopg.Connection[Any], history: HistoryTable, equals: Any) -> tuple[int, int]:
    """A version per event that is not a delete; returns how many, and how many of them
    ended in the batch."""
    key = history.key
    keys = sql.SQL(", ").join(map(sql.Identifier, key))
    seq, op = sql.Identifier(SEQ), sql.Identifier(STAGED_OP)
    columns = sql.SQL(", ").join(map(sql.Identifier, history.column_names))
    v_columns = sql.SQL(", ").join(sql.Identifier("v", c) for c in history.column_names)
    statement = sql.SQL(
        "WITH v AS (SELECT e.*, lead(e.{seq}) OVER w AS {next_seq}, "
        "lead(e.{at}) OVER w AS {next_at}, lag(e.{seq}) OVER w AS {prev_seq}, "
        "lag(e.{op}) OVER w AS {prev_op} FROM {events} AS e "
        "WINDOW w AS (PARTITION BY {keys} ORDER BY e.{seq})), "
        # a version ends at the key's next event, or at the next TRUNCATE if that is first
        "o AS (SELECT v.*, CASE WHEN v.{next_seq} IS NOT NULL "
        "AND (t.seq IS NULL OR v.{next_seq} < t.seq) THEN v.{next_at} ELSE t.{at} END AS {ends}, "
        # the version a transaction's earlier part began keeps its kind
        "CASE WHEN v.{prev_seq} IS NULL AND f.{was_from} = v.{at} THEN f.{was_op} "
        "WHEN (CASE WHEN v.{prev_seq} IS NULL THEN f.{was_from} IS NOT NULL "
        "ELSE v.{prev_op} <> 'D' END) AND NOT EXISTS (SELECT FROM {truncates} AS b "
        "WHERE b.seq > coalesce(v.{prev_seq}, 0) AND b.seq < v.{seq}) THEN 'update' "
        "ELSE 'insert' END AS {kind} "
        "FROM v JOIN {firsts} AS f ON {match} LEFT JOIN LATERAL (SELECT b.seq, b.{at} "
        "FROM {truncates} AS b WHERE b.seq > v.{seq} ORDER BY b.seq LIMIT 1) AS t ON true "
        "WHERE v.{op} <> 'D'), "
        "ins AS (INSERT INTO {h} ({columns}, {valid_from}, {valid_to}, {is_current}, {hop}) "
        "SELECT {v_columns}, v.{at}, v.{ends}, v.{ends} IS NULL, v.{kind} FROM o AS v "
        "WHERE v.{ends} IS NULL OR v.{ends} > v.{at} RETURNING {valid_to} IS NOT NULL AS ended) "
        "SELECT count(*), count(*) FILTER (WHERE ended) FROM ins"
    ).format(
        next_seq=sql.Identifier("_replicator_next_seq"),
        next_at=sql.Identifier("_replicator_next_at"),
        prev_seq=sql.Identifier("_replicator_prev_seq"),
        prev_op=sql.Identifier("_replicator_prev_op"),
        ends=sql.Identifier("_replicator_ends"),
        kind=sql.Identifier("_replicator_kind"),
        was_from=_WAS_FROM,
        was_op=_WAS_OP,
        seq=seq,
        at=_AT,
        op=op,
        events=_EVENTS,
        keys=keys,
        truncates=_TRUNCATES,
        firsts=_FIRSTS,
        match=match("v", "f", key, equals),
        h=history.name.identifier(),
        columns=columns,
        valid_from=sql.Identifier(VALID_FROM),
        valid_to=sql.Identifier(VALID_TO),
        is_current=sql.Identifier(IS_CURRENT),
        hop=sql.Identifier(OP),
        v_columns=v_columns,
    )
    added, ended = execute(dest, statement).fetchone()
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
