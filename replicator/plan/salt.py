"""Which hash salt a table's hashed columns were made with (`tables[].columns.hash`): a
copy hashed with another salt is reloaded. Its signature (in its state file) holds a
fingerprint of the salt, never the salt, and messages say only whether a salt hashed.
"""

from __future__ import annotations

import functools
import hashlib
import re
import weakref
from typing import Any

import psycopg

from ..postgres.database import fetch_all
from ..project.settings import SALT_SETTING

# Which salt a session hashes with: a copy hashed with another salt is reloaded. The
# table's signature (in its state file) holds a fingerprint of it, never the salt.
_SALT = "SELECT nullif(current_setting(%s, true), '')"
_salt_ids: weakref.WeakKeyDictionary[Any, str | None] = weakref.WeakKeyDictionary()
_IN_TEXT = re.compile(r"\(salt ([0-9a-f]+)\)")


def salt_id(conn: psycopg.Connection[Any]) -> str | None:
    """The fingerprint of the session's hash salt (read once per session); None: no salt."""
    if conn not in _salt_ids:
        salt = fetch_all(conn, _SALT, (SALT_SETTING,))[0][0]
        _salt_ids[conn] = None if salt is None else salt_fingerprint(salt)
    return _salt_ids[conn]


@functools.lru_cache(maxsize=8)
def salt_fingerprint(salt: str) -> str:
    """Which salt, not the salt: scrypt (slow and memory-hard by design, for whoever
    would guess a salt from it), 12 bytes in hex."""
    return hashlib.scrypt(
        salt.encode(), salt=b"replicator: which hash salt", n=2**14, r=8, p=1, dklen=12
    ).hex()


def shown(shaping: str | None) -> str | None:
    """A signature's shaping for messages, which say whether a salt hashed, not which."""
    return None if shaping is None else _IN_TEXT.sub("(salted)", shaping)
