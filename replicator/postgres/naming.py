"""Names the tool derives for its own objects (staging tables) from any source identifier.

Derived names must never collide or be truncated into each other at PostgreSQL's 63-byte
limit: each carries a hash of the full target name and a readable, byte-safe prefix of it.
"""

from __future__ import annotations

import hashlib

from ..base.identifiers import INTERNAL_SCHEMA, MAX_IDENTIFIER_BYTES, TableName

# The bookkeeping tables in `_replicator`: a load's finished partitions (so a retried task
# loads its rows once), the destination tables replicator owns, the full loads a killed
# run left to resume (sync/full_load/resume.py), and the history of runs (report/history.py).
MARKER_TABLE = TableName(INTERNAL_SCHEMA, "loaded_partitions")
OWNED_TABLE = TableName(INTERNAL_SCHEMA, "owned_tables")
RESUME_TABLE = TableName(INTERNAL_SCHEMA, "resumable_loads")
RUNS_TABLE = TableName(INTERNAL_SCHEMA, "runs")
# The one metadata column, last in a `deletes: "mark"` table: when the source row vanished.
MARK_COLUMN = "_replicator_deleted_at"
MARK_TYPE = "timestamp with time zone"


def _truncate_bytes(text: str, limit: int) -> str:
    encoded = text.encode()[:limit]
    return encoded.decode(errors="ignore")


def derived_name(kind: str, target: TableName) -> str:
    """`<kind>_<hash>_<readable target>`, at most 63 bytes, unique per (kind, target)."""
    digest = hashlib.sha256(f"{target.schema}\0{target.name}".encode()).hexdigest()[:10]
    head = f"{kind}_{digest}_"
    room = MAX_IDENTIFIER_BYTES - len(head.encode())
    return head + _truncate_bytes(f"{target.schema}.{target.name}", room)


def staging_table(target: TableName) -> TableName:
    """The UNLOGGED table a batch for `target` is staged in before the merge."""
    return TableName(INTERNAL_SCHEMA, derived_name("stg", target))


# At most this many staging tables per batch: a big batch copied in this process is staged
# and merged in parts (sync/incremental/merge_pipeline.py).
MAX_STAGING_PARTS = 4


def staging_tables(target: TableName, parts: int = MAX_STAGING_PARTS) -> list[TableName]:
    """The staging tables of a batch in `parts` parts; the first is `staging_table`."""
    more = [derived_name(f"stg{k}", target) for k in range(1, parts)]
    return [staging_table(target), *(TableName(INTERNAL_SCHEMA, name) for name in more)]


def retired_table(target: TableName) -> TableName:
    """Where the swap puts the replaced table, beside the new one, until it is dropped after
    the commit (freeing a big table's files must not happen while readers wait)."""
    return TableName(target.schema, derived_name("old", target))


def retired_key_name(target: TableName) -> str:
    """The replaced table's primary key, renamed so the new table can take its name."""
    return derived_name("oldkey", target)


def default_key_name(target: TableName, number: int = 0) -> str:
    """PostgreSQL's own name for the table's primary key (makeObjectName): the table name cut
    at a character boundary so `_pkey` still fits in 63 bytes; `number` > 0 gives the
    `_pkey1`, `_pkey2`... it falls back to when that name is taken in the schema."""
    label = f"pkey{number}" if number else "pkey"
    room = MAX_IDENTIFIER_BYTES - len(label) - 1
    return f"{_truncate_bytes(target.name, room)}_{label}"
