"""What a project's model may do with a table's shaped columns (`columns.exclude`, `hash`).

An excluded column never leaves the source, and a hashed one leaves it only hashed; the
shaping wraps the model's output by column name, so a model that reads such a column under
another name (`ssn AS social`), inside an expression, in its filter or as part of a whole
row (`row_to_json(t)`) would carry the value, or what it tells, into the copy or into an
error message. So:
- PostgreSQL says which of the table's columns the model reads (its dependencies, as a
  temporary view's, rolled back): none may be excluded, and no whole row may be read;
- a hashed column may only be selected as it is, under its own name (sqlglot finds every
  reference to it).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from ..base.errors import DatabaseError, TableProblem
from ..base.identifiers import display_ident
from ..postgres.catalog import TableInfo
from ..postgres.database import execute, fetch_all, transaction

_VIEW = "replicator_model_reads"
_READS = f"""
SELECT DISTINCT d.refobjsubid FROM pg_catalog.pg_depend d
JOIN pg_catalog.pg_rewrite r ON r.oid = d.objid
WHERE r.ev_class = '{_VIEW}'::regclass AND d.refobjid = %s AND d.refobjsubid > 0
"""
# A whole-row reference (`row_to_json(t)`, `t::text`) is a Var of attribute 0 in the view's
# query tree; pg_depend records none for it when the query reads a column of the table too.
_WHOLE_ROW = f"""
SELECT bool_or(r.ev_action::text LIKE '%%:varattno 0 %%')
FROM pg_catalog.pg_rewrite r WHERE r.ev_class = '{_VIEW}'::regclass
"""


def check_model_reads(
    conn: psycopg.Connection[Any],
    model_sql: str,
    origin: str,
    source: TableInfo,
    exclude: tuple[str, ...],
    hashed: tuple[str, ...],
    name: str,
) -> None:
    """TableProblem when the model reads an excluded column, a whole row, or a hashed column
    other than as itself."""
    if not exclude and not hashed:
        return
    reads = _columns_read(conn, model_sql, source)
    if reads is not None:
        leaked = [c for c in exclude if c in reads]
        if leaked:
            raise TableProblem(
                f"{name}: the model ({origin}) reads excluded column(s) "
                f"{', '.join(map(display_ident, leaked))}: remove them from it (an excluded "
                "column is never read from the source)"
            )
        if "" in reads:
            raise TableProblem(
                f"{name}: the model ({origin}) reads whole rows of {source.name} (a row "
                "value such as the table's name or row_to_json of it), which hold its "
                "excluded or hashed columns: select the columns one by one"
            )
    misused = [c for c in hashed if (reads is None or c in reads) and _misused(model_sql, c)]
    if misused:
        raise TableProblem(
            f"{name}: the model ({origin}) uses hashed column(s) "
            f"{', '.join(map(display_ident, misused))} other than selected as they are under "
            "their own names (renamed, in an expression or a condition): the copy would "
            "hold, or tell, what the hash hides; select each as it is"
        )


def _columns_read(
    conn: psycopg.Connection[Any], model_sql: str, source: TableInfo
) -> set[str] | None:
    """The names of the table's columns the model reads ("" for a whole row), or None when
    PostgreSQL cannot make a view of it (sqlglot's references decide alone then)."""
    try:
        with transaction(conn, rollback=True):
            execute(
                conn,
                sql.SQL("CREATE TEMPORARY VIEW {} AS {}").format(
                    sql.Identifier(_VIEW), sql.SQL(model_sql)
                ),
            )
            numbers = {row[0] for row in fetch_all(conn, _READS, (source.oid,))}
            (whole,) = execute(conn, _WHOLE_ROW).fetchone()
    except DatabaseError:
        return None
    names = {c.attnum: c.name for c in source.columns}
    return {names[n] for n in numbers if n in names} | ({""} if whole else set())


def _misused(model_sql: str, column: str) -> bool:
    """Whether a reference to `column` in the model is anything but a select item of its
    own name (`column`, `t.column`, `column AS column`)."""
    import sqlglot  # a model's SQL only
    from sqlglot import exp

    tree = sqlglot.parse_one(model_sql, read="postgres")
    for found in tree.find_all(exp.Column):
        identifier = found.this
        if not isinstance(identifier, exp.Identifier):
            continue
        text = identifier.this if identifier.quoted else identifier.this.lower()
        if text != column:
            continue
        parent = found.parent
        if isinstance(parent, exp.Select) and found in parent.expressions:
            continue
        if (
            isinstance(parent, exp.Alias)
            and parent.alias == column
            and isinstance(parent.parent, exp.Select)
        ):
            continue
        return True
    return False
