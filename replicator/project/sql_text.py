"""A light look at SQL text the config holds (`tables[].where`), without a parser: whether
it is one expression that cannot end the statement it is put in.

PostgreSQL checks the expression itself when the table is inspected (and names the
problem); this only stops a `;` or an unbalanced parenthesis from turning a filter into
another statement. Kept free of sqlglot: every command reads the config.
"""

from __future__ import annotations

import re

_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$")


def expression_only(text: str) -> bool:
    """No `;` and balanced parentheses outside quotes, quoted names, dollar quotes and
    comments; every quote and comment closed."""
    depth, i, n = 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "'\"":
            end = _closing_quote(text, i + 1, ch)
            if end < 0:
                return False
            i = end + 1
            continue
        if text.startswith("--", i):
            newline = text.find("\n", i)
            i = n if newline < 0 else newline + 1
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                return False
            i = end + 2
            continue
        tag = _DOLLAR_TAG.match(text, i) if ch == "$" else None
        if tag:
            end = text.find(tag.group(0), tag.end())
            if end < 0:
                return False
            i = end + len(tag.group(0))
            continue
        if ch == ";":
            return False
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                return False
        i += 1
    return depth == 0


def _closing_quote(text: str, start: int, quote: str) -> int:
    """Where the quote opened before `start` closes (a doubled quote stays inside)."""
    i = start
    while True:
        end = text.find(quote, i)
        if end < 0:
            return -1
        if text.startswith(quote * 2, end):
            i = end + 2
            continue
        return end
