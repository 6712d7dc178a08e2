"""The usage cursor's holders' index (``ledger.HolderIndex``), which an update reads instead of the
holders' list; filled from the lists stored before it, LZ4 as the other lists (usage 0004)."""

import json

from django.db import migrations, models

from gpuadmin.fleet.storage.table_settings import compress_with_lz4


def index_the_holders(apps, schema_editor):
    """Each stored cursor's index, from its holders' list: each holder an array that begins with its
    boot id, pid, start ticks and device's uuid (the list as ledger.Holder was first written)."""
    UsageCursor = apps.get_model("usage", "UsageCursor")
    for cursor in UsageCursor.objects.only("host_id", "holders").iterator(chunk_size=500):
        devices: dict[str, int] = {}
        rows = [[pid, ticks, devices.setdefault(uuid, len(devices))]
                for _boot_id, pid, ticks, uuid, *_ in json.loads(cursor.holders)]
        UsageCursor.objects.filter(pk=cursor.pk).update(
            holder_index=json.dumps([list(devices), rows], separators=(",", ":")))


class Migration(migrations.Migration):

    dependencies = [
        ("usage", "0004_usage_cursor_lz4"),
    ]

    operations = [
        migrations.AddField(
            model_name="usagecursor",
            name="holder_index",
            field=models.TextField(default="[[],[]]"),
            preserve_default=False,
        ),
        migrations.RunPython(index_the_holders, migrations.RunPython.noop),
        compress_with_lz4("usage", {"UsageCursor": ["holder_index"]}),
    ]
