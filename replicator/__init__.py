"""replicator: keeps copies of PostgreSQL tables in another PostgreSQL database up to date."""

__version__ = "0.1.0"
