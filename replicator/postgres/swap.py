"""The atomic swap: a loaded side table replaces the live table in one short transaction.

Readers never see a missing, empty or half-loaded table: until the commit they read the old
table, after it the new one. Views and materialized views that depend on the table are
dropped and recreated (from their own definitions, so they point at the new table) in the
same transaction, with their owners, grants, options, comments and (a materialized view's)
indexes; a materialized view is refreshed there too, so nobody finds it unpopulated. The
table keeps its grants, owner, comments, indexes, triggers and policies (copy_objects.py).
Anything else that depends on the live table (a foreign key) makes the swap fail, leaving the
old table untouched. The old table is renamed aside in the transaction and dropped after the
commit: freeing a big table's files takes time readers should not wait.

The statements come from one pure function of what the destination looks like (`SwapFacts`),
which `compile` prints and the swap runs; the facts are read before the swap and again under
its lock, and the swap starts over if they changed in between.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from ..base.errors import DatabaseError
from ..base.failpoints import failpoint
from ..base.identifiers import TableName
from .catalog import taken_names
from .copy_objects import CopyIndex, CopyObjects, read_copy_objects, recreate_steps, retire_steps
from .database import Step, execute, fetch_all, run_steps, transaction
from .dependent_views import dependents
from .naming import default_key_name, retired_key_name, retired_table
from .ownership import read_records, record_owned_steps

LOCK_TIMEOUT = "5s"
LOCK_NOT_AVAILABLE = psycopg.errors.LockNotAvailable.sqlstate
DEPENDENT_OBJECTS = psycopg.errors.DependentObjectsStillExist.sqlstate

_RELATION_OID = """
SELECT c.oid FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""
_OBJECT = """
SELECT pg_catalog.pg_get_userbyid(c.relowner), c.reloptions,
       CASE WHEN c.relkind IN ('v', 'm') THEN pg_catalog.pg_get_viewdef(c.oid, true) END,
       ARRAY(SELECT ARRAY[CASE WHEN a.grantee = 0 THEN '' ELSE
                               pg_catalog.pg_get_userbyid(a.grantee) END,
                          a.privilege_type, a.is_grantable::text]
             FROM aclexplode(c.relacl) a WHERE a.grantee <> c.relowner),
       ARRAY(SELECT ARRAY[coalesce(att.attname, ''), d.description]
             FROM pg_catalog.pg_description d
             LEFT JOIN pg_catalog.pg_attribute att
                    ON att.attrelid = d.objoid AND att.attnum = d.objsubid
             WHERE d.objoid = c.oid AND d.classoid = 'pg_catalog.pg_class'::regclass
             ORDER BY d.objsubid),
       c.relkind, c.relispopulated,
       ARRAY(SELECT pg_catalog.pg_get_indexdef(i.indexrelid) FROM pg_catalog.pg_index i
             WHERE i.indrelid = c.oid AND c.relkind = 'm' ORDER BY i.indexrelid)
FROM pg_catalog.pg_class c WHERE c.oid = %s
"""
_PRIMARY_KEY_NAME = """
SELECT conname FROM pg_catalog.pg_constraint WHERE conrelid = %s AND contype = 'p'
"""


@dataclass(frozen=True)
class SavedObject:
    """What a swap must put back on a table or view it drops and recreates."""

    name: TableName
    owner: str
    options: tuple[str, ...]
    definition: str | None
    grants: tuple[tuple[str, ...], ...]
    comments: tuple[tuple[str, ...], ...]
    kind: str = "r"  # pg_class.relkind: "r" the table, "v" a view, "m" a materialized view
    populated: bool = True  # a materialized view's (WITH NO DATA leaves it unpopulated)
    indexes: tuple[str, ...] = ()  # a materialized view's, as pg_get_indexdef gives them

    @property
    def keyword(self) -> str:
        return {"r": "TABLE", "v": "VIEW", "m": "MATERIALIZED VIEW"}[self.kind]


@dataclass(frozen=True)
class SwapFacts:
    """What the swap of one table depends on in the destination."""

    table_oid: int | None  # the live table; None while the target does not exist
    table: SavedObject | None
    views: tuple[SavedObject, ...]  # shallowest first, as they are recreated
    old_key: str | None  # the live table's primary-key name, kept by the new table
    free_key: str  # the name PostgreSQL would give a new key
    current_user: str
    # the table's indexes, triggers and policies
    objects: CopyObjects = field(default_factory=CopyObjects)


