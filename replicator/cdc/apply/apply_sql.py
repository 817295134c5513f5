"""The statements of a `cdc` table's apply (cdc/apply/table_apply.py runs them), built here so that
`compile` prints the same ones (`apply_steps`): what a run does to a batch of changes staged
in a temporary table (seq, op, the unchanged TOASTed columns, then the table's columns)."""

from __future__ import annotations

from collections.abc import Mapping

from psycopg import sql

from ...base.identifiers import TableName
from ...postgres.database import Step, nested_loop
from ..rows.table_stage import OP, SEQ
from .applied import record_applied_step

LAST = sql.Identifier("replicator_last")
STAGE = sql.Identifier("replicator_stage_0")  # the first table staged in a batch
_OP, _SEQ = sql.Identifier(OP), sql.Identifier(SEQ)


def after_truncate(truncated_at: int | None) -> sql.Composable:
    """Only changes after the batch's last TRUNCATE of the table count."""
    return sql.SQL("{} > {}").format(_SEQ, sql.Literal(truncated_at or 0))


# A key column's equality where `=` may not find it: `OPERATOR(s.=)` for a citext key whose
# extension lives in a schema off the session's search_path, where `=` would compare the
# values as text, case-sensitively (postgres/types/key_equality.py).
Equals = Mapping[str, str]


def equal(left: sql.Composable, right: sql.Composable, column: str, equals: Equals | None):
    """`left = right`, with the column's own equality."""
    operator = sql.SQL((equals or {}).get(column, "="))
    return sql.SQL("{} {} {}").format(left, operator, right)


def match(
    left: str, right: str, key: tuple[str, ...], equals: Equals | None = None
) -> sql.Composable:
    """The rows `left` and `right` have the same key, by the key's own equality."""
    return sql.SQL(" AND ").join(
        equal(
            sql.SQL("{}.{}").format(sql.Identifier(left), sql.Identifier(k)),
            sql.SQL("{}.{}").format(sql.Identifier(right), sql.Identifier(k)),
            k,
            equals,
        )
        for k in key
    )


def _keys(key: tuple[str, ...]) -> list[sql.Identifier]:
    return [sql.Identifier(k) for k in key]


def truncate_statement(target: TableName) -> sql.Composable:
    return sql.SQL("TRUNCATE {}").format(target.identifier())


def reduce_statement(
    stage: sql.Composable, key: tuple[str, ...], after: sql.Composable
) -> sql.Composable:
    """Each key's last change (a batch that holds a key more than once)."""
    keys = sql.SQL(", ").join(_keys(key))
    return sql.SQL(
        "CREATE TEMP TABLE {last} ON COMMIT DROP AS SELECT DISTINCT ON ({keys}) * "
        "FROM {stage} WHERE {after} ORDER BY {keys}, {seq} DESC"
    ).format(last=LAST, keys=keys, stage=stage, after=after, seq=_SEQ)


def delete_statement(
    target: TableName,
    rows: sql.Composable,
    key: tuple[str, ...],
    after: sql.Composable,
    equals: Equals | None = None,
) -> sql.Composable:
    return sql.SQL(
        "DELETE FROM {target} AS d USING {rows} AS l WHERE l.{op} = 'D' AND l.{after} AND {match}"
    ).format(
        target=target.identifier(),
        rows=rows,
        op=_OP,
        after=after,
        match=match("d", "l", key, equals),
    )


def _differs(
    left: str, right: str, columns: tuple[str, ...], undomained: dict[str, str] | None = None
) -> sql.Composable:
    """The two rows differ by their stored bytes (`*<>`, record image inequality, as REFRESH
    MATERIALIZED VIEW CONCURRENTLY compares): json, xml or point have no `=`, numeric's 1.0
    and 1.00 are equal by `=` but not by image, and two identical rows never differ
    (printing both rows as text, as before, cost the destination more than the write).
    `undomained`: the right row's domain columns are staged as these base types (a cast
    from a domain to its base type changes no bytes); types compare only with their own."""
    casts = undomained or {}

    def row(alias: str, cast: bool) -> sql.Composable:
        return sql.SQL(", ").join(
            sql.SQL("{}.{}::{}").format(sql.Identifier(alias), sql.Identifier(c), sql.SQL(casts[c]))
            if cast and c in casts
            else sql.SQL("{}.{}").format(sql.Identifier(alias), sql.Identifier(c))
            for c in columns
        )

    return sql.SQL("ROW({})::record *<> ROW({})::record").format(row(left, True), row(right, False))


def filter_statement(rows: sql.Composable, where: str, after: sql.Composable) -> sql.Composable:
    """A change whose new row the table's `where` does not keep becomes a delete of its key
    (the copy holds exactly the rows it keeps; a key it never held is deleted in vain): the
    filter the apply runs when the publication cannot (preflight.applied_where)."""
    return sql.SQL(
        "UPDATE {rows} SET {op} = 'D' WHERE {op} <> 'D' AND {after} AND NOT coalesce(({where}\n), "
        "false)"
    ).format(rows=rows, op=_OP, after=after, where=sql.SQL(where))


def updates_query(rows: sql.Composable, after: sql.Composable) -> sql.Composable:
    """How many of the rows are updates (each is expected to find its row in the copy)."""
    return sql.SQL("SELECT count(*) FROM {rows} WHERE {op} = 'U' AND {after}").format(
        rows=rows, op=_OP, after=after
    )


