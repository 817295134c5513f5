"""One setting written for libpq's `options` connection parameter.

In the base layer because the project's settings (the hash salt) and the log stream (the
pinned session settings) both write one, and the project layer sits below postgres.
"""

from __future__ import annotations


def option_setting(name: str, value: str) -> str:
    """A setting in libpq's `options` (`-c name=value`): the value's backslashes and spaces
    escaped with a backslash, as libpq splits on spaces."""
    return f"-c {name}=" + value.replace("\\", "\\\\").replace(" ", "\\ ")
