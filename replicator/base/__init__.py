"""The ground floor every wing stands on: `errors` (every exception, by exit code),
`identifiers` (PostgreSQL names, quoted and parsed), `redact` (secrets out of every line),
`failpoints` (named kill points for the crash tests), `interrupts` (SIGTERM and SIGINT),
`cache` (the cache folder) and `processes` (whether a pid still runs). Spark's Python
workers import some of these with a copy task, so they stay light: the standard library,
psycopg's `sql` and sqlglot at most.

May import: nothing of replicator outside this wing.
"""
