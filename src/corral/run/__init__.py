"""Bounded runs: one process, one bounded run, one pinned outcome (``bounded``: a plain
subprocess; ``strict``: inside a fresh sandbox of a provider)."""
