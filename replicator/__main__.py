"""`python -m replicator` runs the CLI."""

from .cli import main

main()
