"""What people build on a copy, carried across its reload: indexes (those behind unique and
exclusion constraints too), triggers, row-level security and its policies, and the indexes
`tables[].indexes` asks for.

A reload loads a new table beside the live one and swaps it in (swap.py). Its indexes are
built on that side table after the load and before the swap, outside the swap's lock, under
derived names (`ix<hash>_...`); in the swap's transaction the old table's indexes are
renamed aside and the new ones take their names, so a query plan or a hint that names an
index finds it. Triggers and policies are created in the same transaction from their own
definitions, which name the table and so attach to the new one: a trigger never fires for
the rows the load copies. An index that cannot be built on the new table (its column is gone
upstream, or the new rows break its uniqueness) is left out with a warning that names it
and its statement; one that `tables[].indexes` asks for fails the table instead.

Definitions are PostgreSQL's own text (pg_get_indexdef, pg_get_triggerdef, pg_get_expr),
read with only pg_catalog on the search path so that every name in them is qualified.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ..base.identifiers import MAX_IDENTIFIER_BYTES, TableName, display_ident
from .database import Step, fetch_all
from .naming import derived_name

# Each index but the primary key, with the statement's tail from `USING` on when the
# statement starts as it does for every index (`CREATE [UNIQUE] INDEX name ON schema.table `).
_INDEXES = """
SELECT ic.relname, d.def,
       CASE WHEN pg_catalog.starts_with(d.def, d.head) THEN substr(d.def, length(d.head) + 1) END,
       i.indisunique, con.contype, pg_catalog.pg_get_constraintdef(con.oid)
FROM pg_catalog.pg_index i
JOIN pg_catalog.pg_class ic ON ic.oid = i.indexrelid
JOIN pg_catalog.pg_class c ON c.oid = i.indrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_catalog.pg_constraint con
       ON con.conindid = i.indexrelid AND con.conrelid = i.indrelid AND con.contype IN ('u', 'x')
CROSS JOIN LATERAL (
    SELECT pg_catalog.pg_get_indexdef(i.indexrelid) AS def,
           format('CREATE %%sINDEX %%I ON %%I.%%I ', CASE WHEN i.indisunique THEN 'UNIQUE ' END,
                  ic.relname, n.nspname, c.relname) AS head
) d
WHERE i.indrelid = %s AND NOT i.indisprimary
ORDER BY ic.relname
"""
_TRIGGERS = """
SELECT t.tgname, pg_catalog.pg_get_triggerdef(t.oid), t.tgenabled
FROM pg_catalog.pg_trigger t WHERE t.tgrelid = %s AND NOT t.tgisinternal ORDER BY t.tgname
"""
_POLICIES = """
SELECT p.polname, p.polpermissive, p.polcmd,
       ARRAY(SELECT CASE WHEN r = 0 THEN '' ELSE pg_catalog.pg_get_userbyid(r) END
             FROM unnest(p.polroles) AS r ORDER BY 1),
       pg_catalog.pg_get_expr(p.polqual, p.polrelid),
       pg_catalog.pg_get_expr(p.polwithcheck, p.polrelid)
