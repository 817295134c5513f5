"""The `replicator` command line, on top of every other wing: `main` (the click group, its
commands and the console script's `main`), `options` (the options every command shares, and
how errors and interruptions become exit codes), `help_text` (examples, environment and exit
codes for `--help`), and the command groups `spark_commands` (`replicator spark
start|stop|status`) and `state_commands` (`replicator state ...`, `replicator cdc drop`).

May import: every layer below it (base, project, postgres, plan, transfer, compare, capture,
report, sync, commands).
"""
