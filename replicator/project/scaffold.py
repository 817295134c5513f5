"""`replicator init DIR`: a new project with commented examples of every file."""

from __future__ import annotations

from pathlib import Path

from ..base.errors import UsageError
from .config import CONFIG_FILE

EXAMPLE_CONFIG = """\
{
  "//": "Tables to replicate, synced one by one in this order. Keys starting with // are comments.",
  "tables": [
    {
      "//": "Incremental: rows with replication_key >= the cursor are merged by primary key.",
      "name": "public.orders",
      "replication_key": "updated_at",
      "mode": "incremental-deduped",
      "//on_schema_change": "full_reload (default: reload on a source change), fail, or evolve",
      "//initial_load": "skip: the first sync copies no existing row, starts at the newest key",
      "//deletes": "delete: rows deleted in the source go here too (mark: kept, stamped)"
    },
    {
      "//": "Reloaded in full every run (small lookup tables).",
      "name": "public.countries",
      "mode": "full-refresh"
    },
    {
      "//": "Every insert, update, delete and truncate, read from a replication slot.",
      "//needs": "wal_level = logical on the source, a primary key; no replication_key",
      "name": "public.payments",
      "mode": "cdc"
    },
    {
      "//": "Quoted parts keep case and any character; destination defaults to the same name.",
      "name": "\\"Sales\\".\\"Order Lines\\"",
      "replication_key": "\\"UpdatedAt\\"",
      "primary_key": ["\\"OrderId\\"", "\\"Line\\""],
      "destination": "warehouse.order_lines"
    }
  ],
  "cdc": {
    "//": "The slot and publication of the cdc tables: named by the first sync unless set here.",
    "//slot": "replicator_pipeline",
    "//publication": "replicator_pipeline",
    "//max_retained_wal": "warn when the slot keeps more WAL than this in the source",
    "max_retained_wal": "2GB"
  },
  "//webhook": {"url": "https://hooks.example.com/replicator", "secret": "optional HMAC key"},
  "//history_days": "90: days of run history kept in the destination's _replicator.runs",
  "//metrics": {"textfile": "/var/lib/node_exporter/textfile/replicator.prom"},
  "spark": {
    "//": "local[*] by default; any spark.* setting is passed to the session.",
    "conf": {"spark.driver.memory": "2g"}
  }
}
"""

ENV_EXAMPLE = """\
# Copy to .env (never commit it). Variables set in the environment win over this file.
# libpq URIs or key=value strings; passwords live here or in ~/.pgpass, never in tables-config.json.
REPLICATOR_SOURCE_URL=postgresql://replicator@source-host:5432/app
REPLICATOR_DEST_URL=postgresql://replicator@warehouse-host:5432/warehouse
# REPLICATOR_WEBHOOK_URL=https://hooks.example.com/replicator
# REPLICATOR_WEBHOOK_SECRET=change-me
# REPLICATOR_SPARK_MASTER=spark://spark-master:7077
# The salt of `columns.hash` (a secret; long and random, `openssl rand -hex 32`; changing
# it reloads the tables that hash a column):
# REPLICATOR_HASH_SALT=change-me
"""

EXAMPLE_MODEL_PATH = "models/public/orders.sql"
EXAMPLE_MODEL = """\
-- An example: rename it to models/<schema>/<table>.sql of a table in tables-config.json, or
-- delete it (`replicator check` fails on a model that no table of the config reads).
-- The SELECT that public.orders' sync reads (Jinja SQL). Without this file every column is read.
-- The engine wraps it with the cursor predicate; keep the primary key and replication key.
-- Available: {{ source }} (the quoted source table), {{ columns }} (its quoted columns),
-- quote('Any Name') to quote an identifier, and every macro by name.
SELECT {{ columns | join(", ") }}
FROM {{ source }}
"""

MACROS_README = """\
# macros/

Built-in macros ship inside replicator (`replicator/macros/*.sql`):

- `default_model(source, columns)`: the SELECT of a table without a model file.
- `merge_deduped(target, staging, columns, key_columns, update_columns, replication_key,
  unique_keys)`: incremental-deduped merge (one row per key from the batch unless
  `unique_keys` says it cannot hold a key twice; only changed rows rewritten).
- `merge_append(target, staging, columns, key_columns)`: incremental-append insert of keys
  the destination does not hold yet.

Define a macro with the same name in any `.sql` file here and it replaces the built-in
everywhere, including inside other macros. Arguments arrive already quoted; a macro may
declare fewer arguments than the built-in (it gets only those it names).
`replicator compile` shows the SQL that results.
"""

GITIGNORE = """\
.env
.venv/
sync-state/.lock
sync-state/.*.tmp-*
"""


def init_project(directory: Path) -> list[Path]:
    """Write the scaffold; refuse to overwrite an existing project."""
    if (directory / CONFIG_FILE).exists():
        raise UsageError(f"{directory / CONFIG_FILE} already exists: not overwriting a project")
    files = {
        CONFIG_FILE: EXAMPLE_CONFIG,
        ".env.example": ENV_EXAMPLE,
        EXAMPLE_MODEL_PATH: EXAMPLE_MODEL,
        "macros/README.md": MACROS_README,
        "sync-state/.gitkeep": "",
        ".gitignore": GITIGNORE,
    }
    written = []
    for relative, text in files.items():
        path = directory / relative
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def next_steps(directory: Path, written: list[Path]) -> str:
    """What to do after `init`: the example model is public.orders', and `check` fails on a
    model of no table once the example tables are replaced."""
    model = directory / EXAMPLE_MODEL_PATH
    example = (
        f"rename or delete the example model {model} (a model of no table fails `check`), "
        if model in written
        else ""
    )
    return (
        f"next: edit {directory / CONFIG_FILE}, {example}copy .env.example to .env, "
        f"then run `replicator check --project-dir {directory}`"
    )
