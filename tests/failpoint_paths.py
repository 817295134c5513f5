"""Which failpoints each sync path passes (the crash matrix and the soak both kill at them)."""

FULL_RELOAD_POINTS = (
    "after-snapshot-export",
    "mid-extract",
    "task-before-commit",
    "after-load-before-swap",
    "before-swap-commit",
    "after-swap-commit",
    "after-swap-before-state",
    "state-before-rename",
)
# A full load of several partitions, in-process: killed at its third partition's commit or
# in its second partition's copy, the committed ones stay for the next run to resume.
RESUME_POINTS = ("task-before-commit@3", "mid-extract@2")
# An incremental batch this process copies whole (sync/incremental/batch.py, the direct
# way: the run's own sessions, a temporary staging table).
INCREMENTAL_POINTS = (
    "mid-extract",
    "after-staging-copy",
    "mid-merge",
    "after-merge-before-state",
    "state-before-rename",
)
# The same batch the general way, on Spark: an exported snapshot, a staging table of
# `_replicator` that a kill after the copy leaves behind.
GENERAL_BATCH_POINTS = ("after-snapshot-export", "after-staging-copy")
# A `cdc` table's run, draining the slot (its loads pass FULL_RELOAD_POINTS).
CAPTURE_POINTS = (
    "cdc-after-stage",
    "cdc-before-apply-commit",
    "cdc-after-apply-before-advance",
    "state-before-rename",
)
# A cursor table with `deletes: delete`, after its incremental merge.
DELETE_POINTS = ("deletes-before-commit",)
# On the Spark path these run in a Python worker: the kill takes the task, and the run fails
# the table (exit 1, "Spark task failed: Python worker exited unexpectedly").
EXECUTOR_POINTS = ("mid-extract", "task-before-commit")
