"""Central no longer asks every host for its probes (each agent keeps its own clock), so nothing
records when it last did."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("fleet", "0021_latest_snapshot_update_lz4"),
    ]

    operations = [
        migrations.RemoveField(model_name="host", name="last_probe_sent_at"),
    ]
