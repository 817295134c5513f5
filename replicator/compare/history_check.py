"""`verify` of a history table (`tables[].history`): are its current versions the copy's rows,
and do each key's versions follow one another?

The copy is compared with the source first (verify_table.py); the history table is then
compared with the copy, in one snapshot of the destination, where both are written in the
same transactions: so its current versions equal the source's rows exactly when the copy
does and they equal the copy. What is counted, by key:
- `missing`: a row of the copy without a current version;
- `extra`: a current version of a key the copy does not hold;
- `different`: a current version whose row is not the copy's;
- `two_current`: a key with more than one current version;
- `overlapping`: a version that ends after the next one begins, or never ends though a later
  one exists, or whose `_is_current` says otherwise than its `_valid_to`.

`--repair` closes and opens versions and never deletes one: each version ends where the
next begins, a current version of a key the copy lacks ends now, one that differs ends now
and the copy's row begins a version from now, and a row without a version gets one from now
(`_op` `snapshot`). "Now" is the source's clock, which every version's time is on.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from ..postgres.database import execute, transaction
from ..postgres.history_tables import (
    HistoryTable,
    key_match,
    row_text,
)

_KINDS = ("missing", "extra", "different", "two_current", "overlapping")


@dataclass(frozen=True)
class HistoryFindings:
    """What the check of one history table found, and what its repair wrote."""

    table: str
    missing: int = 0
    extra: int = 0
    different: int = 0
    two_current: int = 0
    overlapping: int = 0
    repaired: int = 0  # versions closed or opened

    @property
    def differences(self) -> int:
        return sum(getattr(self, kind) for kind in _KINDS)

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "status": "equal" if not self.differences else "different",
            **{kind: getattr(self, kind) for kind in _KINDS},
            "repaired": self.repaired,
        }

    def line(self) -> str:
        if not self.differences:
            return f"history {self.table}: equal"
        found = ", ".join(
            f"{getattr(self, kind):,} {kind.replace('_', ' ')}"
            for kind in _KINDS
            if getattr(self, kind)
        )
        repaired = f", {self.repaired:,} version(s) closed or opened" if self.repaired else ""
        return f"history {self.table}: different: {found}{repaired}"


def _names(history: HistoryTable, present: sql.Composable) -> dict[str, sql.Composable]:
    columns = history.column_names
    return {
        **history.names(),
        "ch": key_match("c", "h", history.key),
        "c_text": row_text("c", columns),
        "h_text": row_text("h", columns),
        "keys": sql.SQL(", ").join(map(sql.Identifier, history.key)),
        "present": present,
        "c_names": sql.SQL(", ").join(sql.Identifier("c", c) for c in columns),
    }


_MISSING = (
    "SELECT count(*) FROM {copy} AS c WHERE {present} AND NOT EXISTS "
    "(SELECT FROM {h} AS h WHERE h.{is_current} AND {ch})"
)
_EXTRA = (
    "SELECT count(*) FROM {h} AS h WHERE h.{is_current} AND NOT EXISTS "
    "(SELECT FROM {copy} AS c WHERE {present} AND {ch})"
)
_DIFFERENT = (
    "SELECT count(*) FROM {h} AS h JOIN {copy} AS c ON {ch} "
    "WHERE h.{is_current} AND {present} AND {c_text} <> {h_text}"
)
_TWO_CURRENT = (
    "SELECT count(*) FROM (SELECT FROM {h} WHERE {is_current} GROUP BY {keys} "
    "HAVING count(*) > 1) AS k"
)
# each version with the one after it, by key
_FOLLOWED = (
    "SELECT ctid, {valid_to}, {is_current}, lead({valid_from}) OVER "
    "(PARTITION BY {keys} ORDER BY {valid_from}) AS next FROM {h}"
)
_OVERLAPPING = (
    "SELECT count(*) FROM (" + _FOLLOWED + ") AS v WHERE ({valid_to} IS NULL) <> {is_current} "
    "OR (next IS NOT NULL AND ({valid_to} IS NULL OR {valid_to} > next))"
)


def check_history(
    dest: psycopg.Connection[Any], history: HistoryTable, present: sql.Composable
) -> HistoryFindings:
    """Count what differs (see the module's docstring), in one snapshot. `present`: whether
    a row `c` of the copy counts (one marked deleted does not)."""
    names = _names(history, present)
    counts = {}
    with transaction(dest, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", rollback=True):
        for kind, query in zip(
            _KINDS, (_MISSING, _EXTRA, _DIFFERENT, _TWO_CURRENT, _OVERLAPPING), strict=True
        ):
            (counts[kind],) = execute(dest, sql.SQL(query).format(**names)).fetchone()
    return HistoryFindings(str(history.name), **counts)


def repair_history(
    dest: psycopg.Connection[Any],
    history: HistoryTable,
    present: sql.Composable,
    now: datetime,
) -> int:
    """Close and open versions until the check finds nothing (see the module's docstring);
    returns how many versions were closed or opened, in one transaction."""
    names = _names(history, present)
    statements = (
        # each version ends where the next begins; the last ends as it did
        "UPDATE {h} AS h SET {valid_to} = v.next, {is_current} = false FROM (" + _FOLLOWED + ") "
        "AS v WHERE h.ctid = v.ctid AND v.next IS NOT NULL AND "
        "(v.{valid_to} IS NULL OR v.{valid_to} > v.next OR v.{is_current})",
        "UPDATE {h} SET {is_current} = ({valid_to} IS NULL) "
        "WHERE {is_current} <> ({valid_to} IS NULL)",
        # a current version the copy lacks, or whose row is not the copy's, ends now
        "UPDATE {h} AS h SET {valid_to} = greatest(%(now)s, h.{valid_from}), "
        "{is_current} = false WHERE h.{is_current} AND NOT EXISTS "
        "(SELECT FROM {copy} AS c WHERE {present} AND {ch} AND {c_text} = {h_text})",
        # and a row of the copy without a current version begins one now
        "INSERT INTO {h} ({columns}, {valid_from}, {hop}) SELECT {c_names}, greatest(%(now)s, "
        "(SELECT max(h.{valid_from}) + interval '1 microsecond' FROM {h} AS h WHERE {ch})), "
        "'snapshot' FROM {copy} AS c WHERE {present} AND NOT EXISTS "
        "(SELECT FROM {h} AS h WHERE h.{is_current} AND {ch})",
    )
    written = 0
    with transaction(dest):
        for statement in statements:
            params = {"now": now} if "%(now)s" in statement else None
            written += max(execute(dest, sql.SQL(statement).format(**names), params).rowcount, 0)
    return written
