"""What a message says when the config names a column the source table does not have: the
columns it does have, and for a name that differs from one of them only in case, how to
write it (an unquoted name is folded to lower case, as SQL folds it), or the one a typo
meant."""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable

from ..base.identifiers import display_ident
from ..postgres.catalog import TableInfo


def columns_hint(missing: Iterable[str], source: TableInfo) -> str:
    """` (it has a, b, c)`, then `; did you mean "Name"? ...` for a case-only difference."""
    names = [c.name for c in source.columns]
    text = f" (it has {', '.join(map(display_ident, names))})"
    for wanted in missing:
        near = next((n for n in names if n.lower() == wanted.lower() and n != wanted), None)
        if near is not None:
            quoted = json.dumps(display_ident(near))
            text += (
                f"; did you mean {display_ident(near)}? Unquoted names are folded to lower "
                f"case: write it as {quoted} in tables-config.json"
            )
        elif close := difflib.get_close_matches(wanted, names, n=1, cutoff=0.75):
            text += f"; did you mean {display_ident(close[0])} for {display_ident(wanted)}?"
    return text
