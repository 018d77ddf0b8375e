"""An upgrade remembers the fix its deadline alert advised (its cause), so a new cause is alerted
again and a deadline met again clears the alert (trains/services/upgrade_forecast.py). Upgrades
alerted before take the fix of their last alert, so they are not alerted again for the same cause."""

from django.db import migrations, models


def upgrades_alert_fix_from_events(apps, schema_editor):
    Upgrade = apps.get_model("trains", "Upgrade")
    Event = apps.get_model("opsplanner", "Event")
    for upgrade_id in Upgrade.objects.filter(deadline_alerted_at__isnull=False).values_list("id", flat=True):
        last = (
            Event.objects.filter(
                kind="alert.upgrade_deadline_at_risk", subject_type="trains.upgrade", subject_id=upgrade_id
            )
            .order_by("-id")
            .values_list("data", flat=True)
            .first()
        )
        fix = (last or {}).get("fix") or ""
        if fix:
            Upgrade.objects.filter(pk=upgrade_id).update(deadline_alert_fix=fix[:32])


class Migration(migrations.Migration):
    dependencies = [
        ("trains", "0008_operations_or_newer"),
        ("opsplanner", "0019_operation_or_newer"),
    ]

    operations = [
        migrations.AddField(
            model_name="upgrade",
            name="deadline_alert_fix",
            field=models.CharField(
                blank=True, default="", help_text="the fix that alert advised; empty: no alert in force", max_length=32
            ),
        ),
        migrations.AlterField(
            model_name="upgrade",
            name="deadline_alerted_at",
            field=models.DateTimeField(
                blank=True,
                help_text="when the forecast last said, for a new cause, the deadline cannot be met",
                null=True,
            ),
        ),
        migrations.RunPython(upgrades_alert_fix_from_events, migrations.RunPython.noop),
    ]
