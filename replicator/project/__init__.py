"""The project folder: tables-config.json (config), the environment and .env (settings),
models and macros (templates), sync-state (state), the run lock and the `init` scaffold.

May import: base only (errors, identifiers, failpoints, interrupts, redact, cache): no
database, no Spark. The layers, lowest first: base, project, postgres, plan, transfer,
spark, compare, cdc, report, sync, commands, cli; a module imports from its own layer and
the ones before it (docs/architecture.md).
"""
