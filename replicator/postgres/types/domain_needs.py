"""What a domain's default and checks call that PostgreSQL does not ship: functions and
sequences of the user's own (an extension's come with its CREATE EXTENSION). A domain made
in the destination with them fails there with "function ... does not exist", naming neither
the domain nor the fix; so each one the destination lacks is said first, with the domain
that needs it."""

from __future__ import annotations

from typing import Any

import psycopg

from ...base.errors import TableProblem
from ..database import fetch_all

# The functions and sequences the domain's default (recorded on the type) and its checks
# (recorded on their constraints) depend on, outside pg_catalog: printed qualified (the
# caller's search_path is pg_catalog), as to_regprocedure and to_regclass read them back.
_NEEDS = """
SELECT DISTINCT CASE d.refclassid WHEN 'pg_catalog.pg_proc'::pg_catalog.regclass
                    THEN 'function' ELSE 'sequence' END,
       CASE d.refclassid WHEN 'pg_catalog.pg_proc'::pg_catalog.regclass
                    THEN d.refobjid::pg_catalog.regprocedure::text
                    ELSE d.refobjid::pg_catalog.regclass::text END
FROM pg_catalog.pg_depend d
WHERE ((d.classid = 'pg_catalog.pg_type'::pg_catalog.regclass AND d.objid = %(oid)s)
    OR (d.classid = 'pg_catalog.pg_constraint'::pg_catalog.regclass
        AND d.objid IN (SELECT c.oid FROM pg_catalog.pg_constraint c WHERE c.contypid = %(oid)s)))
  AND (d.refclassid = 'pg_catalog.pg_proc'::pg_catalog.regclass
       AND (SELECT p.pronamespace FROM pg_catalog.pg_proc p WHERE p.oid = d.refobjid)
           <> 'pg_catalog'::pg_catalog.regnamespace
    OR d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass
       AND (SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid = d.refobjid) = 'S')
  AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend x  -- an extension's: it comes with it
                  WHERE x.classid = d.refclassid AND x.objid = d.refobjid AND x.deptype = 'e')
ORDER BY 1, 2
"""
_MISSING = (
    "SELECT name FROM unnest(%s::text[], %s::text[]) AS n(kind, name) "
    "WHERE CASE kind WHEN 'function' THEN pg_catalog.to_regprocedure(name) IS NULL "
    "ELSE pg_catalog.to_regclass(name) IS NULL END"
)


def check_domain_needs(
    source: psycopg.Connection[Any], dest: psycopg.Connection[Any], oid: int, name: str
) -> None:
    """TableProblem naming the functions and sequences domain `name` (source `oid`) uses
    that the destination lacks."""
    needs = fetch_all(source, _NEEDS, {"oid": oid})
    if not needs:
        return
    kinds, names = [n[0] for n in needs], [n[1] for n in needs]
    missing = [row[0] for row in fetch_all(dest, _MISSING, (kinds, names))]
    if missing:
        kind = dict(zip(names, kinds, strict=True))
        listed = ", ".join(f"{kind[m]} {m}" for m in missing)
        raise TableProblem(
            f"domain {name}'s default or checks use {listed}, which the destination lacks: "
            "create them there (the same definitions as in the source), then sync again"
        )
