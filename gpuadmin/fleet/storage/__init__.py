"""How ingest's rows reach the database without the ORM's per-call work.

``statements``: ingest's fixed statements (and beat's upkeep's), their SQL written once per process (prepared
queries, updates and multi-row inserts, pipelined reads). ``json_text``: the latest snapshot
document kept as JSON text in a text column, not ``jsonb``. ``table_settings``: how
PostgreSQL keeps the tables rewritten at every snapshot, set by migrations (room on their pages,
LZ4 for their large values). No rules about hosts live here: only how rows are written and
read.
"""
