# job.watched: report statements NOTIFY only for jobs a producer waits for.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('jobqueue', '0011_group_finished'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='watched',
            field=models.BooleanField(db_default=False, editable=False),
        ),
    ]
