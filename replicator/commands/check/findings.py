"""One line of `check`: what was found, about what, and how to fix it; and the lines of a
pattern's many tables summed up, so that 94 tables give a screen, not 350 lines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Level = Literal["ok", "warn", "error"]


@dataclass(frozen=True)
class Finding:
    level: Level
    subject: str
    message: str
    fix: str | None = None
    # the pattern entry that chose the subject table (`many.t_*`): its tables' findings are
    # summed up per pattern unless `check -v`
    pattern: str | None = None

    def line(self) -> str:
        text = f"{self.level:<5} {self.subject}: {self.message}"
        return f"{text}; fix: {self.fix}" if self.fix else text


def summed_up(findings: list[Finding]) -> list[Finding]:
    """The findings about the tables of each pattern entry, summed up where they say the
    same of each table, its name aside: one line naming how many and which (`ok` lines by
    what they say before a parenthesis: `next sync: incremental`, whatever each cursor).
    Everything else as it is, in order; a line said of one table only stays that table's."""
    from ...report.output import some_tables

    groups: dict[tuple[str, str, str, str], list[Finding]] = {}
    order: list[Finding | tuple[str, str, str, str]] = []
    for finding in findings:
        if finding.pattern is None:
            order.append(finding)
            continue
        key = (
            finding.pattern,
            finding.level,
            _generic(finding.message, finding.subject, finding.level == "ok"),
            _generic(finding.fix or "", finding.subject),
        )
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(finding)
    out = []
    for item in order:
        if isinstance(item, Finding):
            out.append(item)
            continue
        found = groups[item]
        if len(found) == 1:
            out.append(found[0])
            continue
        pattern, level, message, fix = item
        whole = {_generic(f.message, f.subject) for f in found}
        if len(whole) == 1:  # they say the same in full (an ok line's reason too)
            message = whole.pop()
        subject = f"{pattern} ({some_tables([f.subject for f in found])})"
        out.append(Finding(level, subject, message, f"{fix}, for each" if fix else None, pattern))
    return out


def _generic(text: str, subject: str, short: bool = False) -> str:
    """What a finding says of its table with the table's name as `<table>` (written, or as
    SQL quotes it); `short`: only what comes before a parenthesis."""
    from ...base.identifiers import TableName

    try:
        name = TableName.parse(subject)
        forms = [subject, name.sql(), str(name)]
    except ValueError:
        forms = [subject]
    for form in sorted(set(forms), key=len, reverse=True):
        text = text.replace(form, "<table>")
    return text.split(" (", 1)[0] if short else text
