"""Log-based change capture (`mode: "cdc"`, being built: not usable from the CLI yet): the
pgoutput decoder. Slot and publication management, staging and the apply come next.

Measured while building it: logical decoding returns a transaction only once its commit
record is flushed, so on a server with synchronous_commit off a committed change can reach
the slot a moment (wal_writer_delay) later: never lost, possibly one run later.

May import: base, project, postgres, plan, transfer, compare.
"""
