"""Staged changes into the copy: one table's batch in one destination transaction with the
log position it reaches (`table_apply`, its statements in `apply_sql`, which `compile`
prints too), batches applied on a second thread in order (`applier`), and the positions
themselves (`applied`, `_replicator.cdc_applied`); a table's history versions from the same
staged changes, in the same transaction (`history_apply`).

May import: base, project, postgres, plan, and the `rows` and `source` rooms.
"""
