"""History: what central keeps of past snapshots, and for how long.

``record``: the samples, process lives and points each accepted snapshot adds (called by
ingest, in its transaction). ``retention``: the 5-minute rollups and the pruning that keep it
bounded. ``series``: history read back as chart series, for the host and process pages and
the JSON API. What the history means (leaks, idle holders) is the findings' to say.
"""
