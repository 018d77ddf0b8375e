"""An upgrade remembers the fixes its deadline alerts advised (their causes), so a new cause is alerted
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
        # Without a fix to remember, no alert is in force: the mark is cleared, as the field says.
        changes = {"deadline_alert_fixes": [fix]} if fix else {"deadline_alerted_at": None}
        Upgrade.objects.filter(pk=upgrade_id).update(**changes)


class Migration(migrations.Migration):
    dependencies = [
        ("trains", "0008_operations_or_newer"),
        ("opsplanner", "0019_operation_or_newer"),
    ]

    operations = [
        migrations.AddField(
            model_name="upgrade",
            name="deadline_alert_fixes",
            field=models.JSONField(
                blank=True, default=list, help_text="the fixes the alerts in force advised, in order; empty: none in force"
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