@dataclass(frozen=True)
class SwapScript:
    """The swap's statements: `prologue` (settings, the lock), then `body` inside the same
    transaction, then `after` the commit."""

    prologue: list[Step]
    body: list[tuple[Step, str | None]]  # with what a failure of the step means, if special
    after: list[Step]

    def steps(self, also: Sequence[Step] = ()) -> list[Step]:
        """Everything in order, as `compile` prints it and `sync` runs it (`also`, as
        swap_in runs it, last in the transaction)."""
        return [
            Step("destination", "BEGIN"),
            *self.prologue,
            *(step for step, _ in self.body),
            *also,
            Step("destination", "COMMIT"),
            *self.after,
        ]


class _FactsChanged(Exception):
    """The table or its views changed between reading the facts and taking the lock."""


def swap_in(
    dest: psycopg.Connection[Any],
    side: TableName,
    target: TableName,
    side_key: str | None = None,
    also: Sequence[Step] = (),
    built: Sequence[CopyIndex] = (),
) -> Swapped:
    """Replace `target` with `side` atomically. The key keeps the old table's key name, else
    gets the one PostgreSQL would choose; the indexes `built` on the side table take the
    names of the copy's. `also` runs in the same transaction (a `cdc` table's log
    position)."""
    # tenacity, imported by the loads that swap: a batch's run never loads it
    from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

    retrying = Retrying(
        retry=retry_if_exception(_retryable),
        stop=stop_after_attempt(5),
        wait=wait_exponential(multiplier=0.5, max=5),
        reraise=True,
    )
    return retrying(_swap_once, dest, side, target, side_key, also, tuple(built))


@dataclass(frozen=True)
class Swapped:
    lock_seconds: float  # how long the table lock was held
    left_out: tuple[CopyIndex, ...]  # the copy's indexes the new table does not have
    also_rows: tuple[int, ...] = ()  # the rows each of `also`'s statements wrote


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, _FactsChanged) or (
        isinstance(exc, DatabaseError) and exc.sqlstate == LOCK_NOT_AVAILABLE
    )


def _swap_once(
    dest: psycopg.Connection[Any],
    side: TableName,
    target: TableName,
    side_key: str | None,
    also: Sequence[Step],
    built: tuple[CopyIndex, ...],
) -> Swapped:
    facts = read_facts(dest, target)
    carried = carried_indexes(facts.objects, built)
    script = swap_script(facts, side, target, side_key, carried)
    with transaction(dest):
        run_steps(dest, script.prologue)
        locked_at = time.monotonic()
        if facts.table_oid is not None:
            if not read_records(dest, target, facts.table_oid).this_oid:
                raise DatabaseError(  # replaced by someone else while the load ran
                    f"destination: {target} is not a table replicator created (it was "
                    "replaced while the load ran); it is left as it is"
                )
            if read_facts(dest, target) != facts:
                raise _FactsChanged
        _run_body(dest, script, target)
        also_rows = tuple(execute(dest, step.statement, step.params).rowcount for step in also)
        failpoint("before-swap-commit")
    lock_seconds = time.monotonic() - locked_at
    failpoint("after-swap-commit")
    run_steps(dest, script.after)
    left_out = tuple(i for i in facts.objects.indexes if i.name not in {c.name for c in carried})
    return Swapped(lock_seconds, left_out, also_rows)


def carried_indexes(objects: CopyObjects, built: Sequence[CopyIndex]) -> tuple[CopyIndex, ...]:
    """The indexes built on the side table that the swap gives their names: each one the copy
    still has as it was when it was built, and each configured one the copy lacks."""
    on_copy = {index.name: index for index in objects.indexes}
    return tuple(
        index
        for index in built
        if on_copy.get(index.name) == index or (index.name not in on_copy and not index.on_copy)
    )


def _run_body(dest: psycopg.Connection[Any], script: SwapScript, target: TableName) -> None:
    for step, meaning in script.body:
        try:
            execute(dest, step.statement, step.params)
        except DatabaseError as exc:
            if meaning == "drop-check" and exc.sqlstate == DEPENDENT_OBJECTS:
                detail = (exc.detail or "").replace("\n", "; ")
                raise DatabaseError(
                    f"destination: cannot replace {target}: other objects depend on it "
                    f"({detail}); the old table is unchanged"
                ) from None
            if meaning is not None and meaning.startswith(("view ", "materialized view ")):
                raise DatabaseError(
                    f"destination: cannot recreate dependent {meaning} on the new table: "
                    f"{str(exc).removeprefix('destination: ')}; the old table is unchanged"
                ) from None
            raise


