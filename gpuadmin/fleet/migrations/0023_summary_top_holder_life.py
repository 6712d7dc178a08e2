"""The summary keeps its top holder's life and memory (``summary.top_holder_may_change``), filled for the
summaries there are as ``summary._summary_columns`` computes them."""

from django.db import migrations, models

# The open life holding the most GPU memory (ties: the lowest pid), as the summary's top_holder_user.
_FILL = """
UPDATE fleet_hostsummary SET
    top_holder_life_id = (
        SELECT l.id FROM fleet_processlife l
        WHERE l.host_id = fleet_hostsummary.host_id AND l.gone_at IS NULL AND l.last_gpu_memory_bytes > 0
        ORDER BY l.last_gpu_memory_bytes DESC, l.pid LIMIT 1),
    top_holder_memory_bytes = COALESCE((
        SELECT l.last_gpu_memory_bytes FROM fleet_processlife l
        WHERE l.host_id = fleet_hostsummary.host_id AND l.gone_at IS NULL AND l.last_gpu_memory_bytes > 0
        ORDER BY l.last_gpu_memory_bytes DESC, l.pid LIMIT 1), 0)
"""

class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0022_remove_host_last_probe_sent_at'),
    ]

    operations = [
        migrations.AddField(
            model_name='hostsummary',
            name='top_holder_life_id',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='hostsummary',
            name='top_holder_memory_bytes',
            field=models.BigIntegerField(default=0),
        ),
        migrations.RunSQL(_FILL, migrations.RunSQL.noop),
    ]
