"""What each table's sync will do, decided before anything is written: the source table and
its model inspected, the statements built (table SQL), the schema signature and its diff,
the drift observed, and the pure decision (decide).

May import: base, project, postgres.
"""
