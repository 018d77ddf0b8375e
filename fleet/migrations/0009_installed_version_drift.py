"""Drift: what OpsPlanner believed when a host last reported running something else."""

import django.db.models.deletion
from django.db import migrations, models

from opsplanner.dbconstraints import SqliteRestoreCompositeForeignKey, SqliteSuspendCompositeForeignKey

# SQLite rebuilds fleet_installedversion for the new columns; its composite-key triggers go and come back.
INSTALLED_VERSION_KEY = {
    "name": "installed_version_of_component",
    "table": "fleet_installedversion",
    "columns": ["version_id", "component_id"],
    "ref_table": "fleet_componentversion",
    "ref_columns": ["id", "component_id"],
    "message": "installed_version_of_component: the version must be a version of the component",
}


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0008_adapters_per_pool"),
    ]

    operations = [
        SqliteSuspendCompositeForeignKey(**INSTALLED_VERSION_KEY),
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
        SqliteRestoreCompositeForeignKey(**INSTALLED_VERSION_KEY),
    ]
