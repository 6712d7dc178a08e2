"""How ingest's rows reach the database without the ORM's per-call work.

``statements``: ingest's fixed statements, their SQL written once per process (prepared
queries, updates and multi-row inserts, pipelined reads). ``json_text``: the latest snapshot
document kept as JSON text in a text column, not ``jsonb``. ``page_room``: room kept on the pages
of rows rewritten at every snapshot (PostgreSQL's fillfactor, set by migrations). ``compression``:
LZ4 for the large values they rewrite (set by migrations). No rules about hosts live here: only how
rows are written and read.
"""
