"""One table's staged changes into its destination table, in one transaction with the log
position they reach (so a crash leaves both old or both new).

The rules (README: How cdc applies changes):
- a TRUNCATE in the batch empties the table; only changes after the last one count;
- per key, the last change wins: a delete deletes, an insert or update upserts; the rows are
  written only where they differ, so re-applying a batch changes nothing;
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

from ..base.errors import TableProblem
from ..base.failpoints import failpoint
from ..postgres.database import execute, transaction
from .applied import record_applied_step
from .stage import OP, SEQ, UNCHANGED_COLUMNS, TableStage

_LAST = sql.Identifier("replicator_last")
log = logging.getLogger("replicator.capture")


@dataclass(frozen=True)
class Applied:
    upserted: int
    deleted: int
    truncated: bool


def apply_stage(
    dest: psycopg.Connection[Any],
    stage: TableStage,
    key: tuple[str, ...],
    lsn: int,
    name: str,
    *,
    keys_may_repeat: bool = False,
) -> Applied:
    """Apply the staged changes and record `lsn` as the table's applied position.
    `keys_may_repeat`: the key is the config's `primary_key` (REPLICA IDENTITY FULL), which
    the source does not hold unique: rows that share it are said, as a full load says them."""
    seq, op = sql.Identifier(SEQ), sql.Identifier(OP)
    target = stage.target.identifier()
    keys = [sql.Identifier(k) for k in key]
    after = sql.SQL("{} > {}").format(seq, sql.Literal(stage.truncated_at or 0))
    with transaction(dest):
        if stage.truncated_at is not None:
            execute(dest, sql.SQL("TRUNCATE {}").format(target))
        for move_seq, old_key in stage.moves:
            _resolve_move(dest, stage, key, move_seq, old_key)
        if keys_may_repeat:
            _say_repeated_keys(dest, stage, keys, after, name)
        # Every key once in the batch (the common case): applied from the staging table as
        # it is; else reduced to each key's last change first.
        rows: sql.Composable = stage.name
        if not stage.simple:
            execute(
                dest,
                sql.SQL(
                    "CREATE TEMP TABLE {last} ON COMMIT DROP AS SELECT DISTINCT ON ({keys}) * "
                    "FROM {stage} WHERE {after} ORDER BY {keys}, {seq} DESC"
                ).format(
                    last=_LAST,
                    keys=sql.SQL(", ").join(keys),
                    stage=stage.name,
                    after=after,
                    seq=seq,
                ),
            )
            _fill_unchanged(dest, stage, keys, after, name)
            rows = _LAST
        deleted = execute(
            dest,
            sql.SQL(
                "DELETE FROM {target} AS d USING {rows} AS l WHERE l.{op} = 'D' AND {after} "
                "AND {match}"
            ).format(
                target=target,
                rows=rows,
                op=op,
                after=sql.SQL("l.") + after,
                match=_match("d", "l", keys),
            ),
        ).rowcount
        upserted = execute(dest, _upsert(stage, key, target, rows, after)).rowcount
        record = record_applied_step(stage.target, lsn)
        execute(dest, record.statement, record.params)
        failpoint("cdc-before-apply-commit")
    return Applied(max(upserted, 0), max(deleted, 0), stage.truncated_at is not None)


_REPEATED = """
SELECT count(*) FROM (
    SELECT {keys}, {op}, lag({op}) OVER (PARTITION BY {keys} ORDER BY {seq}) AS before,
           lag({seq}) OVER (ORDER BY {seq}) = {seq} - 1 AS moved
    FROM {stage} WHERE {after}
) AS s
WHERE (s.{op} IN ('I', 'M') OR s.{op} = 'U' AND s.moved)
  AND CASE WHEN s.before IS NULL THEN EXISTS (SELECT 1 FROM {target} AS d WHERE {match})
           ELSE s.before <> 'D' END
