"""A cursor table kept current: the batch at or past its cursor read in one snapshot and
merged (`batch`), a big batch staged and merged in parts (`merge_pipeline`), a key range read
again (`resync`), and the rows the source deleted propagated (`deletes`).

May import: every layer below sync, and the modules at sync's root it is handed (context,
scripts).
"""
