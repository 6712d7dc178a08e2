"""Room on the usage cursors' pages: every snapshot and update rewrites its host's
(``fleet.storage.table_settings``, as fleet 0020)."""

from django.db import migrations

from gpuadmin.fleet.storage.table_settings import keep_room

FILLFACTOR = 70


class Migration(migrations.Migration):

    dependencies = [
        ("usage", "0002_busy_measured_or_estimated"),
        ("fleet", "0020_fillfactor_of_rows_every_update_rewrites"),
    ]

    operations = [
        keep_room("usage", ["UsageCursor"], FILLFACTOR),
    ]
