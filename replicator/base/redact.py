"""Keeps passwords and secrets out of every line the tool prints or writes.

Secrets are registered as they are read (connection URLs, the webhook secret, PGPASSWORD);
`redact()` also masks anything shaped like a password in a libpq URI or key=value string,
so a secret never registered (say, inside a driver's exception text) is still hidden.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

MASK = "***"

_secrets: set[str] = set()

# postgresql://user:secret@host  ->  postgresql://user:***@host. The password runs to the
# URI's last `@`: an un-encoded `@` in it (`u:p@ss@host`) is masked whole, not cut at the first.
_URI_PASSWORD = re.compile(
    r"(?P<head>[a-z][a-z0-9+.-]*://[^:/?#\s'\"<>]*:)(?P<pw>[^\s'\"<>]*)(?=@[^@\s'\"<>]*)",
    re.I,
)
# password=secret, password='se cret', ?password=secret&...
_KV_PASSWORD = re.compile(
    r"(?P<head>\b(?:password|passwd|pgpassword|secret)\s*=\s*)"
    r"(?P<pw>'(?:[^'\\]|\\.)*'|[^\s&;,]+)",
    re.I,
)


def register_secret(value: str | None) -> None:
    """Remember a secret so that `redact` masks it wherever it appears."""
    if value and len(value) >= 3:
        _secrets.add(value)


def register_connection_string(conninfo: str | None) -> None:
    """Register the password held in a libpq URI or key=value string, if any."""
    if not conninfo:
        return
    from psycopg.conninfo import conninfo_to_dict

    try:
        password = conninfo_to_dict(conninfo).get("password")
    except Exception:  # an unparsable string is masked by the patterns instead
        password = None
    register_secret(str(password) if password is not None else None)
    # What the user meant as the password when libpq would cut it at an un-encoded `@`,
    # and the password as written: libpq quotes it whole in its errors about it ("invalid
    # percent-encoded token: ...").
    written = _URI_PASSWORD.search(conninfo.strip())
    if written:
        register_secret(unquote(written.group("pw")))
        register_secret(written.group("pw"))


def redact(text: str) -> str:
    """Return `text` with registered secrets and password-shaped values masked."""
    text = _URI_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    text = _KV_PASSWORD.sub(lambda m: m.group("head") + MASK, text)
    for secret in sorted(_secrets, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


# PostgreSQL's messages that quote a value: `invalid input syntax for type integer: "x"`,
# `invalid input value for enum mood: "x"`, `value "x" is out of range for type integer`,
# `date/time field value out of range: "x"`.
_QUOTED_VALUE = re.compile(r'(?P<head>: |\bvalue )"(?:[^"]|"")*"')


def mask_values(text: str) -> str:
    """`text` without the values PostgreSQL's messages quote: the error of a table with
    columns that must not leave the source (`columns`, `where`) may be about one of them."""
    return _QUOTED_VALUE.sub(lambda m: f'{m["head"]}"{MASK}"', text)
