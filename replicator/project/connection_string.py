"""What libpq would refuse in a connection string, found before anything runs (a usage
error, exit 2), and said without any part of the string that may be a password."""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..base.redact import MASK, redact

# libpq's own text that quotes a character of its grammar, not of the string.
_MISSED = 'missing "=" after '


def _masked(line: str) -> str:
    """`line` with everything from the first quote of the string's text to the last quote
    on the line masked: libpq quotes any part of the string (a password's too, `password=pa
    ss` is `missing "=" after "ss"`), and a quote inside that part would end a pairing
    early."""
    kept = ""
    if line.startswith(_MISSED):
        kept, line = _MISSED, line[len(_MISSED) :]
    first, last = line.find('"'), line.rfind('"')
    if first == -1:
        return kept + line
    if first == last:  # an opening quote alone: everything after it may be the string's
        return f'{kept}{line[:first]}"{MASK}"'
    return f'{kept}{line[:first]}"{MASK}"{line[last + 1 :]}'


# libpq's refusals of a keyword it does not know. The keyword stays masked: it may be the
# rest of a password with an unquoted space (`password=ab cd=ef` quotes "cd").
_UNKNOWN_KEYWORD = ("invalid URI query parameter", "invalid connection option")


def unparsed(exc: Exception) -> str:
    """libpq's reason for refusing a connection string, with what it quotes of the string
    masked, and how to write spaces and quotes in a value."""
    lines = str(exc).strip().splitlines()
    reason = _masked(lines[0] if lines else "")
    if reason.startswith(_UNKNOWN_KEYWORD):
        reason += (
            ": a keyword libpq does not know (see its list of connection parameters), or the"
            " rest of a value with a space in it"
        )
    return (
        f"{redact(reason)} (in key=value pairs, single-quote a value that holds spaces or "
        "quotes, and write a quote inside it as \\'; in a URI, percent-encode them: %20 for "
        "a space, %27 for a quote)"
    )


_URI_SCHEMES = ("postgresql://", "postgres://")
# Values libpq checks only when it connects ("connection is bad: invalid port number"):
# checked here, so that a typo is a usage error (exit 2) before anything runs.
_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": (
        "any",
        "read-write",
        "read-only",
        "primary",
        "standby",
        "prefer-standby",
    ),
}
_INTEGERS = ("connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval")


def option_problems(options: Mapping[str, object]) -> list[str]:
    """What libpq would refuse in these connection options, one line each with the fix."""
    problems = []
    for port in str(options.get("port") or "").split(","):
        if port and not (port.isdigit() and 1 <= int(port) <= 65535):
            problems.append(f"port {port!r} is not a port number (1-65535)")
    for option, choices in _CHOICES.items():
        value = options.get(option)
        if value is not None and value not in choices:
            problems.append(f"{option} {value!r} is not one of {', '.join(choices)}")
    for option in _INTEGERS:
        value = options.get(option)
        if value is not None and not str(value).lstrip("-").isdigit():
            problems.append(f"{option} {value!r} is not a whole number")
    return problems


def uri_userinfo_problem(value: str) -> str | None:
    """Why libpq would read a URI's user and password other than as written, or None.

    libpq ends the user and password at the first `@` (or at a `/` before any `@`): in
    `postgresql://u:p@ss@host/db` it connects to host `ss@host` with password `p`, and the
    rest of the password ends up in its error messages. Such a URI is refused up front."""
    if not value.strip().lower().startswith(_URI_SCHEMES):
        return None  # key=value strings quote their values
    before_query = value.strip().split("://", 1)[1].split("?", 1)[0]
    authority, _, path = before_query.partition("/")
    if authority.count("@") > 1 or "@" in path:
        return (
            "the URI has more than one '@' before its host (or one after a '/'), so libpq "
            "would cut the user name or password short: percent-encode '@' as %40, '/' as "
            "%2F and '%' as %25 in them (postgresql://user:p%40ss@host/db), or use key=value "
            "pairs (host=... user=... password='p@ss')"
        )
    if _BAD_ESCAPE.search(before_query.rpartition("@")[0]):
        return (
            "a '%' in the URI's user name or password is not followed by two hex digits, so "
            "libpq cannot decode it: percent-encode '%' itself as %25 (and '@' as %40, '/' "
            "as %2F: postgresql://user:p%25ss@host/db), or use key=value pairs "
            "(host=... user=... password='p%ss')"
        )
    return None


_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
