"""The commands besides `sync`: compile, check, status, state edits, adopt, demo. Each reads
the same plan and statements `sync` uses and prints them.

May import: every layer below it (base, project, postgres, plan, transfer, spark, compare,
cdc, report, sync).
"""
