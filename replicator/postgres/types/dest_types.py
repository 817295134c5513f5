"""Enum, domain, range and composite types a table uses, created in the destination first.

The closure of user-defined types is read from the source (type_closure.py), then created
deepest-first, after the extensions whose types it uses (dest_extensions.py: a type that
belongs to an extension is never created by hand). Existing enums gain the labels they lack,
in the source's order, and take its renames; one whose labels end up in another order fails
the table with the fix (labels compare by place; PostgreSQL cannot move one). Existing
domains take the source's default, NOT NULL and validated checks (a changed domain reloads
the table through schema drift, and its new rows must fit; a check the source added NOT
VALID may be broken by rows it already has; NOT NULL is left to the user, with a warning
that says how, while a destination table holds a NULL of it: the live copy's rows, which
the reload replaces, would fail it); a domain whose base type or collation changed
fails the table with the fix (PostgreSQL cannot change it in place). Existing composites
gain attributes added at the end; any other difference fails the table with the fix. An
existing range type must have the source's subtype (else the same fix).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ...base.errors import TableProblem
from ...base.identifiers import display_ident
from ..catalog import Column
from ..database import Step, execute, fetch_all, transaction
from ..dest_ranges import range_definition, range_statements
from .dest_collations import collation_work
from .dest_extensions import extension_needs
from .domain_needs import check_domain_needs
from .type_alignment import drop_by_hand, qualified_rows
from .type_closure import read_closure

log = logging.getLogger(__name__)

_ENUM_LABELS = (
    "SELECT enumlabel FROM pg_catalog.pg_enum WHERE enumtypid = %s ORDER BY enumsortorder"
)
_DOMAIN = """
SELECT pg_catalog.format_type(typbasetype, typtypmod), typnotnull, typdefault,
       (SELECT CASE WHEN cn.nspname <> 'pg_catalog' THEN quote_ident(cn.nspname) || '.' ELSE '' END
               || quote_ident(c.collname)
        FROM pg_catalog.pg_collation c JOIN pg_catalog.pg_namespace cn ON cn.oid = c.collnamespace
        WHERE c.oid = t.typcollation AND t.typcollation <> 0
          AND c.oid <> (SELECT b.typcollation FROM pg_catalog.pg_type b
                        WHERE b.oid = t.typbasetype)),
       ARRAY(SELECT pg_catalog.pg_get_constraintdef(c.oid) FROM pg_catalog.pg_constraint c
             WHERE c.contypid = t.oid AND c.contype = 'c' AND c.convalidated
             ORDER BY c.conname)
