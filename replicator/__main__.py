"""`python -m replicator` runs the CLI."""

from .cli.entry import main

main()
