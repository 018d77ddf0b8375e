# A downgrade asked while its host ran a version above the target keeps that version, so the host
# coming down part way since does not supersede it (opsplanner/services/tick/supersede.py). Tasks made
# before have none: judged as before (overtaken by any newer version the host got after them).
# Nullable, no default: SQLite adds the column in place, without rebuilding opsplanner_hosttask.

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fleet', '0011_version_withdrawn_by'),
        ('opsplanner', '0022_operation_resubmission_of'),
    ]

    operations = [
        migrations.AddField(
            model_name='hosttask',
            name='downgrade_from',
            field=models.ForeignKey(blank=True, db_index=False, help_text='an upgrade asked while its host ran a version of the component above the target: that version (tick/supersede.py: the host coming down part way since does not supersede it); null otherwise', null=True, on_delete=django.db.models.deletion.PROTECT, related_name='+', to='fleet.componentversion'),
        ),
        migrations.AddIndex(
            model_name='hosttask',
            index=models.Index(condition=models.Q(('downgrade_from__isnull', False)), fields=['downgrade_from'], name='host_task_downgrade_from_idx'),
        ),
    ]
