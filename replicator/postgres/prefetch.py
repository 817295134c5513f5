"""Facts about many tables read in one round trip per kind of fact, for a command over a
whole project (a run of 1,000 tables reads each side's catalog a few times, not a few
thousand times).

A fact is put by session and taken once: the first reader of a table's fact pops it, and a
later reader (the same table after its reload in the same run, say) reads the catalog again.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

_facts: weakref.WeakKeyDictionary[Any, dict[tuple[str, Any], Any]] = weakref.WeakKeyDictionary()
_MISSING = object()


def put_many(conn: Any, kind: str, values: Mapping[Any, Any]) -> None:
    """Keep each value for its key until it is taken."""
    store = _facts.setdefault(conn, {})
    for key, value in values.items():
        store[(kind, key)] = value


def take(conn: Any, kind: str, key: Any) -> tuple[bool, Any]:
    """(True, the value) once after `put_many`; (False, None) when there is none."""
    store = _facts.get(conn)
    if not store:
        return False, None
    value = store.pop((kind, key), _MISSING)
    return (False, None) if value is _MISSING else (True, value)


def forget(conn: Any) -> None:
    """Drop what is left for this session (the command is done with its tables)."""
    _facts.pop(conn, None)