def read_facts(dest: psycopg.Connection[Any], target: TableName) -> SwapFacts:
    """The live table, its views, keys and owner (reads only). Definitions are read with
    only pg_catalog on the search path, so they come back fully qualified."""
    with transaction(dest, rollback=True):
        execute(dest, "SET LOCAL search_path = pg_catalog, pg_temp")
        (current_user,) = execute(dest, "SELECT current_user").fetchone()
        existing = fetch_all(dest, _RELATION_OID, (target.schema, target.name))
        free_key = _free_key_name(dest, target)
        if not existing:
            return SwapFacts(None, None, (), None, free_key, current_user)
        oid = existing[0][0]
        old_key = fetch_all(dest, _PRIMARY_KEY_NAME, (oid,))
        return SwapFacts(
            table_oid=oid,
            table=_save(dest, oid, target),
            views=tuple(_dependent_views(dest, oid)),
            old_key=old_key[0][0] if old_key else None,
            free_key=free_key,
            current_user=current_user,
            objects=read_copy_objects(dest, oid),
        )


def swap_script(
    facts: SwapFacts,
    side: TableName,
    target: TableName,
    side_key: str | None,
    carried: Sequence[CopyIndex] = (),
) -> SwapScript:
    """Pure: the statements that put `side` in place of `target`, given the facts and the
    indexes built on `side` that take the copy's names."""
    prologue = [
        Step(
            "destination",
            sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)),
        ),
        # Definitions are re-run with only pg_catalog on the path: they are fully qualified.
        Step("destination", "SET LOCAL search_path = pg_catalog, pg_temp"),
    ]
    body: list[tuple[Step, str | None]] = []
    after: list[Step] = []
    key_name = facts.old_key or facts.free_key
    if facts.table_oid is not None:
        prologue.append(
            Step(
                "destination",
                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(target.identifier()),
            )
        )
        body += [(step, None) for step in _drop_views(facts)]
        body += _retire(target, facts.old_key)
        body += [(s, None) for s in retire_steps(target, carried)]
        after.append(
            Step(
                "destination",
                sql.SQL("DROP TABLE IF EXISTS {}").format(retired_table(target).identifier()),
            )
        )
    body += [(s, None) for s in move_steps(side, target, side_key, key_name)]
    body += [(s, None) for s in record_owned_steps(target)]
    if facts.table is not None:
        body += [(s, None) for s in _restore(facts.table, facts.current_user)]
    body += [(s, None) for s in recreate_steps(facts.objects, target, carried)]
    body += _recreate_views(facts)
    return SwapScript(prologue, body, after)


def view_steps(facts: SwapFacts) -> tuple[list[Step], list[Step]]:
    """The table's dependent views dropped (deepest first), and created again (shallowest
    first) as the swap recreates them: what an ALTER of a column they use needs around it
    (sync/incremental/evolve.py)."""
    return _drop_views(facts), [step for step, _ in _recreate_views(facts)]


def _drop_views(facts: SwapFacts) -> list[Step]:
    return [
        Step("destination", sql.SQL("DROP {} {}").format(sql.SQL(v.keyword), v.name.identifier()))
        for v in reversed(facts.views)
    ]


def _recreate_views(facts: SwapFacts) -> list[tuple[Step, str | None]]:
    """Each view with its owner, grants and comments; a materialized view with its indexes,
    then refreshed as its owner."""
    body: list[tuple[Step, str | None]] = []
    for view in facts.views:
        meaning = f"{view.keyword.lower()} {view.name}"
        body.append((_create_view(view), meaning))
        body += [(s, None) for s in _restore(view, facts.current_user)]
        body += [(Step("destination", sql.SQL(index)), meaning) for index in view.indexes]
        if view.kind == "m" and view.populated:
            refresh = sql.SQL("REFRESH MATERIALIZED VIEW {}").format(view.name.identifier())
            body.append((Step("destination", refresh), meaning))
    return body


def _retire(target: TableName, key_name: str | None) -> list[tuple[Step, str | None]]:
    """Rename the old table (and its key) aside; it is dropped after the commit. It must be
    droppable now, though: a foreign key that depends on it fails the
    swap here (a DROP in a savepoint, rolled back), with the old table untouched. (Its views
    are dropped by then, to be recreated on the new table.)"""
    retired = retired_table(target)
    steps: list[tuple[Step, str | None]] = [
        (Step("destination", "SAVEPOINT replicator_drop_check"), None),
        (Step("destination", sql.SQL("DROP TABLE {}").format(target.identifier())), "drop-check"),
        (Step("destination", "ROLLBACK TO SAVEPOINT replicator_drop_check"), None),
        (
            Step(
                "destination",
                sql.SQL("ALTER TABLE {} RENAME TO {}").format(
                    target.identifier(), sql.Identifier(retired.name)
                ),
            ),
            None,
        ),
    ]
    if key_name is not None:
        rename = sql.SQL("ALTER TABLE {} RENAME CONSTRAINT {} TO {}").format(
            retired.identifier(), sql.Identifier(key_name), sql.Identifier(retired_key_name(target))
        )
        steps.append((Step("destination", rename), None))
    return steps


