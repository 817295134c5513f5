"""Talking to PostgreSQL: the one executor (database), session settings, catalogs, DDL,
derived names, exported snapshots, the per-table advisory lock, destination types, schemas
and bookkeeping tables, ownership records, dependent views, the atomic swap, and throwaway
clusters for tests and the demo.

May import: base, project.
"""
