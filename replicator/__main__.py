"""`python -m replicator` runs the CLI."""

from .cli.main import main

main()