FROM pg_catalog.pg_policy p WHERE p.polrelid = %s ORDER BY p.polname
"""
_ROW_SECURITY = """
SELECT c.relrowsecurity, c.relforcerowsecurity FROM pg_catalog.pg_class c WHERE c.oid = %s
"""
_COMMANDS = {"r": "SELECT", "a": "INSERT", "w": "UPDATE", "d": "DELETE", "*": "ALL"}
# pg_trigger.tgenabled other than "O" (fires in the origin and local roles), as set again
_TRIGGER_STATES = {"D": "DISABLE", "R": "ENABLE REPLICA", "A": "ENABLE ALWAYS"}


@dataclass(frozen=True)
class CopyIndex:
    """An index the new table gets: one the copy has, or one `tables[].indexes` asks for."""

    name: str  # its name on the copy, in the copy's schema
    tail: str | None  # the statement from `USING` on; None: a shape this module cannot rebuild
    unique: bool
    constraint: str | None = None  # pg_get_constraintdef of the constraint it backs
    definition: str = ""  # pg_get_indexdef: how it was made on the copy
    on_copy: bool = True  # False: asked for and not on the copy yet
    configured: bool = False  # from tables[].indexes: a failure to build it fails the table

    def built_name(self, target: TableName) -> str:
        """Its name on the side table while it is built (unique to the definition)."""
        return derived_name(f"ix{self._digest()}", target)

    def retired_name(self, target: TableName) -> str:
        """The old table's index of this name, renamed aside in the swap."""
        return derived_name(f"oldix{self._digest()}", target)

    def _digest(self) -> str:
        text = f"{self.name}\0{self.tail}\0{self.unique}\0{self.constraint}"
        return hashlib.sha256(text.encode()).hexdigest()[:8]

    def build(self, side: TableName, target: TableName) -> list[Step]:
        """The statements that build it on the loaded side table (again, if a killed run
        left it there)."""
        assert self.tail is not None
        name = self.built_name(target)
        built = sql.Identifier(name)
        if self.constraint is not None:
            drop = sql.SQL("ALTER TABLE {} DROP CONSTRAINT IF EXISTS {}").format(
                side.identifier(), built
            )
            create = sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} {}").format(
                side.identifier(), built, sql.SQL(self.constraint)
            )
        else:
            drop = sql.SQL("DROP INDEX IF EXISTS {}").format(sql.Identifier(side.schema, name))
            create = sql.SQL("CREATE {}INDEX {} ON {} {}").format(
                sql.SQL("UNIQUE " if self.unique else ""),
                built,
                side.identifier(),
                sql.SQL(self.tail),
            )
        return [Step("destination", drop), Step("destination", create)]

    def statement(self, target: TableName) -> str:
        """How to create it by hand on the copy (for a warning: its names quoted where they
        need it, as PostgreSQL prints them)."""
        if self.tail is None:
            return self.definition
        name = display_ident(self.name)
        if self.constraint is not None:
            return f"ALTER TABLE {target} ADD CONSTRAINT {name} {self.constraint}"
        unique = "UNIQUE " if self.unique else ""
        return f"CREATE {unique}INDEX {name} ON {target} {self.tail}"


@dataclass(frozen=True)
class Policy:
    name: str
    permissive: bool
    command: str  # pg_policy.polcmd
    roles: tuple[str, ...]  # "" stands for PUBLIC
    using: str | None
    check: str | None


@dataclass(frozen=True)
class CopyObjects:
    """What the swap recreates on the new table besides its grants, owner and comments."""

    indexes: tuple[CopyIndex, ...] = ()
    triggers: tuple[tuple[str, str, str], ...] = ()  # (name, definition, tgenabled)
    policies: tuple[Policy, ...] = ()
    row_security: tuple[bool, bool] = (False, False)  # enabled, forced

    def with_configured(self, wanted: Sequence[CopyIndex]) -> CopyObjects:
        """These, with the configured indexes the copy does not have yet (by name)."""
        have = {index.name for index in self.indexes}
        more = tuple(index for index in wanted if index.name not in have)
        return CopyObjects(self.indexes + more, self.triggers, self.policies, self.row_security)


def read_copy_objects(conn: psycopg.Connection[Any], oid: int) -> CopyObjects:
    """The table's indexes, triggers and policies (run with only pg_catalog on the path)."""
    indexes = tuple(
        CopyIndex(name, tail, unique, constraint if kind is not None else None, definition)
        for name, definition, tail, unique, kind, constraint in fetch_all(conn, _INDEXES, (oid,))
    )
    triggers = tuple(tuple(row) for row in fetch_all(conn, _TRIGGERS, (oid,)))
    policies = tuple(
        Policy(name, permissive, command, tuple(roles), using, check)
        for name, permissive, command, roles, using, check in fetch_all(conn, _POLICIES, (oid,))
    )
    ((enabled, forced),) = fetch_all(conn, _ROW_SECURITY, (oid,))
    return CopyObjects(indexes, triggers, policies, (enabled, forced))  # type: ignore[arg-type]


