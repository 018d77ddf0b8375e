"""A rollout phase can start with the failures (and the failure rate's successes) its live copy had
counted: a what-if on the live fleet (`simulate --from-live`) writes them on its lane's phase in
force, whose tasks it does not copy, and the train tick adds them to its counts. 0 everywhere else."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("trains", "0009_upgrade_deadline_alert_fixes"),
    ]

    operations = [
        migrations.AddField(
            model_name="upgradephase",
            name="carried_failures",
            field=models.PositiveIntegerField(
                default=0, help_text="failed hosts counted against the phase before it was created (a what-if lane's copy)"
            ),
        ),
        migrations.AddField(
            model_name="upgradephase",
            name="carried_rate_successes",
            field=models.PositiveIntegerField(
                default=0, help_text="hosts the failure rate counted as succeeded before it was created (a what-if lane's)"
            ),
        ),
    ]
