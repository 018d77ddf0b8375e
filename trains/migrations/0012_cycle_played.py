"""The seconds the per-upgrade forecast plays an open cycle's visits to come at, stored with what
they were played from: the train's forecast reads them, the train tick plays them again only when
that changes (issue 24)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("trains", "0011_upgrade_phase_carried_hosts"),
    ]

    operations = [
        migrations.AddField(
            model_name="cycle",
            name="played_s",
            field=models.JSONField(blank=True, default=dict, help_text="{domain id: seconds} of the visits to come"),
        ),
        migrations.AddField(
            model_name="cycle",
            name="played_key",
            field=models.CharField(blank=True, help_text="what played_s was played from", max_length=32),
        ),
    ]
