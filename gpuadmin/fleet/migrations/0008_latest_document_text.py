"""A host's latest snapshot document as text, not jsonb (gpuadmin/fleet/storage/json_text.py).

Existing documents are kept: PostgreSQL turns each into its text
(``USING "document"::text``), SQLite stored JSON as text already.

On PostgreSQL the column is then compressed with lz4 where the server has it
(14+, built with lz4): each accepted snapshot rewrites ~125 KB, and lz4 makes
that write about five times cheaper than the default pglz. A server without
lz4 would refuse ``SET COMPRESSION lz4``, so it is asked first
(``fleet.storage.table_settings``) and keeps its default compression; the migration never
fails for that. Values already stored keep their compression until they are
rewritten (the next snapshot of their host). A later migration that rebuilds
this column must set the compression again.
"""

from django.db import migrations

import gpuadmin.fleet.storage.json_text
from gpuadmin.fleet.storage.table_settings import compress_with_lz4


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0007_process_life_keeps_owner'),
    ]

    operations = [
        migrations.AlterField(
            model_name='latestsnapshot',
            name='document',
            field=gpuadmin.fleet.storage.json_text.JsonTextField(),
        ),
        compress_with_lz4("fleet", {"LatestSnapshot": ["document"]}),
    ]
