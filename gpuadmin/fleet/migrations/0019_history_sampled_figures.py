# Written by hand: each GPU's and host's newest raw sample as written (gpuadmin/fleet/history/record.py),
# which the next snapshot or update compares its figures with.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0018_history_coarse_rollups'),
    ]

    operations = [
        migrations.AddField(model_name='host', name='sampled_at',
                            field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(model_name='host', name='sampled_zombie_count',
                            field=models.PositiveIntegerField(blank=True, null=True)),
        migrations.AddField(model_name='host', name='sampled_uninterruptible_count',
                            field=models.PositiveIntegerField(blank=True, null=True)),
        migrations.AddField(model_name='host', name='sampled_pids_in_use',
                            field=models.PositiveIntegerField(blank=True, null=True)),
        migrations.AddField(model_name='host', name='sampled_pid_max',
                            field=models.PositiveIntegerField(blank=True, null=True)),
        migrations.AddField(model_name='gpu', name='sampled_at',
                            field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(model_name='gpu', name='sampled_memory_used_bytes',
                            field=models.BigIntegerField(blank=True, null=True)),
        migrations.AddField(model_name='gpu', name='sampled_memory_attributed_bytes',
                            field=models.BigIntegerField(blank=True, null=True)),
        migrations.AddField(model_name='gpu', name='sampled_utilization_percent',
                            field=models.PositiveSmallIntegerField(blank=True, null=True)),
        migrations.AddField(model_name='gpu', name='sampled_temperature_celsius',
                            field=models.SmallIntegerField(blank=True, null=True)),
        migrations.AddField(model_name='gpu', name='sampled_power_draw_milliwatts',
                            field=models.BigIntegerField(blank=True, null=True)),
        migrations.AddField(model_name='gpu', name='sampled_power_limit_milliwatts',
                            field=models.BigIntegerField(blank=True, null=True)),
    ]
