"""`replicator dbt-sources`: the copies as dbt sources (commands/dbt_sources.py)."""

from __future__ import annotations

from pathlib import Path

import click

from .help_text import examples
from .options import common, load_expanded, select_option


@click.command(
    "dbt-sources",
    short_help="A dbt sources.yml for the copies, freshness from the load history.",
    epilog=examples(
        "replicator dbt-sources -o ../analytics/models/staging/sources.yml",
        "replicator dbt-sources -s 'sales.*' --name raw_sales",
    ),
)
@select_option
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write it to this file (replaced whole) instead of printing it ('-': print it).",
)
@click.option(
    "--name",
    default=None,
    metavar="NAME",
    help="The source's name (default: the destination schema); with copies in several "
    "schemas, each source is NAME_<schema>.",
)
@common
def dbt_sources(
    project_dir: Path, names: tuple[str, ...], output: Path | None, name: str | None
) -> int:
    """Print dbt's sources.yml (version 2) for the copies: a source per destination schema,
    each table with the copy's columns (data_type, and the source's COMMENTs as
    descriptions), meta naming its source table and mode, and freshness from the load
    history: a loaded_at_query (dbt 1.10 and later) reads when its last successful sync
    ended from _replicator.runs, with warn_after and error_after from tables[].freshness.
    A table that never loaded is past every limit (an error with error_after, a warning
    with warn_after alone). `-o -` prints it too. Patterns are
    expanded; the same config and catalogs give the same bytes. Exit 1, with nothing
    written, when a table cannot be described."""
    from ..commands.dbt_sources import write_sources

    return write_sources(load_expanded(project_dir), names, output, name)
