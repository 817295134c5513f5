"""The `replicator` command line, on top of every other wing: `entry` (the console script),
`main` (the click group and its commands), `options` (the options every command shares, and
how errors and interruptions become exit codes), `help_text` (examples, environment and exit
codes for `--help`), the command groups `spark_commands` (`replicator spark
start|stop|status`) and `groups` (`replicator state ...`, `replicator cdc ...`), and the warm
helper in its own room (`warm/`).

May import: every layer below it (base, project, postgres, plan, transfer, spark, compare,
cdc, report, sync, commands).
"""
