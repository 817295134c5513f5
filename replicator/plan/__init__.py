"""What each table's sync will do, decided before anything is written: the source table and
its model inspected, the statements built (table SQL), the schema signature and its diff,
the drift observed, the pure decision (decide), and a replication-key cursor's rules
(cursor: where the next read starts and the window a sync leaves past it, read in the
caller's snapshot, and what a cursor cannot see).

May import: base, project, postgres.
"""
