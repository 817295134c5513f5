"""Views that depend on a destination table, and whether a reload can carry them across.

A full reload's swap drops each dependent view (materialized ones too) and recreates it on
the new table, with its owner, grants and comments (swap.py). For a view another role owns
in a schema of its own, the loading role needs USAGE and CREATE on that schema and
membership in the owner's role, and the owner needs CREATE on the schema to own the
recreated view. Without them the swap would fail with a bare "permission denied for schema
..."; this module finds that before a load copies anything (and for `check`), naming each
view, its owner and what is lacking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from ..base.identifiers import TableName, display_ident
from .database import fetch_all

DEPENDENTS = """
WITH RECURSIVE deps(oid, depth) AS (
    SELECT r.ev_class, 1
    FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_rewrite r ON r.oid = d.objid
    WHERE d.classid = 'pg_catalog.pg_rewrite'::regclass
      AND d.refclassid = 'pg_catalog.pg_class'::regclass
      AND d.refobjid = %(oid)s AND r.ev_class <> %(oid)s
  UNION ALL
    SELECT r.ev_class, deps.depth + 1
    FROM deps
    JOIN pg_catalog.pg_depend d ON d.refobjid = deps.oid
     AND d.classid = 'pg_catalog.pg_rewrite'::regclass
     AND d.refclassid = 'pg_catalog.pg_class'::regclass
    JOIN pg_catalog.pg_rewrite r ON r.oid = d.objid
    WHERE r.ev_class <> deps.oid AND deps.depth < 64
)
SELECT c.oid, n.nspname, c.relname, c.relkind, pg_catalog.pg_get_userbyid(c.relowner),
       pg_catalog.has_schema_privilege(n.oid, 'USAGE'),
       pg_catalog.has_schema_privilege(n.oid, 'CREATE'),
       pg_catalog.pg_has_role(c.relowner, 'USAGE'),
       pg_catalog.has_schema_privilege(c.relowner, n.oid, 'CREATE'),
       (SELECT r.rolsuper FROM pg_catalog.pg_roles r WHERE r.oid = c.relowner),
       max(deps.depth)
FROM deps JOIN pg_catalog.pg_class c ON c.oid = deps.oid
JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
GROUP BY c.oid, n.oid, n.nspname, c.relname, c.relkind, c.relowner
ORDER BY max(deps.depth), c.oid
"""


@dataclass(frozen=True)
class Dependent:
    """A view (or materialized view) built on the table, directly or through other views."""

    oid: int
    name: TableName
    kind: str  # pg_class.relkind: "v" view, "m" materialized view
    owner: str
    has_usage: bool  # the loading role's USAGE on the view's schema
    has_create: bool  # ... its CREATE there
    is_owner: bool  # the loading role owns the view or inherits its owner's privileges
    owner_may_create: bool  # the owner's CREATE on the schema
    owner_is_superuser: bool = False  # membership in it would make the loading role one

    def lacks(self) -> list[str]:
        """What the loading role lacks to drop the view and create it again."""
        schema = display_ident(self.name.schema)
        missing = [
            f"{privilege} on schema {schema}"
            for privilege, held in (("USAGE", self.has_usage), ("CREATE", self.has_create))
            if not held
        ]
        if not self.is_owner:
            missing.append(f"membership in role {display_ident(self.owner)}")
        return missing


def dependents(dest: psycopg.Connection[Any], oid: int) -> list[Dependent]:
    """Every view on the table, shallowest first (the order they are recreated in)."""
    return [
        Dependent(row[0], TableName(row[1], row[2]), *row[3:10])
        for row in fetch_all(dest, DEPENDENTS, {"oid": oid})
    ]


def reload_problem(dest: psycopg.Connection[Any], target: TableName) -> tuple[str, str] | None:
    """`reload_blockers` for the destination table as it is now (None when it is missing)."""
    (oid, role) = fetch_all(dest, "SELECT to_regclass(%s)::oid, current_user", (target.sql(),))[0]
    return None if oid is None else reload_blockers(dependents(dest, oid), target, role)


def reload_blockers(views: list[Dependent], target: TableName, role: str) -> tuple[str, str] | None:
    """Why a reload of `target` could not carry its dependent views across, and the fix;
    None when it can."""
    problems, fixes = [], []
    for view in views:
        described = f"{_kind(view)} {view.name} (owner {display_ident(view.owner)})"
        lacks = view.lacks()
        if lacks and view.owner_is_superuser and not view.is_owner:
            problems.append(
                f"{described} depends on {target}: a reload recreates it, which role "
                f"{display_ident(role)} cannot do: it lacks {', '.join(lacks)}; "
                f"{display_ident(view.owner)} is a superuser role, and membership in it "
                f"would make {display_ident(role)} a superuser, so replicator never asks for it"
            )
            fixes.append(_new_owner(view, role))
        elif lacks:
            problems.append(
                f"{described} depends on {target}: a reload recreates it, which role "
                f"{display_ident(role)} cannot do: it lacks {', '.join(lacks)}"
            )
            fixes.append(_grants(view, role))
        if not view.owner_may_create:
            problems.append(
                f"{described}: its owner lacks CREATE on schema "
                f"{display_ident(view.name.schema)}, which owning the recreated view needs"
            )
            fixes.append(
                _grant(("CREATE",), view.name.schema, view.owner) + " (as an administrator)"
            )
    if not problems:
        return None
    fix = "; ".join(fixes) + (
        ", or drop the views before the reload and create them again after it"
    )
    return "; ".join(problems), fix


def _kind(view: Dependent) -> str:
    return "view" if view.kind == "v" else "materialized view"


def _grants(view: Dependent, role: str) -> str:
    """The statements that give `role` what it lacks (printed as a hint: identifiers are
    quoted where they need it)."""
    statements = []
    privileges = tuple(
        p for p, held in (("USAGE", view.has_usage), ("CREATE", view.has_create)) if not held
    )
    if privileges:
        statements.append(_grant(privileges, view.name.schema, role))
    if not view.is_owner:
        statements.append(f"GRANT {display_ident(view.owner)} TO {display_ident(role)}")
    return "; ".join(statements) + " (as an administrator)"


def _new_owner(view: Dependent, role: str) -> str:
    """For a view a superuser owns: hand it to the loading role (it then reads its tables
    with that role's privileges), instead of making the loading role a superuser."""
    statements = [f"ALTER {_kind(view).upper()} {view.name} OWNER TO {display_ident(role)}"]
    privileges = tuple(
        p for p, held in (("USAGE", view.has_usage), ("CREATE", view.has_create)) if not held
    )
    if privileges:
        statements.append(_grant(privileges, view.name.schema, role))
    return (
        "; ".join(statements) + f" (as {display_ident(view.owner)} or another superuser; the "
        f"view then reads its tables with {display_ident(role)}'s privileges)"
    )


def _grant(privileges: tuple[str, ...], schema: str, role: str) -> str:
    return (
        f"GRANT {', '.join(privileges)} ON SCHEMA {display_ident(schema)} TO {display_ident(role)}"
    )
