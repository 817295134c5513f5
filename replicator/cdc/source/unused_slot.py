"""A slot no table uses: every `cdc` table left the config (or a `cdc` pattern matches no
table now), so no run reads the slot, and it keeps the source's WAL until it is dropped.
`sync` (in the log and the webhook), `check` and `status` say so on every run, with the
fix; the metrics keep its retained WAL."""

from __future__ import annotations

from typing import Any

import psycopg

from ...base.errors import StateError
from ...project.project import Project


def unused_slot(source: psycopg.Connection[Any], project: Project) -> tuple[str, str] | None:
    """What to say of the project's slot when no table of the config has mode cdc, and the
    fix (None: some table does, or the project has no slot)."""
    if project.cdc_tables:
        return None
    try:
        names = project.capture_names()
    except StateError:  # cdc.json cannot be read: nothing to say of a slot
        return None
    if names is None:
        return None
    # the slot's modules, once the project has one: a project that never had one (a cron
    # run of cursor tables) loads none of the log's
    from .slot import drop_slot_statement, slot_info
    from .slot_health import size_text

    info = slot_info(source, names.slot)
    if info is None:
        return None
    fix = (
        "`replicator cdc drop` drops it and the publication"
        if names.created
        else f"its DBA drops it ({drop_slot_statement(names.slot)})"
    )
    problem = (
        f"replication slot {names.slot} serves no table (no table of tables-config.json has "
        f"mode cdc now) and keeps {size_text(info.retained_bytes)} of WAL in the source until "
        "dropped"
    )
    return problem, f"{fix}; a cdc table added back reloads"