"""


def _say_repeated_keys(
    dest: psycopg.Connection[Any],
    stage: TableStage,
    keys: list[sql.Identifier],
    after: sql.Composable,
    name: str,
) -> None:
    """Rows that start (an insert, or an update that moved a row to a new key: its delete
    is the change just before) at a key a row already has, in the batch or the copy: the
    copy keeps one row per key, the newest."""
    (repeated,) = execute(
        dest,
        sql.SQL(_REPEATED).format(
            keys=sql.SQL(", ").join(keys),
            op=sql.Identifier(OP),
            seq=sql.Identifier(SEQ),
            stage=stage.name,
            after=after,
            target=stage.target.identifier(),
            match=_match("d", "s", keys),
        ),
    ).fetchone()
    if repeated:
        log.warning(
            "%s: the log brought %d row(s) whose primary key another row also has; kept the "
            "newest version of each key",
            name,
            repeated,
        )


def _match(left: str, right: str, keys: list[sql.Identifier]) -> sql.Composable:
    return sql.SQL(" AND ").join(
        sql.SQL("{}.{} = {}.{}").format(sql.Identifier(left), k, sql.Identifier(right), k)
        for k in keys
    )


def _upsert(
    stage: TableStage,
    key: tuple[str, ...],
    target: sql.Composable,
    rows: sql.Composable,
    after: sql.Composable,
) -> sql.Composable:
    columns = [sql.Identifier(c) for c in stage.columns]
    # Every column, the key's too: a key type whose equality is coarser than its text
    # (citext, numeric) conflicts with the copy's old spelling, which must not stay.
    # Compared as text, as the merge macros do: json, xml or point have no `=`.
    conflict = sql.SQL(
        "DO UPDATE SET {sets} WHERE ROW({current})::text IS DISTINCT FROM ROW({new})::text"
    ).format(
        sets=sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(c) for c in columns),
        current=sql.SQL(", ").join(sql.SQL("d.{}").format(c) for c in columns),
        new=sql.SQL(", ").join(sql.SQL("EXCLUDED.{}").format(c) for c in columns),
    )
    return sql.SQL(
        "INSERT INTO {target} AS d ({columns}) SELECT {columns} FROM {rows} "
        "WHERE {op} <> 'D' AND {after} ON CONFLICT ({keys}) {conflict}"
    ).format(
        target=target,
        columns=sql.SQL(", ").join(columns),
        rows=rows,
        after=after,
        op=sql.Identifier(OP),
        keys=sql.SQL(", ").join(sql.Identifier(k) for k in key),
        conflict=conflict,
    )


def _fill_unchanged(
    dest: psycopg.Connection[Any],
    stage: TableStage,
    keys: list[sql.Identifier],
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
            "SELECT coalesce(array_agg(DISTINCT p), '{{}}') FROM {last}, unnest({u}) AS p "
            "WHERE {op} <> 'D'"
        ).format(last=_LAST, u=unchanged, op=sql.Identifier(OP)),
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
                last=_LAST,
                c=column,
                u=unchanged,
                p=place,
                keys=sql.SQL(", ").join(keys),
                stage=stage.name,
                after=after,
                op=sql.Identifier(OP),
                seq=sql.Identifier(SEQ),
                match=_match("l", "s", keys),
            ),
        )
        execute(
            dest,
            sql.SQL(
                "UPDATE {last} AS l SET {c} = d.{c}, {u} = array_remove(l.{u}, {p}::int2) "
                "FROM {target} AS d WHERE {p} = ANY(l.{u}) AND {match}"
            ).format(
                last=_LAST,
                c=column,
                u=unchanged,
                p=place,
                target=stage.target.identifier(),
                match=_match("l", "d", keys),
            ),
        )
    if positions:
        (missing,) = execute(
            dest,
            sql.SQL(
                "SELECT count(*) FROM {last} WHERE {op} <> 'D' AND cardinality({u}) > 0"
            ).format(last=_LAST, op=sql.Identifier(OP), u=unchanged),
        ).fetchone()
        if missing:
            raise TableProblem(
                f"{missing} updated row(s) kept a TOASTed value the destination does not have "
                "(the copy is not what the source was): reload the table with "
                f"`replicator sync -f -s {name}`"
            )


def _resolve_move(
    dest: psycopg.Connection[Any],
    stage: TableStage,
    key: tuple[str, ...],
    move_seq: int,
    old_key: tuple[bytes | None, ...],
) -> None:
    """An update that changed the key and left TOASTed values as they were: the values are
    the old key's, from the newest earlier change of it in the batch, else the destination.
    Moves are resolved in commit order, so a move of a moved row finds its values."""
    unchanged, seq = sql.Identifier(UNCHANGED_COLUMNS), sql.Identifier(SEQ)
    (positions,) = execute(
        dest,
        sql.SQL("SELECT {u} FROM {stage} WHERE {seq} = %s").format(
            u=unchanged, stage=stage.name, seq=seq
        ),
        (move_seq,),
    ).fetchone()
    old = sql.SQL(" AND ").join(
        sql.SQL("x.{} = {}").format(sql.Identifier(k), sql.Placeholder()) for k in key
    )
    encoding = dest.info.encoding  # the session's: the source's server encoding
    params = [v.decode(encoding) if v is not None else None for v in old_key]
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
            [*params, move_seq, position, *params, position, move_seq],
        )
    (missing,) = execute(
        dest,
        sql.SQL("SELECT count(*) FROM {stage}, unnest(%s::int2[]) AS p WHERE {seq} = %s").format(
            stage=stage.name, seq=seq
        )
        + sql.SQL(" AND ({})").format(
            sql.SQL(" OR ").join(
                sql.SQL("(p = {} AND {} IS NULL)").format(sql.Literal(i), sql.Identifier(c))
                for i, c in enumerate(stage.columns, start=1)
            )
        ),
        (list(positions), move_seq),
    ).fetchone()
    if missing:
        raise TableProblem(
            f"{stage.target}: an update moved a row to a new key, keeping a TOASTed value that "
            "neither the batch nor the destination has (the copy is not what the source was): "
            "reload the table with `replicator sync -f`"
        )