def move_steps(
    side: TableName, target: TableName, side_key: str | None, primary_key_name: str
) -> list[Step]:
    """The side table becomes `target` (the old one already aside), with the old table's
    primary-key name."""
    steps: list[Step] = []
    if side.schema != target.schema:
        steps.append(
            Step(
                "destination",
                sql.SQL("ALTER TABLE {} SET SCHEMA {}").format(
                    side.identifier(), sql.Identifier(target.schema)
                ),
            )
        )
    moved = TableName(target.schema, side.name)
    steps.append(
        Step(
            "destination",
            sql.SQL("ALTER TABLE {} RENAME TO {}").format(
                moved.identifier(), sql.Identifier(target.name)
            ),
        )
    )
    if side_key is not None and side_key != primary_key_name:
        steps.append(
            Step(
                "destination",
                sql.SQL("ALTER TABLE {} RENAME CONSTRAINT {} TO {}").format(
                    target.identifier(), sql.Identifier(side_key), sql.Identifier(primary_key_name)
                ),
            )
        )
    return steps


def _free_key_name(dest: psycopg.Connection[Any], target: TableName) -> str:
    """The first of `<table>_pkey`, `<table>_pkey1`... that no relation in the schema uses,
    as PostgreSQL chooses it (two long names cut to one prefix must not collide)."""
    candidates = [default_key_name(target, n) for n in range(100)]
    taken = taken_names(dest, target.schema, candidates)
    return next(name for name in candidates if name not in taken)


def _save(dest: psycopg.Connection[Any], oid: int, name: TableName) -> SavedObject:
    row = fetch_all(dest, _OBJECT, (oid,))[0]
    owner, options, definition, grants, comments, kind, populated, indexes = row
    return SavedObject(
        name,
        owner,
        tuple(options or ()),
        definition,
        tuple(map(tuple, grants)),
        tuple(map(tuple, comments)),
        kind,
        populated,
        tuple(indexes),
    )


def _dependent_views(dest: psycopg.Connection[Any], oid: int) -> list[SavedObject]:
    return [_save(dest, view.oid, view.name) for view in dependents(dest, oid)]


def _create_view(view: SavedObject) -> Step:
    """A view, or a materialized view without its rows (refreshed once it has its owner)."""
    options = (
        sql.SQL(" WITH ({})").format(sql.SQL(", ").join(map(sql.SQL, view.options)))
        if view.options
        else sql.SQL("")
    )
    definition = (view.definition or "").rstrip().rstrip(";")
    return Step(
        "destination",
        sql.SQL("CREATE {} {}{} AS {}{}").format(
            sql.SQL(view.keyword),
            view.name.identifier(),
            options,
            sql.SQL(definition),
            sql.SQL(" WITH NO DATA" if view.kind == "m" else ""),
        ),
    )


def _restore(saved: SavedObject, current_user: str) -> list[Step]:
    ident, keyword = saved.name.identifier(), sql.SQL(saved.keyword)
    statements: list[sql.Composable] = []
    if saved.owner != current_user:
        statements.append(
            sql.SQL("ALTER {} {} OWNER TO {}").format(keyword, ident, sql.Identifier(saved.owner))
        )
    for grantee, privilege, grantable in saved.grants:
        statements.append(
            sql.SQL("GRANT {} ON {} TO {}{}").format(
                sql.SQL(privilege),
                ident,
                sql.SQL("PUBLIC") if grantee == "" else sql.Identifier(grantee),
                sql.SQL(" WITH GRANT OPTION") if grantable == "true" else sql.SQL(""),
            )
        )
    for column, text in saved.comments:
        target = (
            ident if column == "" else sql.Identifier(saved.name.schema, saved.name.name, column)
        )
        statements.append(
            sql.SQL("COMMENT ON {} {} IS {}").format(
                sql.SQL("COLUMN") if column else keyword, target, sql.Literal(text)
            )
        )
    return [Step("destination", statement) for statement in statements]