def update_statement(
    target: TableName,
    rows: sql.Composable,
    columns: tuple[str, ...],
    key: tuple[str, ...],
    after: sql.Composable,
    undomained: dict[str, str] | None = None,
    equals: Equals | None = None,
) -> sql.Composable:
    """The updates, each row found by its key in the copy and written where it differs.
    Every column is set, the key's too: a key type whose equality is coarser than its text
    (citext, numeric) matches the copy's old spelling, which must not stay. `undomained`:
    the staging table's domain columns and their base types (table_stage.TableStage)."""
    names = [sql.Identifier(c) for c in columns]
    return sql.SQL(
        "UPDATE {target} AS d SET {sets} FROM {rows} AS l "
        "WHERE l.{op} = 'U' AND l.{after} AND {match} AND {differs}"
    ).format(
        target=target.identifier(),
        sets=sql.SQL(", ").join(sql.SQL("{0} = l.{0}").format(c) for c in names),
        rows=rows,
        op=_OP,
        after=after,
        match=match("d", "l", key, equals),
        differs=_differs("d", "l", columns, undomained),
    )


def upsert_statement(
    target: TableName,
    rows: sql.Composable,
    columns: tuple[str, ...],
    key: tuple[str, ...],
    after: sql.Composable,
    *,
    updated: bool = False,
    equals: Equals | None = None,
) -> sql.Composable:
    """The rows that are not deletes, inserted, or written over the copy's row of their key
    where they differ from it. `updated`: update_statement wrote a row for every update, so
    only the other rows are left; else an update is written here too when its key has no
    row in the copy (which it lacked)."""
    names = [sql.Identifier(c) for c in columns]
    conflict = sql.SQL("DO UPDATE SET {sets} WHERE {differs}").format(
        sets=sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(c) for c in names),
        differs=_differs("d", "excluded", columns),
    )
    if updated:
        left = sql.SQL("l.{} <> 'U'").format(_OP)
    else:
        left = sql.SQL("(l.{op} <> 'U' OR NOT EXISTS (SELECT FROM {target} AS x WHERE {match}))")
        left = left.format(op=_OP, target=target.identifier(), match=match("x", "l", key, equals))
    return sql.SQL(
        "INSERT INTO {target} AS d ({columns}) SELECT {columns} FROM {rows} AS l "
        "WHERE l.{op} <> 'D' AND l.{after} AND {left} ON CONFLICT ({keys}) {conflict}"
    ).format(
        target=target.identifier(),
        columns=sql.SQL(", ").join(names),
        rows=rows,
        op=_OP,
        after=after,
        left=left,
        keys=sql.SQL(", ").join(_keys(key)),
        conflict=conflict,
    )


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


def repeated_keys_query(
    target: TableName,
    stage: sql.Composable,
    key: tuple[str, ...],
    after: sql.Composable,
    equals: Equals | None = None,
) -> sql.Composable:
    """How many rows start (an insert, or an update that moved a row to a new key: its
    delete is the change just before) at a key a row already has, in the batch or the
    copy."""
    keys = _keys(key)
    return sql.SQL(_REPEATED).format(
        keys=sql.SQL(", ").join(keys),
        op=_OP,
        seq=_SEQ,
        stage=stage,
        after=after,
        target=target.identifier(),
        match=match("d", "s", key, equals),
    )


def apply_steps(
    target: TableName,
    columns: tuple[str, ...],
    key: tuple[str, ...],
    keys_may_repeat: bool,
    undomained: dict[str, str] | None = None,
    equals: Equals | None = None,
    where: str | None = None,
) -> list[Step]:
    """A batch's apply as `compile` shows it: one that holds a key more than once and no
    TRUNCATE (a TRUNCATE first empties the table and only the changes after it count; a
    batch with every key once skips the reduction, reads the staging table itself and takes
    the count of its updates from the reader), and whose updates all find their rows (else
    the last INSERT also writes the updates whose keys the copy lacks; a batch without
    updates skips the SET, UPDATE and RESET).
    Unchanged TOASTed values are filled in from earlier changes or the copy between the
    reduction and the writes; `<lsn>` is the end of the batch's last commit. `undomained`:
    the domain columns' staged base types (type_closure.staged_base); `equals`: the key
    columns' equality operators where `=` may not find them (key_equality.py); `where`: the
    table's filter when the apply runs it (filter_statement, after the reduction)."""
    after = after_truncate(None)
    steps = [Step("destination", sql.SQL("BEGIN"))]
    if keys_may_repeat:
        steps.append(Step("destination", repeated_keys_query(target, STAGE, key, after, equals)))
    writes = [
        reduce_statement(STAGE, key, after),
        *([filter_statement(LAST, where, after)] if where is not None else []),
        delete_statement(target, LAST, key, after, equals),
        updates_query(LAST, after),
        *nested_loop(True),
        update_statement(target, LAST, columns, key, after, undomained, equals),
        *nested_loop(False),
        upsert_statement(target, LAST, columns, key, after, updated=True, equals=equals),
    ]
    steps += [Step("destination", statement) for statement in writes]
    record = record_applied_step(target, 0)
    params = (*record.params[:2], "<lsn>") if record.params else None
    return [*steps, Step("destination", record.statement, params), Step("destination", "COMMIT")]
