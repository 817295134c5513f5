"""Which project this is (`sync-state/.project`, JSON): the id that says whose a destination
copy is, so that a second project pointed at the same destination does not take another's
copies over as `no state` (and the first then reload them all).

The id lives in sync-state, so it travels with the state: a copy of the folder on another
host is the same project, a fresh clone with an empty sync-state another. A sync (or an
`adopt`) makes it on its first run; every connection to the destination carries it as a
session setting (`replicator.project`, libpq's `options`), so the statement that records a
copy as the tool's records whose it is (postgres/ownership.py) without the id passing
through every layer in between. Written like a table's state (temp file, fsync, rename); a
file that cannot be trusted is an error naming it. A dot file, beside `.lock`: what reads
`sync-state/*.json` finds the tables' states (and `cdc.json`) only.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from ..base.errors import StateError
from .state import FORMAT_VERSION, read_state_file, write_atomically

FILE_NAME = ".project"
PROJECT_SETTING = "replicator.project"


class ProjectIdentity(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: int = FORMAT_VERSION
    id: str


def read_identity(state_dir: Path) -> str | None:
    """The project's id; None before its first sync."""
    path = state_dir / FILE_NAME
    raw = read_state_file(path)
    if raw is None:
        return None
    try:
        return ProjectIdentity.model_validate(json.loads(raw)).id
    except (ValueError, ValidationError):
        raise StateError(
            f"{path}: corrupt project identity (it says which destination copies are this "
            "project's); restore it from a copy of this sync-state folder, or delete it: the "
            "project then gets a new one, and `replicator adopt` hands its copies back to it"
        ) from None


def ensure_identity(state_dir: Path) -> str:
    """The project's id, made now when it has none."""
    found = read_identity(state_dir)
    if found is not None:
        return found
    made = ProjectIdentity(id=uuid.uuid4().hex)
    write_atomically(state_dir, state_dir / FILE_NAME, made.model_dump_json(indent=2) + "\n")
    return made.id
