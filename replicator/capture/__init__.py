"""Log-based change capture (`mode: "cdc"`): the slot and publication, a load's snapshot with
its log position, and the drain that reads, stages and applies changes exactly once
(docs/architecture.md: Log capture).

Measured while building it: logical decoding returns a transaction only once its commit
record is flushed, so on a server with synchronous_commit off a committed change can reach
the slot a moment (wal_writer_delay) later: never lost, possibly one run later.

May import: base, project, postgres, plan, transfer, compare.
"""
