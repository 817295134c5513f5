"""The atomic swap: a loaded side table replaces the live table in one short transaction.

Readers never see a missing, empty or half-loaded table: until the commit they read the old
table, after it the new one. Views that depend on the table are dropped and recreated (from
their own definitions, so they point at the new table) in the same transaction, with their
owners, grants, options and comments; the table keeps its grants, owner and comments.
Anything else that depends on the live table (a materialized view, a foreign key) makes the
swap fail, leaving the old table untouched. The old table is renamed aside in the transaction
and dropped after the commit: freeing a big table's files takes time readers should not wait.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from ..errors import DatabaseError
from ..failpoints import failpoint
from ..identifiers import TableName
from .database import execute, fetch_all
from .dependent_views import dependents
from .naming import default_key_name, retired_key_name, retired_table
from .ownership import read_records, record_owned

LOCK_TIMEOUT = "5s"
LOCK_NOT_AVAILABLE = psycopg.errors.LockNotAvailable.sqlstate
DEPENDENT_OBJECTS = psycopg.errors.DependentObjectsStillExist.sqlstate

_RELATION_OID = """
SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""
_OBJECT = """
SELECT pg_catalog.pg_get_userbyid(c.relowner), c.reloptions,
       CASE WHEN c.relkind = 'v' THEN pg_catalog.pg_get_viewdef(c.oid, true) END,
       ARRAY(SELECT ARRAY[CASE WHEN a.grantee = 0 THEN '' ELSE
                               pg_catalog.pg_get_userbyid(a.grantee) END,
                          a.privilege_type, a.is_grantable::text]
             FROM aclexplode(c.relacl) a WHERE a.grantee <> c.relowner),
       ARRAY(SELECT ARRAY[coalesce(att.attname, ''), d.description]
             FROM pg_catalog.pg_description d
             LEFT JOIN pg_catalog.pg_attribute att
                    ON att.attrelid = d.objoid AND att.attnum = d.objsubid
             WHERE d.objoid = c.oid AND d.classoid = 'pg_catalog.pg_class'::regclass
             ORDER BY d.objsubid)
FROM pg_catalog.pg_class c WHERE c.oid = %s
"""
_RELATION_NAMES = """
SELECT c.relname FROM pg_catalog.pg_class c
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = ANY(%s)
"""
_PRIMARY_KEY_NAME = """
SELECT conname FROM pg_catalog.pg_constraint WHERE conrelid = %s AND contype = 'p'
"""


@dataclass(frozen=True)
class SavedObject:
    """What a swap must put back on a table or view it drops and recreates."""

    name: TableName
    owner: str
    options: list[str]
    definition: str | None
    grants: list[list[str]]
    comments: list[list[str]]


def swap_in(dest: psycopg.Connection[Any], side: TableName, target: TableName) -> float:
    """Replace `target` with `side` atomically; return how long the table lock was held.
    The key keeps the old table's key name, else gets the one PostgreSQL would choose."""
    return _swap_with_retries(dest, side, target)


def _lock_not_available(exc: BaseException) -> bool:
    return isinstance(exc, DatabaseError) and exc.sqlstate == LOCK_NOT_AVAILABLE


