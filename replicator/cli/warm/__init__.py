"""The warm helper: replicator loaded once, a forked child per command (`helper`), what a
command does first (`client`: hand itself to a helper that is up), where and how they meet
(`wire`), and `replicator warm start|stop|status` (`group`).

May import: every layer below cli.
"""
