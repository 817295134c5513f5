"""What a message says when the config names a column the source table does not have: the
columns it does have, and for a name that differs from one of them only in case, how to
write it (an unquoted name is folded to lower case, as SQL folds it), or the one a typo
meant."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Sequence

from ..base.identifiers import display_ident
from ..postgres.catalog import TableInfo


def near_column(wanted: str, names: Sequence[str]) -> str | None:
    """The column a name that is not one of `names` was likely meant to be: the same but
    for case, or one a typo away."""
    same = next((n for n in names if n.lower() == wanted.lower() and n != wanted), None)
    if same is not None:
        return same
    close = difflib.get_close_matches(wanted, names, n=1, cutoff=0.75)
    return close[0] if close else None


def columns_hint(missing: Iterable[str], source: TableInfo) -> str:
    """` (it has a, b, c)`, then `; did you mean "Name"? ...` for a case-only difference."""
    names = [c.name for c in source.columns]
    text = f" (it has {', '.join(map(display_ident, names))})"
    for wanted in missing:
        near = near_column(wanted, names)
        if near is not None and near.lower() == wanted.lower():
            quoted = json.dumps(display_ident(near))
            text += (
                f"; did you mean {display_ident(near)}? Unquoted names are folded to lower "
                f"case: write it as {quoted} in tables-config.json"
            )
        elif near is not None:
            text += f"; did you mean {display_ident(near)} for {display_ident(wanted)}?"
    return text
