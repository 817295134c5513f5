"""Log-based change capture (`mode: "cdc"`), in three rooms and what joins them:
`source/` (the slot, the publication, the stream and its decoder: what the source gives),
`rows/` (a logged change made into a staging row, and staged), `apply/` (the staged changes
applied to the copy, one transaction per table with its log position); here, the drain that
reads, stages and applies a run's changes exactly once (`drain`, `read`), a table as the drain
sees it (`capture_table`), what a table must be to be captured (`preflight`), and the
changes still in the slot (`pending`, for verify). docs/architecture.md: Log capture.

Logical decoding returns a transaction only once its commit record is flushed, so on a
server with synchronous_commit off a committed change can reach the slot a moment
(wal_writer_delay) later: never lost, possibly one run later.

May import: base, project, postgres, plan, transfer, spark, compare; inside it, `rows` may
import `source`, `apply` may import `rows` and `source`, and this folder's modules all three.
"""
