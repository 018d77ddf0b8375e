"""Drift: what OpsPlanner believed when a host last reported running something else."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0008_adapters_per_pool"),
    ]

    operations = [
        migrations.AddField(
            model_name="installedversion",
            name="drift_from",
            field=models.ForeignKey(
                blank=True,
                help_text="what OpsPlanner believed when the host last reported something else (none: no drift)",
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="+",
                to="fleet.componentversion",
            ),
        ),
        migrations.AddField(
            model_name="installedversion",
            name="drift_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddIndex(
            model_name="installedversion",
            index=models.Index(
                condition=models.Q(("drift_from__isnull", False)),
                fields=["host"],
                name="installed_drift_host_idx",
            ),
        ),
        migrations.AddConstraint(
            model_name="installedversion",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("drift_at__isnull", True), ("drift_from__isnull", True)),
                    models.Q(("drift_at__isnull", False), ("drift_from__isnull", False)),
                    _connector="OR",
                ),
                name="installed_version_drift_complete",
            ),
        ),
    ]
