"""LZ4 for the latest snapshot's update, rewritten by every update, as for its document since 0008
(``fleet.storage.table_settings``; the usage cursor's in usage 0004)."""

from django.db import migrations

from gpuadmin.fleet.storage.table_settings import compress_with_lz4

COLUMNS = {"LatestSnapshot": ["update"]}


class Migration(migrations.Migration):

    dependencies = [
        ("fleet", "0020_fillfactor_of_rows_every_update_rewrites"),
    ]

    operations = [
        compress_with_lz4("fleet", COLUMNS),
    ]
