"""A table's schema signature: what its destination table was built from.

Stored in sync-state at every load; every run compares it with the source (schema drift) and
with the destination table (someone altered or dropped it). It holds the model's columns in
order (the source's column numbers, when the model reads the table as is, so a rename is told
apart from a drop and an add), the primary key, the replication key, the enum, domain and
composite types the columns use, the source table's OID (a recreated table is a change), a
hash of the model's SQL in canonical form (a model whose meaning changed, say a filter
widened, reloads the table: the rows the old model left out would never arrive otherwise),
and for a partitioned table its leaf partitions (plan/partition_change.py says why).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg

from ..postgres.catalog import TableInfo
from ..postgres.partition_tree import PARTITIONED, leaves
from ..postgres.types.dest_types import describe_types
from ..project.templates import Model, canonical_sql
from .table_sql import TableSql

VERSION = 2
# The model fingerprint of the built-in default model (a plain SELECT of the table's
# columns): its text follows the columns, which the signature compares one by one.
DEFAULT_MODEL = "default"
# ... of the built-in model reading a table with child tables alone (`FROM ONLY`).
DEFAULT_MODEL_ALONE = "default only"


@dataclass(frozen=True)
class SignedColumn:
    name: str
    type: str
    not_null: bool
    attnum: int | None = None  # None: compared by name only


@dataclass(frozen=True)
class SignedLeaf:
    """A leaf partition as the copy last saw it (postgres/partition_tree.Leaf)."""

    schema: str
    name: str
    oid: int
    attached: str
    storage: int

    def as_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "name": self.name,
            "oid": self.oid,
            "attached": self.attached,
            "storage": self.storage,
        }


@dataclass(frozen=True)
class Signature:
    table_oid: int | None
    columns: tuple[SignedColumn, ...]
    primary_key: tuple[str, ...]
    replication_key: str | None
    types: dict[str, Any] = field(default_factory=dict)
    # DEFAULT_MODEL, or the SHA-256 of the model's canonical SQL; None: not recorded (a
    # state written before models were fingerprinted, or the destination's side).
    model: str | None = None
    model_origin: str | None = None  # the file (or macro) the model came from
    # What `columns` and `where` do to the model's rows (plan/shaping.py); None: nothing.
    shaping: str | None = None
    # A partitioned table's leaves; None for any other table (and in a state written before
    # leaves were recorded: never a change).
    partitions: tuple[SignedLeaf, ...] | None = None
    # An ordinary table's relfilenode and each column's pg_attribute xmin (catalog.TableInfo):
    # a rewrite that came with a column's catalog row rewritten its values in place; None:
    # not a table, the destination's side, or a state written before they were recorded.
    storage: int | None = None
    column_versions: tuple[tuple[str, str], ...] | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "table_oid": self.table_oid,
            "columns": [
                {"attnum": c.attnum, "name": c.name, "type": c.type, "not_null": c.not_null}
                for c in self.columns
            ],
            "primary_key": list(self.primary_key),
            "replication_key": self.replication_key,
            "types": self.types,
            "model": self.model,
            "model_origin": self.model_origin,
            "shaping": self.shaping,
            **(
                {"partitions": [leaf.as_json() for leaf in self.partitions]}
                if self.partitions is not None
                else {}
            ),
            **({"storage": self.storage} if self.storage is not None else {}),
            **(
                {"column_versions": [list(pair) for pair in self.column_versions]}
                if self.column_versions is not None
                else {}
            ),
        }

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> Signature:
        """Read a stored signature, including the first format (columns as lists)."""
        columns = []
        for entry in document.get("columns") or []:
            if isinstance(entry, list):  # format 1: [name, type, not_null]
                columns.append(SignedColumn(str(entry[0]), str(entry[1]), bool(entry[2])))
            else:
                columns.append(
                    SignedColumn(
                        str(entry["name"]),
                        str(entry["type"]),
                        bool(entry["not_null"]),
                        entry.get("attnum"),
                    )
                )
        return cls(
            table_oid=document.get("table_oid"),
            columns=tuple(columns),
            primary_key=tuple(document.get("primary_key") or ()),
            replication_key=document.get("replication_key"),
            types=dict(document.get("types") or {}),
            model=document.get("model"),
            model_origin=document.get("model_origin"),
            shaping=document.get("shaping"),
            partitions=(
                tuple(SignedLeaf(**leaf) for leaf in document["partitions"])
                if document.get("partitions") is not None
                else None
            ),
            storage=document.get("storage"),
            column_versions=(
                tuple((str(n), str(x)) for n, x in document["column_versions"])
                if document.get("column_versions") is not None
                else None
            ),
        )

    def as_created(self) -> Signature:
        """What the destination table built from this signature looks like in the catalog:
        primary-key columns are NOT NULL; no column numbers, OID or types to compare."""
        key = set(self.primary_key)
        columns = tuple(
            SignedColumn(c.name, c.type, c.not_null or c.name in key) for c in self.columns
        )
        return replace(
            self,
            table_oid=None,
            columns=columns,
            replication_key=None,
            types={},
            model=None,
            model_origin=None,
            shaping=None,
            partitions=None,
            storage=None,
            column_versions=None,
        )

    def without_column(self, name: str) -> Signature:
        return replace(self, columns=tuple(c for c in self.columns if c.name != name))


def read_signature(conn: psycopg.Connection[Any], source: TableInfo, built: TableSql) -> Signature:
    """The signature of the table as the source describes it now."""
    as_is = built.model.reads_table_as_is
    columns = tuple(
        SignedColumn(
            c.name, c.declared_type(), c.not_null, c.attnum if as_is and c.attnum else None
        )
        for c in built.columns
    )
    return Signature(
        table_oid=source.oid,
        columns=columns,
        primary_key=built.primary_key,
        replication_key=built.table.replication_key,
        types=describe_types(conn, built.columns),
        model=_alone(model_fingerprint(built.model.base or built.model), source),
        model_origin=built.model.origin,
        shaping=built.model.shaping,
        partitions=_signed_leaves(conn, source),
        storage=source.storage,
        column_versions=source.column_versions,
    )


def _signed_leaves(
    conn: psycopg.Connection[Any], source: TableInfo
) -> tuple[SignedLeaf, ...] | None:
    if source.kind != PARTITIONED:
        return None
    return tuple(
        SignedLeaf(leaf.name.schema, leaf.name.name, leaf.oid, leaf.attached, leaf.storage)
        for leaf in leaves(conn, source.oid)
    )


def _alone(fingerprint: str, source: TableInfo) -> str:
    """The built-in model reads `ONLY t` while t has child tables (its text is not hashed):
    that is another model than `t` with its children's rows, so a copy made before t had
    children reloads once when they come."""
    return (
        DEFAULT_MODEL_ALONE if fingerprint == DEFAULT_MODEL and source.has_children else fingerprint
    )


def model_fingerprint(model: Model) -> str:
    """DEFAULT_MODEL for the built-in default model, else the hash of the model's canonical
    SQL: whitespace, comments and the case of keywords do not change it."""
    if model.reads_table_as_is:
        return DEFAULT_MODEL
    return hashlib.sha256(canonical_sql(model.sql).encode()).hexdigest()


def destination_signature(table: TableInfo) -> Signature:
    """The destination table as it is, in the form `Signature.as_created` gives."""
    return Signature(
        table_oid=None,
        columns=tuple(SignedColumn(c.name, c.declared_type(), c.not_null) for c in table.columns),
        primary_key=table.primary_key,
        replication_key=None,
    )
