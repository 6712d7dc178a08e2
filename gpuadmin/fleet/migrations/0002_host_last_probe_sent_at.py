from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0001_initial'),
    ]

    operations = [
        migrations.AddField(
            model_name='host',
            name='last_probe_sent_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
