"""Hosts get free-form labels (from the fleet file) and a `retired` state (hosts the fleet file no
longer names: kept for history, counted nowhere, chosen by nothing)."""

from django.db import migrations, models

from opsplanner.dbconstraints import SqliteRestoreCompositeForeignKey, SqliteSuspendCompositeForeignKey

# SQLite rebuilds fleet_host for the new column and check constraint; its composite-key triggers go and come back.
HOST_DOMAIN_KEY = {
    "name": "host_domain_in_host_pool",
    "table": "fleet_host",
    "columns": ["domain_id", "pool_id"],
    "ref_table": "fleet_maintenancedomain",
    "ref_columns": ["id", "pool_id"],
    "message": "host_domain_in_host_pool: a host's domain must belong to the host's pool",
}
STATES = ["in_service", "draining", "maintenance", "verifying", "returning", "failed", "repair", "escalated"]
LABELS = [
    ("in_service", "In service"),
    ("draining", "Draining"),
    ("maintenance", "In maintenance"),
    ("verifying", "Verifying"),
    ("returning", "Returning to service"),
    ("failed", "Failed"),
    ("repair", "In repair"),
    ("escalated", "Escalated to a human"),
]


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0006_fewer_write_indexes"),
    ]

    operations = [
        SqliteSuspendCompositeForeignKey(**HOST_DOMAIN_KEY),
        migrations.RemoveConstraint(model_name="host", name="host_state_valid"),
        migrations.AddField(
            model_name="host",
            name="labels",
            field=models.JSONField(blank=True, db_default=models.Value({}, models.JSONField()), default=dict),
        ),
        migrations.AlterField(
            model_name="host",
            name="state",
            field=models.CharField(choices=[*LABELS, ("retired", "Retired")], default="in_service", max_length=16),
        ),
        migrations.AddConstraint(
            model_name="host",
            constraint=models.CheckConstraint(
                condition=models.Q(("state__in", [*STATES, "retired"])),
                name="host_state_valid",
                violation_error_message="Unknown host state.",
            ),
        ),
        SqliteRestoreCompositeForeignKey(**HOST_DOMAIN_KEY),
    ]
