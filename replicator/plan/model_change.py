"""How a table's model changed since its copy was loaded: its SQL, its shaping (`columns`,
`where`), or the child tables that make the built-in model read it alone. Each reloads the
copy (plan/decide.py), since rows the old model left out would never arrive otherwise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .salt import shown
from .schema_diff import Change
from .signature import DEFAULT_MODEL, DEFAULT_MODEL_ALONE, Signature


@dataclass(frozen=True)
class ModelChanged(Change):
    """The model reads other rows or values than the one the copy was loaded with: the copy
    is reloaded (rows a narrower filter left out would never arrive by the cursor)."""

    kind: ClassVar[str] = "model changed"
    old_origin: str | None
    new_origin: str | None

    def detail(self) -> str:
        old, new = self.old_origin or "the model", self.new_origin or "the model"
        if old == new:
            return f"{new}: its SQL reads other rows or values than at the last load"
        return f"{old} -> {new}"


@dataclass(frozen=True)
class ChildTablesChanged(Change):
    """The table gained its first child table (INHERITS), or lost its last: the built-in
    model reads it alone (`FROM ONLY`) while it has any, so the copy is reloaded (one made
    before the table was read alone may hold its children's rows)."""

    kind: ClassVar[str] = "model changed"
    alone: bool

    def detail(self) -> str:
        if self.alone:
            return (
                "the table has child tables (INHERITS), and is now read alone (FROM ONLY, "
                "as pg_dump copies it): their rows are not in this copy; list them as tables "
                "of their own to copy them"
            )
        return "the table has no child tables any more, and is read as a whole"


@dataclass(frozen=True)
class ShapingChanged(Change):
    """`tables[].columns` or `where` changed (or the hash salt): the copy holds other
    columns, values or rows than the config asks for now, so it is reloaded."""

    kind: ClassVar[str] = "columns or where changed"
    old: str | None
    new: str | None

    def detail(self) -> str:
        old, new = shown(self.old), shown(self.new)
        if old == new:  # only the fingerprint differs, which messages do not show
            return f"{old}: the hash salt (REPLICATOR_HASH_SALT) changed"
        return f"{old or 'nothing shaped'} -> {new or 'nothing shaped'}"


def model_change(
    old: Signature, new: Signature
) -> ModelChanged | ChildTablesChanged | ShapingChanged | None:
    """The model's change since the copy was loaded (its shaping first); None when it is the
    same in canonical form, or when the old signature predates model fingerprints."""
    if old.shaping != new.shaping:
        return ShapingChanged(old.shaping, new.shaping)
    if old.model is None or new.model is None or old.model == new.model:
        return None
    if {old.model, new.model} == {DEFAULT_MODEL, DEFAULT_MODEL_ALONE}:
        return ChildTablesChanged(new.model != DEFAULT_MODEL)
    return ModelChanged(old.model_origin, new.model_origin)
