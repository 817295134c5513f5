"""`replicator sync`: the run (lock, tables one at a time, webhook), the types a run shares
(context), what each planned table goes through (full load, incremental, start without
backfill, re-sync of a key range) and the cursor rules.

May import: base, project, postgres, plan, transfer, compare, capture, report.
"""
