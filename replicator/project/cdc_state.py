"""The project's log-capture names in sync-state (`sync-state/cdc.json`): which replication
slot and publication its `cdc` tables read, so a copy of the folder on another host continues
from the same slot instead of making a new one (and leaving the old one to fill the disk).

Written like a table's state (temp file, fsync, rename); a file that cannot be trusted is an
error naming it. Table state files are always named `<schema>.<table>.json`, with a dot in
the stem, so `cdc.json` never collides with one.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..base.errors import StateError
from .config import CdcConfig, TableConfig
from .state import FORMAT_VERSION, LSN_CURSOR_TYPE, TableState, read_state_file, write_atomically

FILE_NAME = "cdc.json"


class CaptureState(BaseModel):
    """Slot and publication names; `created`: the tool made them (and `cdc drop` may
    remove them); `tables`: the `cdc` tables of the config when the slot was last read
    (None: not recorded yet). The slot moves on without a table left out of the config, so
    one that comes back has missed changes (sync/cdc/cdc_run.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: int = FORMAT_VERSION
    slot: str
    publication: str
    created: bool
    tables: tuple[str, ...] | None = None
    # How the tool's publication lists each shaped table (cdc/source/log_filter.py): its
    # column list and row filter as last given, to list it again when they change.
    listings: dict[str, str] = Field(default_factory=dict)


REJOINED = (
    "back among the cdc tables: the slot moved on while it was out of the config, so its "
    "changes meanwhile were never applied"
)


def rejoin_mark(
    stored: CaptureState | None, table: TableConfig, state: TableState | None
) -> TableState | None:
    """The table's state marked for a reload when it is back among the config's `cdc`
    tables since the slot was last read (the slot moved on without it); None when it is
    not, or was never loaded. `sync` writes it; `status` and `compile` show it."""
    if stored is None or stored.tables is None or str(table.name) in stored.tables:
        return None
    if table.mode != "cdc" or state is None or state.cursor is None:
        return None
    if state.cursor.type != LSN_CURSOR_TYPE:  # just switched to cdc: it loads anyway
        return None
    return state.model_copy(update={"pending_full_reload": True, "pending_reason": REJOINED})


def capture_path(state_dir: Path) -> Path:
    return state_dir / FILE_NAME


def read_capture_state(state_dir: Path) -> CaptureState | None:
    path = capture_path(state_dir)
    fix = (
        "restore it from a copy, or delete it (the next sync then creates a new slot and "
        "reloads every cdc table; drop the old slot with `replicator cdc drop` first)"
    )
    raw = read_state_file(path)
    if raw is None:
        return None
    try:
        return CaptureState.model_validate(json.loads(raw.decode("utf-8")))
    except (UnicodeDecodeError, json.JSONDecodeError, ValidationError) as exc:
        detail = str(exc).splitlines()[0]
        raise StateError(f"{path}: corrupt sync-state file ({detail}); {fix}") from None


def write_capture_state(state_dir: Path, state: CaptureState) -> None:
    text = json.dumps(state.model_dump(mode="json"), indent=2) + "\n"
    write_atomically(state_dir, capture_path(state_dir), text)


def forget_capture_state(state_dir: Path) -> bool:
    try:
        capture_path(state_dir).unlink()
    except FileNotFoundError:
        return False
    return True


def resolve_names(config: CdcConfig | None, stored: CaptureState | None) -> CaptureState:
    """The names to use: the config's when it names them, else the stored ones, else new
    ones (`replicator_<random>`: a project copied to another directory keeps its file, so
    two unrelated projects on one source never share a slot)."""
    config = config or CdcConfig()
    suffix = secrets.token_hex(4)
    slot = config.slot or (stored.slot if stored else f"replicator_{suffix}")
    publication = config.publication or (stored.publication if stored else f"replicator_{suffix}")
    created = config.create if stored is None else (stored.created and config.create)
    tables = stored.tables if stored else None
    # How each table was listed in the publication: kept while it is the same publication
    # (else every run would list a shaped table again, as if its `columns` had changed).
    same = stored is not None and stored.publication == publication
    listings = stored.listings if same and stored is not None else {}
    return CaptureState(
        slot=slot, publication=publication, created=created, tables=tables, listings=listings
    )
