"""A full load: the table copied into a side table in one exported snapshot and swapped in
(`load`), its partitions and their tasks (`parts`), and a load killed part-way resumed
(`resume`).

May import: every layer below sync, and the modules at sync's root it is handed (context,
scripts).
"""
