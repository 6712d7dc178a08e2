"""A host's latest snapshot document as text, not jsonb (gpuadmin/fleet/storage/json_text.py).

Existing documents are kept: PostgreSQL turns each into its text
(``USING "document"::text``), SQLite stored JSON as text already.

On PostgreSQL the column is then compressed with lz4 where the server has it
(14+, built with lz4): each accepted snapshot rewrites ~125 KB, and lz4 makes
that write about five times cheaper than the default pglz. A server without
lz4 would refuse ``SET COMPRESSION lz4``, so it is asked first
(``server_has_lz4``) and keeps its default compression; the migration never
fails for that. Values already stored keep their compression until they are
rewritten (the next snapshot of their host). A later migration that rebuilds
this column must set the compression again.
"""

from django.db import migrations

import gpuadmin.fleet.storage.json_text


def compress_with_lz4(apps, schema_editor):
    connection = schema_editor.connection
    if not gpuadmin.fleet.storage.json_text.server_has_lz4(connection):
        return  # SQLite, or a PostgreSQL without lz4: its default compression stays
    model = apps.get_model("fleet", "LatestSnapshot")
    table = schema_editor.quote_name(model._meta.db_table)
    column = schema_editor.quote_name(model._meta.get_field("document").column)
    schema_editor.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION lz4", params=None)


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
        # Going back to jsonb needs nothing undone: the compression setting does no harm there.
        migrations.RunPython(compress_with_lz4, migrations.RunPython.noop, elidable=False),
    ]
