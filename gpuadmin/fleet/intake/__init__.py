"""Intake: one signed snapshot from an agent, believed or refused, then stored.

``trust``: whom central believes (host keys, enrolment, rejected messages). ``validation``
with ``schema_types``: whether a snapshot's text may be stored, and why not. ``ingest``:
the one transaction that writes an accepted snapshot, handing its rows to history and its
drafts to findings. Nothing here reads for pages or charts.
"""