def configured_index(
    target: TableName, columns: Sequence[str], unique: bool, kind: str
) -> CopyIndex:
    """A `tables[].indexes` entry: named as PostgreSQL names an index it is not given a name
    for (`<table>_<columns>_idx`, `_key` when unique), with a hash where that is too long."""
    label = "key" if unique else "idx"
    name = f"{target.name}_{'_'.join(columns)}_{label}"
    if len(name.encode()) > MAX_IDENTIFIER_BYTES:
        name = derived_name(f"{label}{hashlib.sha256(name.encode()).hexdigest()[:8]}", target)
    tail = sql.SQL("USING {} ({})").format(
        sql.SQL(kind), sql.SQL(", ").join(map(sql.Identifier, columns))
    )
    return CopyIndex(name, _plain(tail), unique, on_copy=False, configured=True)


def _plain(composed: sql.Composable) -> str:
    """Identifiers quoted as psycopg quotes them, without a connection."""
    return composed.as_string(None)


def create_on_copy(index: CopyIndex, target: TableName) -> Step:
    """A configured index built on the live copy, where a sync finds it missing."""
    return Step(
        "destination",
        sql.SQL("CREATE {}INDEX IF NOT EXISTS {} ON {} {}").format(
            sql.SQL("UNIQUE " if index.unique else ""),
            sql.Identifier(index.name),
            target.identifier(),
            sql.SQL(index.tail or ""),
        ),
    )


def retire_steps(target: TableName, carried: Sequence[CopyIndex]) -> list[Step]:
    """In the swap, before the new table moves in: the old table's indexes of the names the
    new one takes are renamed aside (renaming a constraint's index renames the constraint)."""
    return [
        Step(
            "destination",
            sql.SQL("ALTER INDEX {} RENAME TO {}").format(
                sql.Identifier(target.schema, index.name),
                sql.Identifier(index.retired_name(target)),
            ),
        )
        for index in carried
        if index.on_copy
    ]


def recreate_steps(
    objects: CopyObjects, target: TableName, carried: Sequence[CopyIndex]
) -> list[Step]:
    """In the swap, after the new table took the name: its indexes get their names, then
    row-level security, policies and triggers are created as the old table had them."""
    steps = [
        Step(
            "destination",
            sql.SQL("ALTER INDEX {} RENAME TO {}").format(
                sql.Identifier(target.schema, index.built_name(target)),
                sql.Identifier(index.name),
            ),
        )
        for index in carried
    ]
    table = target.identifier()
    enabled, forced = objects.row_security
    if enabled:
        steps.append(
            Step("destination", sql.SQL("ALTER TABLE {} ENABLE ROW LEVEL SECURITY").format(table))
        )
    if forced:
        steps.append(
            Step("destination", sql.SQL("ALTER TABLE {} FORCE ROW LEVEL SECURITY").format(table))
        )
    steps += [Step("destination", _policy(policy, target)) for policy in objects.policies]
    for name, definition, state in objects.triggers:
        steps.append(Step("destination", sql.SQL(definition)))
        if state in _TRIGGER_STATES:
            steps.append(
                Step(
                    "destination",
                    sql.SQL("ALTER TABLE {} {} TRIGGER {}").format(
                        table, sql.SQL(_TRIGGER_STATES[state]), sql.Identifier(name)
                    ),
                )
            )
    return steps


def _policy(policy: Policy, target: TableName) -> sql.Composable:
    roles = sql.SQL(", ").join(
        sql.SQL("PUBLIC") if role == "" else sql.Identifier(role) for role in policy.roles
    )
    parts = [
        sql.SQL("CREATE POLICY {} ON {} AS {} FOR {} TO {}").format(
            sql.Identifier(policy.name),
            target.identifier(),
            sql.SQL("PERMISSIVE" if policy.permissive else "RESTRICTIVE"),
            sql.SQL(_COMMANDS[policy.command]),
            roles,
        )
    ]
    if policy.using is not None:
        parts.append(sql.SQL("USING ({})").format(sql.SQL(policy.using)))
    if policy.check is not None:
        parts.append(sql.SQL("WITH CHECK ({})").format(sql.SQL(policy.check)))
    return sql.SQL(" ").join(parts)
