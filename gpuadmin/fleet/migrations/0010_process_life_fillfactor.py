"""Room on each page of ``ProcessLife`` for its rows' next versions (PostgreSQL's fillfactor 80).

A snapshot rewrites the lives whose memory or state moved, about one in eight
of a busy host's. With full pages (fillfactor 100), a third of those updates
found no room on the row's own page: the new version went elsewhere, and each
of the table's three indexes took a new entry. With a fifth of each page kept
free, 98 % of them stay on their page (a heap-only tuple: no index is
touched), and the upsert of a snapshot's changed lives costs PostgreSQL about
a fifth less (benchmarks/statement_costs.py). The table grows by
about a quarter. Pages written before this keep their fill until rewritten.
SQLite has no such setting: nothing is done there.
"""

from django.db import migrations

from gpuadmin.fleet.storage.table_settings import keep_room

FILLFACTOR = 80


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0009_process_life_description_digest'),
    ]

    operations = [
        keep_room("fleet", ["ProcessLife"], FILLFACTOR),
    ]
