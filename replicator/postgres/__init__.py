"""Talking to PostgreSQL: the one executor (database), session settings, catalogs, DDL,
derived names, exported snapshots, the open transactions a read must wait for, the
per-table advisory lock, schemas and bookkeeping tables, ownership records, dependent views,
the atomic swap, a copy's history table and the versions loads and batches write in it
(`history_tables`), throwaway clusters for tests and the demo, and the destination's types
in a room of their own (`types/`).

May import: base, project.
"""
