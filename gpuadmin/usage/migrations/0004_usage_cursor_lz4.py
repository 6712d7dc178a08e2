"""LZ4 for the usage cursor's lists, rewritten by the snapshots and updates that move them
(``fleet.storage.table_settings``, as fleet 0021)."""

from django.db import migrations

from gpuadmin.fleet.storage.table_settings import compress_with_lz4

COLUMNS = {"UsageCursor": ["devices", "holder_bytes", "holders", "pending"]}


class Migration(migrations.Migration):

    dependencies = [
        ("usage", "0003_usage_cursor_fillfactor"),
        ("fleet", "0021_latest_snapshot_update_lz4"),
    ]

    operations = [
        compress_with_lz4("usage", COLUMNS),
    ]
