# An ad-hoc operation resubmitted by a withdrawal (the version that superseded its work withdrawn
# and rolled back below it) names the operation it asks for again.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('opsplanner', '0021_failure_code_runs_withdrawn'),
    ]

    operations = [
        migrations.AddField(
            model_name='operation',
            name='resubmission_of',
            field=models.ForeignKey(blank=True, help_text='the ad-hoc operation whose superseded work this one asks for again, the version that superseded it withdrawn (opsplanner.services.resubmission)', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='resubmissions', to='opsplanner.operation'),
        ),
    ]