@retry(
    retry=retry_if_exception(_lock_not_available),
    stop=stop_after_attempt(5),
    wait=wait_exponential(multiplier=0.5, max=5),
    reraise=True,
)
def _swap_with_retries(dest: psycopg.Connection[Any], side: TableName, target: TableName) -> float:
    with dest.transaction():
        execute(dest, sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))
        # Definitions are read and re-run with only pg_catalog on the path: fully qualified.
        execute(dest, "SET LOCAL search_path = pg_catalog, pg_temp")
        existing = fetch_all(dest, _RELATION_OID, (target.schema, target.name))
        locked_at = time.monotonic()
        views: list[SavedObject] = []
        table: SavedObject | None = None
        old_key: list[tuple[Any, ...]] = []
        retired: TableName | None = None
        if existing:
            oid = existing[0][0]
            execute(dest, sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(_ident(target)))
            locked_at = time.monotonic()
            if not read_records(dest, target, oid).this_oid:  # replaced while we loaded
                raise DatabaseError(
                    f"destination: {target} is not a table replicator created (it was "
                    "replaced while the load ran); it is left as it is"
                )
            table = _save(dest, oid, target)
            views = _dependent_views(dest, oid)
            old_key = fetch_all(dest, _PRIMARY_KEY_NAME, (oid,))
            for view in reversed(views):
                execute(dest, sql.SQL("DROP VIEW {}").format(_ident(view.name)))
            retired = _retire(dest, target, old_key[0][0] if old_key else None)
        primary_key_name = old_key[0][0] if old_key else _free_key_name(dest, target)
        _move(dest, side, target, primary_key_name)
        record_owned(dest, target)
        if table is not None:
            _restore(dest, table, "TABLE")
        for view in views:
            _recreate_view(dest, view)
        failpoint("before-swap-commit")
    lock_seconds = time.monotonic() - locked_at
    failpoint("after-swap-commit")
    if retired is not None:
        execute(dest, sql.SQL("DROP TABLE IF EXISTS {}").format(_ident(retired)))
    return lock_seconds


def _free_key_name(dest: psycopg.Connection[Any], target: TableName) -> str:
    """The first of `<table>_pkey`, `<table>_pkey1`... that no relation in the schema uses,
    as PostgreSQL chooses it (two long names cut to one prefix must not collide)."""
    candidates = [default_key_name(target, n) for n in range(100)]
    taken = {row[0] for row in fetch_all(dest, _RELATION_NAMES, (target.schema, candidates))}
    return next(name for name in candidates if name not in taken)


def _ident(name: TableName) -> sql.Identifier:
    return sql.Identifier(name.schema, name.name)


def _save(dest: psycopg.Connection[Any], oid: int, name: TableName) -> SavedObject:
    owner, options, definition, grants, comments = fetch_all(dest, _OBJECT, (oid,))[0]
    return SavedObject(name, owner, options or [], definition, grants, comments)


def _dependent_views(dest: psycopg.Connection[Any], oid: int) -> list[SavedObject]:
    views = []
    for view in dependents(dest, oid):
        if view.kind != "v":
            raise DatabaseError(
                f"destination: {view.name} (a materialized view) depends on the table: "
                "replicator can only carry plain views across a reload; drop it or make it a "
                "view"
            )
        views.append(_save(dest, view.oid, view.name))
    return views


def _retire(dest: psycopg.Connection[Any], target: TableName, key_name: str | None) -> TableName:
    """Rename the old table (and its key) aside; the caller drops it after the commit. It
    must be droppable now, though: a foreign key or materialized view that depends on it
    fails the swap here, with the old table untouched."""
    execute(dest, "SAVEPOINT replicator_drop_check")
    _drop_table(dest, target)
    execute(dest, "ROLLBACK TO SAVEPOINT replicator_drop_check")
    retired = retired_table(target)
    execute(
        dest,
        sql.SQL("ALTER TABLE {} RENAME TO {}").format(_ident(target), sql.Identifier(retired.name)),
    )
    if key_name is not None:
        execute(
            dest,
            sql.SQL("ALTER TABLE {} RENAME CONSTRAINT {} TO {}").format(
                _ident(retired), sql.Identifier(key_name), sql.Identifier(retired_key_name(target))
            ),
        )
    return retired


def _drop_table(dest: psycopg.Connection[Any], target: TableName) -> None:
    try:
        execute(dest, sql.SQL("DROP TABLE {}").format(_ident(target)))
    except DatabaseError as exc:
        if exc.sqlstate != DEPENDENT_OBJECTS:
            raise
        detail = (exc.detail or "").replace("\n", "; ")
        raise DatabaseError(
            f"destination: cannot replace {target}: other objects depend on it ({detail}); "
            "the old table is unchanged"
        ) from None


