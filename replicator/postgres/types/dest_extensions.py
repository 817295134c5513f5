"""Extensions whose types a table uses (citext, hstore, ...), created in the destination by
`CREATE EXTENSION`, never by hand.

A type that belongs to an extension cannot be made with CREATE TYPE or CREATE DOMAIN: its
input and output functions are C code the extension installs. When the destination lacks
such a type, the load creates the extension in the schema the source has the type in, if
the loading role may (a superuser; or, for an extension whose default version is trusted,
a role with CREATE on the database: PostgreSQL's own rule). Otherwise the table fails
before anything is copied, with the statement a DBA should run; `check` says the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from ...base.identifiers import display_ident
from ..database import fetch_all
from .type_closure import UsedType

# The contrib modules that define data types: shipped with the server itself by
# Debian/Ubuntu (postgresql-NN), in postgresqlNN-contrib on RHEL and its kin.
CONTRIB = frozenset(
    {"citext", "cube", "earthdistance", "hstore", "isn", "lo", "ltree", "seg", "intarray"}
)

_ROLE = """
SELECT current_user, current_database(),
       (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user),
       has_database_privilege(current_database(), 'CREATE'),
       current_setting('server_version_num')::int / 10000
"""
_INSTALLED = """
SELECT n.nspname, e.extversion
FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
WHERE e.extname = %s
"""
_AVAILABLE = """
SELECT v.trusted FROM pg_catalog.pg_available_extensions a
JOIN pg_catalog.pg_available_extension_versions v
  ON v.name = a.name AND v.version = a.default_version
WHERE a.name = %s
"""
_TYPE_EXISTS = """
SELECT 1 FROM pg_catalog.pg_type t JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
WHERE n.nspname = %s AND t.typname = %s
"""


def create_extension(extension: str, schema: str) -> sql.Composed:
    return sql.SQL("CREATE EXTENSION IF NOT EXISTS {} SCHEMA {}").format(
        sql.Identifier(extension), sql.Identifier(schema)
    )


@dataclass(frozen=True)
class ExtensionNeed:
    """An extension the destination lacks for some of a table's columns: either the load
    creates it (`problem` None), or it cannot, and `problem` and `fix` say why and what a
    DBA runs."""

    extension: str
    schema: str  # where the source has the extension's types
    types: tuple[str, ...]  # the missing types, as a person writes them
    columns: tuple[str, ...]
    problem: str | None = None
    fix: str | None = None

    @property
    def statement(self) -> sql.Composed:
        return create_extension(self.extension, self.schema)

    @property
    def statement_text(self) -> str:
        """The statement as a person would type it (names quoted only where needed)."""
        return (
            f"CREATE EXTENSION IF NOT EXISTS {display_ident(self.extension)} "
            f"SCHEMA {display_ident(self.schema)}"
        )

    @property
    def lacking(self) -> str:
        """`column email has type public.citext, of extension citext, which the destination
        lacks`"""
        columns = ", ".join(map(display_ident, self.columns))
        plural = "s" if len(self.columns) > 1 else ""
        return (
            f"column{plural} {columns} use{'' if plural else 's'} type "
            f"{', '.join(self.types)} of extension {display_ident(self.extension)}, which "
            f"the destination lacks"
        )

    @property
    def error(self) -> str:
        """The table's failure, one line: what is missing, why, and the fix."""
        return f"{self.lacking}; {self.problem}; fix: {self.fix}"


def extension_needs(dest: psycopg.Connection[Any], used: Iterable[UsedType]) -> list[ExtensionNeed]:
    """Reads the destination's catalog, writes nothing: each extension some of these types
    belong to and the destination lacks, and whether the loading role may create it."""
    missing: dict[tuple[str, str], list[UsedType]] = {}
    for t in used:
        if t.extension and not fetch_all(dest, _TYPE_EXISTS, (t.schema, t.name)):
            missing.setdefault((t.extension, t.schema), []).append(t)
    if not missing:
        return []
    role = _Role(*fetch_all(dest, _ROLE)[0])
    return [_need(dest, role, ext, schema, types) for (ext, schema), types in missing.items()]


@dataclass(frozen=True)
class _Role:
    """The loading role, and what the destination server lets it do."""

    name: str
    database: str
    superuser: bool
    create_on_database: bool
    major: int

    @property
    def who(self) -> str:
        return display_ident(self.name)

    @property
    def db(self) -> str:
        return display_ident(self.database)


def _need(
    dest: psycopg.Connection[Any], role: _Role, ext: str, schema: str, types: list[UsedType]
) -> ExtensionNeed:
    columns = sorted({c for t in types for c in t.columns})
    names = tuple(f"{display_ident(t.schema)}.{display_ident(t.name)}" for t in types)
    need = ExtensionNeed(ext, schema, names, tuple(columns))
    statement = need.statement_text
    as_dba = f"as a superuser in database {role.db}: {statement}"
    installed = fetch_all(dest, _INSTALLED, (ext,))
    if installed:
        where, version = installed[0]
        if where != schema:
            return _with(
                need,
                f"extension {display_ident(ext)} is installed there in schema "
                f"{display_ident(where)}, not in {display_ident(schema)} as in the source",
                f"ALTER EXTENSION {display_ident(ext)} SET SCHEMA {display_ident(schema)} (as "
                f"its owner), then sync again",
            )
        return _with(
            need,
            f"extension {display_ident(ext)} is installed there at version {version}, "
            f"which lacks it (the source has {types[0].extension_version})",
            f"ALTER EXTENSION {display_ident(ext)} UPDATE (as its owner), then sync again",
        )
    available = fetch_all(dest, _AVAILABLE, (ext,))
    if not available:
        return _with(
            need,
            f"extension {display_ident(ext)} is not installed on the destination server "
            f"(PostgreSQL {role.major}): install {_package(ext, role.major, types[0])} there",
            f"after installing it, the next sync creates it when role {role.who} may "
            f"(superuser, or CREATE on database {role.db} for a trusted extension); else run "
            f"{as_dba}",
        )
    (trusted,) = available[0]
    if role.superuser or (trusted and role.create_on_database):
        return need
    if trusted:
        return _with(
            need,
            f"role {role.who} may not create extension {display_ident(ext)} (a trusted "
            f"extension: it needs CREATE on database {role.db})",
            f"{statement} (as a superuser or the database owner), or GRANT CREATE ON "
            f"DATABASE {role.db} TO {role.who}",
        )
    return _with(
        need,
        f"role {role.who} may not create extension {display_ident(ext)} (only a superuser "
        f"may: it is not a trusted extension)",
        f"run {as_dba}",
    )


def _with(need: ExtensionNeed, problem: str, fix: str) -> ExtensionNeed:
    return ExtensionNeed(need.extension, need.schema, need.types, need.columns, problem, fix)


def _package(ext: str, major: int, used: UsedType) -> str:
    """Which package has the extension, as far as its name tells."""
    if ext in CONTRIB:
        return (
            f"PostgreSQL's contrib modules (Debian/Ubuntu: postgresql-{major}, which has "
            f"them; RHEL: postgresql{major}-contrib)"
        )
    version = f" {used.extension_version}" if used.extension_version else ""
    return (
        f"the package that provides extension {ext}{version} for PostgreSQL {major} (on "
        f"Debian/Ubuntu usually postgresql-{major}-{ext})"
    )
