"""The `cdc` tables of a run: the slot, the publication and the copies they invalidate
(`setup`), the run's one drain for its tables (`cdc_run`), a copy adopted at the slot's
position (`adopt_at_slot`), and `cdc restart` (`restart`).

May import: every layer below sync, and the modules at sync's root it is handed (context,
scripts).
"""