def move_statements(
    side: TableName, target: TableName, side_key: str | None, primary_key_name: str
) -> list[sql.Composable]:
    """The side table becomes `target` (the old one already dropped), keeping the old
    table's primary-key name. Pure: `compile` prints the same statements."""
    statements: list[sql.Composable] = []
    if side.schema != target.schema:
        statements.append(
            sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(
                _ident(side), sql.Identifier(target.schema)
            )
        )
    moved = TableName(target.schema, side.name)
    statements.append(
        sql.SQL("ALTER TABLE {} RENAME TO {}").format(_ident(moved), sql.Identifier(target.name))
    )
    if side_key is not None and side_key != primary_key_name:
        statements.append(
            sql.SQL("ALTER TABLE {} RENAME CONSTRAINT {} TO {}").format(
                _ident(target), sql.Identifier(side_key), sql.Identifier(primary_key_name)
            )
        )
    return statements


def swap_statements(
    side: TableName, target: TableName, side_key: str | None, primary_key_name: str
) -> list[sql.Composable]:
    """The swap as `compile` shows it, for a target that exists (views that depend on it are
    dropped before the rename and recreated after, as they are): the old table is renamed
    aside in the transaction and dropped after the commit, outside the lock."""
    retired = retired_table(target)
    statements = [
        sql.SQL("BEGIN"),
        sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)),
        sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(_ident(target)),
        sql.SQL("ALTER TABLE {} RENAME TO {}").format(_ident(target), sql.Identifier(retired.name)),
    ]
    if side_key is not None:
        statements.append(
            sql.SQL("ALTER TABLE {} RENAME CONSTRAINT {} TO {}").format(
                _ident(retired),
                sql.Identifier(primary_key_name),
                sql.Identifier(retired_key_name(target)),
            )
        )
    return [
        *statements,
        *move_statements(side, target, side_key, primary_key_name),
        sql.SQL("COMMIT"),
        sql.SQL("DROP TABLE IF EXISTS {}").format(_ident(retired)),
    ]


def _move(
    dest: psycopg.Connection[Any], side: TableName, target: TableName, primary_key_name: str
) -> None:
    key = fetch_all(
        dest, _PRIMARY_KEY_NAME, (fetch_all(dest, _RELATION_OID, (side.schema, side.name))[0][0],)
    )
    for statement in move_statements(side, target, key[0][0] if key else None, primary_key_name):
        execute(dest, statement)


def _recreate_view(dest: psycopg.Connection[Any], view: SavedObject) -> None:
    options = (
        sql.SQL(" WITH ({})").format(sql.SQL(", ").join(map(sql.SQL, view.options)))
        if view.options
        else sql.SQL("")
    )
    try:
        execute(
            dest,
            sql.SQL("CREATE VIEW {}{} AS {}").format(
                _ident(view.name), options, sql.SQL(view.definition.rstrip().rstrip(";"))
            ),
        )
    except DatabaseError as exc:
        raise DatabaseError(
            f"destination: cannot recreate dependent view {view.name} on the new table: "
            f"{str(exc).removeprefix('destination: ')}; "
            "the old table is unchanged"
        ) from None
    _restore(dest, view, "VIEW")


def _restore(dest: psycopg.Connection[Any], saved: SavedObject, kind: str) -> None:
    ident, keyword = _ident(saved.name), sql.SQL(kind)
    (current,) = execute(dest, "SELECT current_user").fetchone()
    if saved.owner != current:
        execute(
            dest,
            sql.SQL("ALTER {} {} OWNER TO {}").format(keyword, ident, sql.Identifier(saved.owner)),
        )
    for grantee, privilege, grantable in saved.grants:
        execute(
            dest,
            sql.SQL("GRANT {} ON {} TO {}{}").format(
                sql.SQL(privilege),
                ident,
                sql.SQL("PUBLIC") if grantee == "" else sql.Identifier(grantee),
                sql.SQL(" WITH GRANT OPTION") if grantable == "true" else sql.SQL(""),
            ),
        )
    for column, text in saved.comments:
        target = (
            ident if column == "" else sql.Identifier(saved.name.schema, saved.name.name, column)
        )
        execute(
            dest,
            sql.SQL("COMMENT ON {} {} IS {}").format(
                sql.SQL("COLUMN") if column else keyword, target, sql.Literal(text)
            ),
        )
