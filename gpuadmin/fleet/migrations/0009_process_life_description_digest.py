"""ProcessLife.description_digest: ingest compares a life's description by digest (fleet/history.py).

Lives stored before have none (null): the next snapshot that shows one finds it changed and
writes it once, digest included.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0008_latest_document_text'),
    ]

    operations = [
        migrations.AddField(
            model_name='processlife',
            name='description_digest',
            field=models.BigIntegerField(blank=True, null=True),
        ),
    ]
