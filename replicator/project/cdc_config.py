"""The config of `mode: "cdc"` tables: what a table may not set with it, and the top-level
`cdc` object (slot and publication names)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator

from .config_values import checked_size, size_bytes

DEFAULT_MAX_RETAINED_WAL = "2GB"


def check_cdc_table(values: Mapping[str, Any]) -> str | None:
    """What a `cdc` table (its keys as written) sets in vain: a cursor, its lookback or a
    delete check would have nothing to do (all named at once). `initial_load: "skip"`
    applies: the copy starts at the slot's position (sync/cdc/adopt_at_slot.py)."""
    wrong = [
        key
        for key, given in (
            ("replication_key", values.get("replication_key") is not None),
            ("lookback", "lookback" in values),
            ("deletes", values.get("deletes", "ignore") != "ignore"),
            ("deletes_interval", values.get("deletes_interval", 0) != 0),
        )
        if given
    ]
    if not wrong:
        return None
    keys = ", ".join(f'"{key}"' for key in wrong)
    return (
        f'{keys} {"does" if len(wrong) == 1 else "do"} not apply to mode "cdc" (every '
        "insert, update, delete and truncate comes from the log): remove "
        f"{'it' if len(wrong) == 1 else 'them'}, or choose another mode"
    )


def _slot_name(value: str) -> str:
    """PostgreSQL's rule for replication slot names (lower-case letters, digits, `_`)."""
    allowed = "abcdefghijklmnopqrstuvwxyz0123456789_"
    if not value or len(value) > 63 or any(c not in allowed for c in value):
        raise ValueError(
            "a replication slot name is 1 to 63 lower-case letters, digits or underscores"
        )
    return value


def _publication_name(value: str) -> str:
    if not value or len(value.encode()) > 63:
        raise ValueError("a publication name is 1 to 63 bytes")
    return value


class CdcConfig(BaseModel):
    """The replication slot and publication of the project's `cdc` tables. Without names,
    the tool picks them once and keeps them in sync-state; `create: false` uses ones a DBA
    made (the tool then never creates, alters or drops them)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    slot: Annotated[str, AfterValidator(_slot_name)] | None = None
    publication: Annotated[str, AfterValidator(_publication_name)] | None = None
    create: bool = True
    # Past it (pg_current_wal_lsn() - restart_lsn), every run warns: the source keeps that
    # WAL until the slot is read, and an abandoned slot fills its disk.
    max_retained_wal: Annotated[str, AfterValidator(checked_size)] = DEFAULT_MAX_RETAINED_WAL

    @property
    def max_retained_bytes(self) -> int:
        return size_bytes(self.max_retained_wal)

    @model_validator(mode="after")
    def _named_when_not_created(self) -> CdcConfig:
        if not self.create and (self.slot is None or self.publication is None):
            raise ValueError(
                '"create": false uses a slot and a publication a DBA made: name both '
                '("slot" and "publication")'
            )
        return self


def retained_limit(cdc: CdcConfig | None) -> tuple[int, str]:
    """`cdc.max_retained_wal` in bytes and as written (the default without a `cdc` object)."""
    written = cdc.max_retained_wal if cdc is not None else DEFAULT_MAX_RETAINED_WAL
    return size_bytes(written), written
