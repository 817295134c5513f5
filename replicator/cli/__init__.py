"""The `replicator` command line, on top of every other wing: `main` (the click group, its
commands and the console script's `main`), `options` (the options every command shares, and
how errors and interruptions become exit codes), `help_text` (examples, environment and exit
codes for `--help`), the command groups `spark_commands` (`replicator spark
start|stop|status`), `state_commands` (`replicator state ...`, `replicator cdc drop`) and
`warm_commands` (`replicator warm start|stop|status`), and the warm helper those start:
`warm_server` (replicator loaded once, a forked child per command), `warm_client` (what a
command does first: hand itself to a helper that is up) and `warm_socket` (where they meet).

May import: every layer below it (base, project, postgres, plan, transfer, compare, capture,
report, sync, commands).
"""
