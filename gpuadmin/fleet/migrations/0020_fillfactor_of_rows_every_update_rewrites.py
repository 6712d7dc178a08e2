"""Room on the pages of the rows every snapshot update rewrites: a host's, its GPUs', its latest
snapshot's and its summary's (``fleet.storage.table_settings``; the usage cursor's in usage 0003)."""

from django.db import migrations

from gpuadmin.fleet.storage.table_settings import keep_room

MODELS = ["Host", "Gpu", "LatestSnapshot", "HostSummary"]
FILLFACTOR = 70


class Migration(migrations.Migration):

    dependencies = [
        ("fleet", "0019_history_sampled_figures"),
    ]

    operations = [
        keep_room("fleet", MODELS, FILLFACTOR),
    ]