FROM pg_catalog.pg_type t WHERE t.oid = %s
"""
_DOMAIN_CHECKS = """
SELECT c.conname, pg_catalog.pg_get_constraintdef(c.oid) FROM pg_catalog.pg_constraint c
WHERE c.contypid = %s AND c.contype = 'c' ORDER BY c.conname
"""
# A check the source added NOT VALID holds for new rows only: rows it has already may break
# it, and the copy must take them (COPY checks every row it writes into a domain). It is
# carried once validated there (its definition, and so the table's signature, changes).
_VALID_DOMAIN_CHECKS = _DOMAIN_CHECKS.replace(
    "c.contype = 'c' ORDER BY", "c.contype = 'c' AND c.convalidated ORDER BY"
)
_COMPOSITE = """
SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod)
FROM pg_catalog.pg_type t JOIN pg_catalog.pg_attribute a ON a.attrelid = t.typrelid
WHERE t.oid = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum
"""
_EXISTS = """
SELECT t.oid FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
WHERE n.nspname = %s AND t.typname = %s
"""


@dataclass(frozen=True)
class TypeWork:
    """What the destination needs for a table's user-defined types: the schemas they live
    in (created first, with the table's own), and the statements, deepest type first."""

    schemas: list[str]
    steps: list[Step]


def type_work(
    source: psycopg.Connection[Any], dest: psycopg.Connection[Any], columns: Sequence[Column]
) -> TypeWork:
    """Reads both catalogs, writes nothing. TableProblem when a type cannot be aligned in
    place, or an extension it belongs to cannot be created by the loading role."""
    used = read_closure(source, [(c.name, c.type_oid) for c in columns])
    collation_schemas, collations = collation_work(source, dest, columns, used)
    steps = [Step("destination", statement) for statement in collations]
    for need in extension_needs(dest, used):
        if need.problem is not None:
            raise TableProblem(need.error)
        steps.append(Step("destination", need.statement))
    with transaction(source):
        execute(source, "SET LOCAL search_path = pg_catalog, pg_temp")
        for t in used:
            if t.extension or not t.creatable:
                continue
            qualified = sql.Identifier(t.schema, t.name)
            existing = fetch_all(dest, _EXISTS, (t.schema, t.name))
            if t.kind == "d":
                check_domain_needs(source, dest, t.oid, t.qualified)
            if t.kind == "e":
                statements = _enum(source, dest, t.oid, qualified, existing)
            elif t.kind == "r":
                statements = range_statements(source, dest, t.oid, qualified, existing)
            elif t.kind == "d" and existing:
                statements = _align_domain(source, dest, t.oid, existing[0][0], qualified)
            elif existing:
                statements = _check_composite(source, dest, t.oid, existing[0][0], qualified)
            elif t.kind == "d":
                statements = [_domain(source, t.oid, qualified)]
            else:
                statements = [_composite(source, t.oid, qualified)]
            steps += [Step("destination", statement) for statement in statements]
    schemas = [*collation_schemas, *(t.schema for t in used)]
    return TypeWork(list(dict.fromkeys(schemas)), steps)


def _enum(
    source: psycopg.Connection[Any],
    dest: psycopg.Connection[Any],
    oid: int,
    qualified: sql.Identifier,
    existing: list[tuple[Any, ...]],
) -> list[sql.Composable]:
    """CREATE TYPE, or the labels an existing enum lacks, each in the source's place."""
    labels = [row[0] for row in fetch_all(source, _ENUM_LABELS, (oid,))]
    if not existing:
        return [
            sql.SQL("CREATE TYPE {} AS ENUM ({})").format(
                qualified, sql.SQL(", ").join(map(sql.Literal, labels))
            )
        ]
    have = [row[0] for row in fetch_all(dest, _ENUM_LABELS, (existing[0][0],))]
    statements = _renamed_labels(qualified, labels, have)
    previous: str | None = None
    for label in labels:
        if label not in have:
            if previous is not None:
                position = sql.SQL(" AFTER {}").format(sql.Literal(previous))
            elif have:
                position = sql.SQL(" BEFORE {}").format(sql.Literal(have[0]))
            else:
                position = sql.SQL("")
            statements.append(
                sql.SQL("ALTER TYPE {} ADD VALUE IF NOT EXISTS {}{}").format(
                    qualified, sql.Literal(label), position
                )
            )
            have.insert(0 if previous is None else have.index(previous) + 1, label)
        previous = label
    wanted = set(labels)
    if [label for label in have if label in wanted] != labels:  # labels compare by place
        name = qualified.as_string(None)
        raise drop_by_hand(
            f"enum {name} orders its labels otherwise in the destination "
            f"({', '.join(have)}) than in the source ({', '.join(labels)}), and PostgreSQL "
            "cannot move a label",
            "TYPE",
            name,
        )
    return statements


def _renamed_labels(
    qualified: sql.Identifier, labels: list[str], have: list[str]
) -> list[sql.Composable]:
    """Labels renamed in the source (`ALTER TYPE ... RENAME VALUE`; PostgreSQL cannot drop
    one): between the same two labels both lists share, as many the destination has and the
    source lacks as the source has and the destination lacks, paired in order (a gap with
    other counts also holds labels added since: which one was renamed cannot be told).
    Renamed in `have` too."""
    shared = set(labels) & set(have)
    if [label for label in have if label in shared] != [x for x in labels if x in shared]:
        return []  # reordered: the caller says so
    statements: list[sql.Composable] = []
    for old, new in zip(_gaps(have, shared), _gaps(labels, shared), strict=True):
        if len(old) != len(new):
            continue
        for before, after in zip(old, new, strict=True):
            statements.append(
                sql.SQL("ALTER TYPE {} RENAME VALUE {} TO {}").format(
                    qualified, sql.Literal(before), sql.Literal(after)
                )
            )
            have[have.index(before)] = after
    return statements


def _gaps(labels: list[str], shared: set[str]) -> list[list[str]]:
    """The runs of labels before, between and after the shared ones."""
    gaps: list[list[str]] = [[]]
    for label in labels:
        if label in shared:
            gaps.append([])
        else:
            gaps[-1].append(label)
    return gaps


def _domain(source: psycopg.Connection[Any], oid: int, qualified: sql.Identifier) -> sql.Composed:
    base, not_null, default, collation, checks = fetch_all(source, _DOMAIN, (oid,))[0]
    parts = [sql.SQL("CREATE DOMAIN {} AS {}").format(qualified, sql.SQL(base))]
    if collation:
        parts.append(sql.SQL("COLLATE {}").format(sql.SQL(collation)))
    if default is not None:
        parts.append(sql.SQL("DEFAULT {}").format(sql.SQL(default)))
    if not_null:
        parts.append(sql.SQL("NOT NULL"))
    parts += [sql.SQL(check) for check in checks]
    return sql.SQL(" ").join(parts)


def _align_domain(
    source: psycopg.Connection[Any],
    dest: psycopg.Connection[Any],
    oid: int,
    dest_oid: int,
    qualified: sql.Identifier,
) -> list[sql.Composable]:
    """Give an existing destination domain the source's default, NOT NULL and checks.

    New checks are added NOT VALID: the live table's rows are about to be replaced by the
    source's, which already pass them."""
    base, not_null, default, collation, _ = fetch_all(source, _DOMAIN, (oid,))[0]
    have_base, have_not_null, have_default, have_collation, _ = qualified_rows(
        dest, _DOMAIN, dest_oid
    )[0]
    if (base, collation) != (have_base, have_collation):
        name = qualified.as_string(dest)
        raise drop_by_hand(
            f"domain {name} is {base} in the source but {have_base} in the destination, and "
            f"PostgreSQL cannot change a domain's type in place",
            "DOMAIN",
            name,
        )
    alter = sql.SQL("ALTER DOMAIN {} ").format(qualified)
    statements: list[sql.Composable] = []
    if default != have_default:
        action = sql.SQL("DROP DEFAULT" if default is None else "SET DEFAULT {}")
        statements.append(alter + action.format(sql.SQL(default or "")))
    if not_null != have_not_null:
        held = _nulls_in(dest, dest_oid) if not_null else []
        if not held:
            statements.append(alter + sql.SQL("SET NOT NULL" if not_null else "DROP NOT NULL"))
        else:  # the live copy's rows, which this load replaces: NOT NULL would check them
            name = qualified.as_string(dest)
            log.warning(
                "domain %s is NOT NULL in the source, and stays NULL-able in the destination "
                "for now: %s hold(s) NULL there (rows this load replaces with the source's); "
                "once the sync is done, run ALTER DOMAIN %s SET NOT NULL in the destination",
                name,
                ", ".join(held),
                name,
            )
    wanted = {_check_text(d) for _, d in fetch_all(source, _VALID_DOMAIN_CHECKS, (oid,))}
    have = {}
    for name, definition in qualified_rows(dest, _DOMAIN_CHECKS, dest_oid):
        have.setdefault(_check_text(definition), name)
    for definition, name in have.items():
        if definition not in wanted:
            statements.append(alter + sql.SQL("DROP CONSTRAINT {}").format(sql.Identifier(name)))
    for definition in sorted(wanted - have.keys()):
        statements.append(alter + sql.SQL("ADD {} NOT VALID").format(sql.SQL(definition)))
    return statements


# The columns ALTER DOMAIN ... SET NOT NULL checks: of the domain or of a domain over it,
# in tables (each partition is one) and materialized views.
_DOMAIN_COLUMNS = """
WITH RECURSIVE d(oid) AS (
    SELECT %s::oid
    UNION
    SELECT t.oid FROM pg_catalog.pg_type t JOIN d ON t.typbasetype = d.oid WHERE t.typtype = 'd'
)
SELECT n.nspname, c.relname, array_agg(a.attname::text ORDER BY a.attnum)
FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE a.atttypid IN (SELECT oid FROM d) AND a.attnum > 0 AND NOT a.attisdropped
  AND c.relkind IN ('r', 'm')
GROUP BY n.nspname, c.relname ORDER BY 1, 2
"""


def _nulls_in(dest: psycopg.Connection[Any], domain: int) -> list[str]:
    """The destination's columns of this domain (or one over it) that hold a NULL, as
    schema.table.column: ALTER DOMAIN ... SET NOT NULL would fail on them. One read of each
    such table (SET NOT NULL reads them all anyway); asked only when the source's domain
    became NOT NULL."""
    held = []
    for schema, table, columns in fetch_all(dest, _DOMAIN_COLUMNS, (domain,)):
        nulls = sql.SQL(", ").join(
            sql.SQL("bool_or({} IS NULL)").format(sql.Identifier(c)) for c in columns
        )
        found = fetch_all(
            dest, sql.SQL("SELECT {} FROM {}").format(nulls, sql.Identifier(schema, table))
        )[0]
        held += [
            ".".join(map(display_ident, (schema, table, column)))
            for column, null in zip(columns, found, strict=True)
            if null
        ]
    return held


def _check_text(definition: str) -> str:
    """A check's definition without the NOT VALID mark (validated or not, same rule)."""
    return definition.removesuffix(" NOT VALID")


def _check_composite(
    source: psycopg.Connection[Any],
    dest: psycopg.Connection[Any],
    oid: int,
    dest_oid: int,
    qualified: sql.Identifier,
) -> list[sql.Composable]:
    """An existing destination composite gains the attributes the source added at its end
    (the live table's values read them as NULL until the swap). Any other difference would
    change or drop values readers still see: the table fails with the fix."""
    wanted = fetch_all(source, _COMPOSITE, (oid,))
    have = qualified_rows(dest, _COMPOSITE, dest_oid)
    if wanted[: len(have)] == have:
        return [
            sql.SQL("ALTER TYPE {} ADD ATTRIBUTE {} {}").format(
                qualified, sql.Identifier(attribute), sql.SQL(type_text)
            )
            for attribute, type_text in wanted[len(have) :]
        ]
    name = qualified.as_string(dest)
    raise drop_by_hand(
        f"composite type {name} is ({_attributes(wanted)}) in the source but "
        f"({_attributes(have)}) in the destination; replicator only adds attributes at the end",
        "TYPE",
        name,
    )


def _attributes(rows: list[tuple[Any, ...]]) -> str:
    return ", ".join(f"{name} {type_text}" for name, type_text in rows)


def _composite(
    source: psycopg.Connection[Any], oid: int, qualified: sql.Identifier
) -> sql.Composed:
    fields = [
        sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(type_text))
        for name, type_text in fetch_all(source, _COMPOSITE, (oid,))
    ]
    return sql.SQL("CREATE TYPE {} AS ({})").format(qualified, sql.SQL(", ").join(fields))


