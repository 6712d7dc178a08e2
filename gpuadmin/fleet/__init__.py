"""The fleet app: what central knows about hosts, and the read side that shows it.

Here: the models and their queries, admin, migrations, the read API, the thin Celery tasks,
probe scheduling, and the pure readers of a validated document (``process_tree``,
``taken_at``); also ``synthetic``, the one synthetic-host generator, kept in the app because
its ``manage.py demo_fleet`` uses it. By job below: ``intake/`` (a signed snapshot in),
``history/`` (what is kept of past snapshots), ``findings/`` (what is wrong, rules apart from
their sync), ``storage/`` (how rows reach the database). pyproject's "fleet-jobs" contract
keeps them layered.
"""
