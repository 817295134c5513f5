"""One table's staged changes into its destination table, in one transaction with the log
position they reach (so a crash leaves both old or both new).

The rules (docs/how-it-works/cdc.md):
- a TRUNCATE in the batch empties the table; only changes after the last one count;
- per key, the last change wins: a delete deletes, an update updates the row of its key (or
  inserts it, where the copy lacks it), an insert upserts; the rows are written only where
  they differ, so re-applying a batch changes nothing;
- a column whose TOASTed value the change left as it was (pgoutput sends no value for it)
  takes the value of the row's previous version: from an earlier change in the batch, else
  from the destination. An update that moved a row to a new key takes it from the old key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ...base.errors import TableProblem
from ...base.failpoints import failpoint
from ...postgres.database import execute, transaction
from ...postgres.history_tables import HistoryTable, Versions
from ..rows.table_stage import OP, SEQ, UNCHANGED_COLUMNS, TableStage
from .applied import record_applied_step
from .apply_sql import (
    LAST,
    after_truncate,
    delete_statement,
    equal,
    filter_statement,
    match,
    nested_loop,
    reduce_statement,
    repeated_keys_query,
    truncate_statement,
    update_statement,
    updates_query,
    upsert_statement,
)
from .history_apply import Commits, write_versions

log = logging.getLogger("replicator.cdc")

# The alias of an unnested list of column positions: a name no table column can clash with
# (a column `p` made `p` ambiguous).
_POSITION = sql.Identifier("_replicator_position")


@dataclass(frozen=True)
class Applied:
    upserted: int
    deleted: int
    truncated: bool
    versions: Versions | None = None  # what its history table took


def apply_stage(
    dest: psycopg.Connection[Any],
    stage: TableStage,
    key: tuple[str, ...],
    lsn: int | None,
    name: str,
    *,
    keys_may_repeat: bool = False,
    where: str | None = None,
    history: HistoryTable | None = None,
    commits: Commits | None = None,
    parted: bool = False,
) -> Applied:
    """Apply the staged changes and record `lsn` as the table's applied position (None: a
    part of a batch, inside the transaction its last part commits: no position yet).
    `keys_may_repeat`: the key is the config's `primary_key` (REPLICA IDENTITY FULL), which
    the source does not hold unique: rows that share it are said, as a full load says them.
    `where`: the table's filter when the apply runs it (apply_sql.filter_statement), before
    the unchanged TOASTed values are looked for: a row it drops needs none. `history`: the
    table's history table, whose versions are written in the same transaction, first
    (cdc/apply/history_apply.py), with the batch's `commits`; `parted`: an earlier part of
    the batch applied changes of the table."""
    target = stage.target
    after = after_truncate(stage.truncated_at)
    truncated = stage.truncated_at or 0
    if stage.incomplete_insert is not None and stage.incomplete_insert > truncated:
        raise TableProblem(
            "a row the table's row filter (`where`) let in by an update came without a TOASTed "
            "value the update left as it was (PostgreSQL sends such a row as an insert without "
            "that value, which neither the log nor the copy holds): its next sync reloads it"
        )
    with transaction(dest):
        # moves are resolved before the copy is emptied: after a TRUNCATE the key a row moved
        # from has its values in the batch, found first
        for move_seq in stage.moves:
            # a move before the TRUNCATE left nothing to resolve, but in the past
            if move_seq > truncated or history is not None:
                _resolve_move(dest, stage, key, move_seq)
        versions = None
        if history is not None:  # before the copy changes: it holds the unchanged values
            assert commits is not None
            versions = write_versions(dest, stage, history, commits, where=where, parted=parted)
        if stage.truncated_at is not None:
            execute(dest, truncate_statement(target))
        if keys_may_repeat:
            _say_repeated_keys(dest, stage, key, after, name)
        # Every key once in the batch (the common case): applied from the staging table as
        # it is; else reduced to each key's last change first.
        rows: sql.Composable = stage.name
        updates: int | None = stage.updates  # as staged: every key once, each row applied
        if not stage.simple:
            execute(dest, reduce_statement(stage.name, key, after))
            if where is not None:
                execute(dest, filter_statement(LAST, where, after))
            _fill_unchanged(dest, stage, key, after, name)
            rows, updates = LAST, None
        elif where is not None:  # the updates it turns into deletes are counted again
            execute(dest, filter_statement(rows, where, after))
            updates = None
        deleted = execute(dest, delete_statement(target, rows, key, after, stage.equals)).rowcount
        upserted = _write(dest, stage, rows, key, after, updates)
        if not stage.simple:  # ON COMMIT DROP is too late inside a batch's open transaction
            execute(dest, sql.SQL("DROP TABLE {}").format(LAST))
        if lsn is not None:
            record = record_applied_step(target, lsn)
            execute(dest, record.statement, record.params)
            failpoint("cdc-before-apply-commit")
    return Applied(max(upserted, 0), max(deleted, 0), stage.truncated_at is not None, versions)


def _write(
    dest: psycopg.Connection[Any],
    stage: TableStage,
    rows: sql.Composable,
    key: tuple[str, ...],
    after: sql.Composable,
    updates: int | None,
) -> int:
    """The rows that are not deletes: updates first, each row found by its key, then the
    rest (inserts, and updates whose key the copy lacks) by an upsert; returns how many
    rows were written. `updates`: how many of the rows are updates, as the reader counted
    them staging a batch that holds every key once (None: counted here, in `rows`). An
    UPDATE costs the destination less than an upsert's attempt to insert, when the planner
    is held to look each key up: it would rather hash the batch and read the whole copy,
    which is slower still and gets slower as the copy grows (bench/RESULTS.md)."""
    target, columns = stage.target, stage.columns
    if updates is None:
        (updates,) = execute(dest, updates_query(rows, after)).fetchone()
    updated = 0
    if updates:
        for statement in nested_loop(True):
            execute(dest, statement)
        update = update_statement(target, rows, columns, key, after, stage.undomained, stage.equals)
        updated = execute(dest, update).rowcount
        for statement in nested_loop(False):  # a batch's parts share one transaction
            execute(dest, statement)
    # an update that wrote nothing found no row, or one that was already equal: the upsert
    # then looks for the keys the copy lacks
    rest = upsert_statement(
        target, rows, columns, key, after, updated=updated == updates, equals=stage.equals
    )
    return max(updated, 0) + max(execute(dest, rest).rowcount, 0)


def _say_repeated_keys(
    dest: psycopg.Connection[Any],
    stage: TableStage,
    key: tuple[str, ...],
    after: sql.Composable,
    name: str,
) -> None:
    """Rows that start at a key a row already has: the copy keeps one row per key, the
    newest, and says so as a full load does."""
    query = repeated_keys_query(stage.target, stage.name, key, after, stage.equals)
    (repeated,) = execute(dest, query).fetchone()
    if repeated:
        log.warning(
            "%s: the log brought %d row(s) whose primary key another row also has; kept the "
            "newest version of each key (`replicator verify` names the keys)",
            name,
            repeated,
        )


def _fill_unchanged(
    dest: psycopg.Connection[Any],
    stage: TableStage,
    key: tuple[str, ...],
    after: sql.Composable,
    name: str,
) -> None:
    """Unchanged TOASTed values of the last version of each key: from the newest earlier
    change in the batch that carried the column (every version of a row starts with an
    insert or a resolved move, which carry all), else from the destination row."""
    unchanged = sql.Identifier(UNCHANGED_COLUMNS)
    (positions,) = execute(
        dest,
        sql.SQL(
            "SELECT coalesce(array_agg(DISTINCT {p}.n), '{{}}') FROM {last}, unnest({last}.{u}) "
            "AS {p}(n) WHERE {last}.{op} <> 'D'"
        ).format(last=LAST, u=unchanged, op=sql.Identifier(OP), p=_POSITION),
    ).fetchone()
    for position in positions:
        column = sql.Identifier(stage.columns[position - 1])
        place = sql.Literal(position)
        execute(
            dest,
            sql.SQL(
                "UPDATE {last} AS l SET {c} = s.{c}, {u} = array_remove(l.{u}, {p}::int2) "
                "FROM (SELECT DISTINCT ON ({keys}) * FROM {stage} WHERE {after} AND {op} <> 'D' "
                "AND NOT {p} = ANY({u}) ORDER BY {keys}, {seq} DESC) AS s "
                "WHERE {p} = ANY(l.{u}) AND {match}"
            ).format(
                last=LAST,
                c=column,
                u=unchanged,
                p=place,
                keys=sql.SQL(", ").join(map(sql.Identifier, key)),
                stage=stage.name,
                after=after,
                op=sql.Identifier(OP),
                seq=sql.Identifier(SEQ),
                match=match("l", "s", key, stage.equals),
            ),
        )
        execute(
            dest,
            sql.SQL(
                "UPDATE {last} AS l SET {c} = d.{c}, {u} = array_remove(l.{u}, {p}::int2) "
                "FROM {target} AS d WHERE {p} = ANY(l.{u}) AND {match}"
            ).format(
                last=LAST,
                c=column,
                u=unchanged,
                p=place,
                target=stage.target.identifier(),
                match=match("l", "d", key, stage.equals),
            ),
        )
    if positions:
        keys = sql.SQL(", ").join(sql.SQL("{}::text").format(sql.Identifier(k)) for k in key)
        missing = execute(
            dest,
            sql.SQL(
                "SELECT count(*) OVER (), {keys} FROM {last} "
                "WHERE {op} <> 'D' AND cardinality({u}) > 0 LIMIT 1"
            ).format(keys=keys, last=LAST, op=sql.Identifier(OP), u=unchanged),
        ).fetchone()
        if missing:
            first = ", ".join(f"{k} {v}" for k, v in zip(key, missing[1:], strict=True))
            raise TableProblem(
                f"{missing[0]} updated row(s) (the first: {first}) left a TOASTed value as it "
                "was, which the copy does not hold either (a row its `where` let in, or a copy "
                "that is not what the source was): its next sync reloads it; under REPLICA "
                "IDENTITY FULL the log carries such values"
            )


def _resolve_move(
    dest: psycopg.Connection[Any],
    stage: TableStage,
    key: tuple[str, ...],
    move_seq: int,
) -> None:
    """An update that changed the key and left TOASTed values as they were: the values are
    the old key's (which the delete staged just before the move holds), from the newest
    earlier change of it in the batch, else the destination. Moves are resolved in commit
    order, so a move of a moved row finds its values."""
    unchanged, seq = sql.Identifier(UNCHANGED_COLUMNS), sql.Identifier(SEQ)
    (positions,) = execute(
        dest,
        sql.SQL("SELECT {u} FROM {stage} WHERE {seq} = %s").format(
            u=unchanged, stage=stage.name, seq=seq
        ),
        (move_seq,),
    ).fetchone()
    old = sql.SQL(" AND ").join(
        equal(
            sql.SQL("x.{}").format(sql.Identifier(k)),
            sql.SQL("(SELECT m.{} FROM {} AS m WHERE m.{} = {})").format(
                sql.Identifier(k), stage.name, seq, sql.Literal(move_seq - 1)
            ),
            k,
            stage.equals,
        )
        for k in key
    )
    for position in positions:
        column = sql.Identifier(stage.columns[position - 1])
        execute(
            dest,
            sql.SQL(
                "UPDATE {stage} SET {c} = coalesce((SELECT x.{c} FROM {stage} AS x WHERE {old} "
                "AND x.{seq} < %s AND x.{op} <> 'D' AND NOT %s = ANY(x.{u}) ORDER BY x.{seq} DESC "
                "LIMIT 1), (SELECT x.{c} FROM {target} AS x WHERE {old})), "
                "{u} = array_remove({u}, %s::int2) WHERE {seq} = %s"
            ).format(
                stage=stage.name,
                c=column,
                old=old,
                seq=seq,
                op=sql.Identifier(OP),
                u=unchanged,
                target=stage.target.identifier(),
            ),
            [move_seq, position, position, move_seq],
        )
    (missing,) = execute(
        dest,
        sql.SQL(
            "SELECT count(*) FROM {stage} AS s, unnest(%s::int2[]) AS {p}(n) WHERE s.{seq} = %s"
        ).format(stage=stage.name, seq=seq, p=_POSITION)
        + sql.SQL(" AND ({})").format(
            sql.SQL(" OR ").join(
                sql.SQL("({}.n = {} AND s.{} IS NULL)").format(
                    _POSITION, sql.Literal(i), sql.Identifier(c)
                )
                for i, c in enumerate(stage.columns, start=1)
            )
        ),
        (list(positions), move_seq),
    ).fetchone()
    if missing:
        raise TableProblem(
            f"{stage.target}: an update moved a row to a new key, keeping a TOASTed value that "
            "neither the batch nor the destination has (the copy is not what the source was): "
            "its next sync reloads it"
        )