def describe_types(conn: psycopg.Connection[Any], columns: Sequence[Column]) -> dict[str, Any]:
    """The enums, domains, ranges and composites behind these columns, by qualified name, as
    comparable JSON: enum labels in order, a domain's or a range's definition, a composite's
    attributes."""
    out: dict[str, Any] = {}
    used = [t for t in read_closure(conn, [(c.name, c.type_oid) for c in columns]) if t.creatable]
    if not used:
        return out
    with transaction(conn):
        execute(conn, "SET LOCAL search_path = pg_catalog, pg_temp")
        for t in used:
            if t.kind == "e":
                labels = [row[0] for row in fetch_all(conn, _ENUM_LABELS, (t.oid,))]
                out[t.qualified] = {"kind": "enum", "labels": labels}
            elif t.kind == "d":
                ident = sql.Identifier(t.schema, t.name)
                out[t.qualified] = {
                    "kind": "domain",
                    "definition": _domain(conn, t.oid, ident).as_string(conn),
                }
            elif t.kind == "r":
                definition = range_definition(conn, t.oid)
                out[t.qualified] = {"kind": "range", "definition": definition}
            else:
                attributes = [list(row) for row in fetch_all(conn, _COMPOSITE, (t.oid,))]
                out[t.qualified] = {"kind": "composite", "attributes": attributes}
    return out
