"""Findings: what a host's snapshots say is wrong there, each with the way out that works.

``rules``: the pure part, a validated document (and what history says beside it) in, drafts
out, with no database. ``memory_explained``: each GPU's memory accounted for, also pure, for the
host page and the kills app. ``sync``: the one writer, drafts into open, refreshed and resolved
``Finding`` rows.
"""
