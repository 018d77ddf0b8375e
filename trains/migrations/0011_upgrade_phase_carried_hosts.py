"""A what-if lane's phase carries the hosts its live copy had counted, not a count: the count added
to the lane's own counted a host that failed live and again in the lane twice, and one that failed
live and succeeded in the lane as a failure and a success of the rate. The live fleet's phases never
carried anything (the counts were 0): nothing to move."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("trains", "0010_upgrade_phase_carried_failures"),
    ]

    operations = [
        migrations.RemoveField(
            model_name="upgradephase",
            name="carried_failures",
        ),
        migrations.RemoveField(
            model_name="upgradephase",
            name="carried_rate_successes",
        ),
        migrations.AddField(
            model_name="upgradephase",
            name="carries_live_hosts",
            field=models.BooleanField(
                default=False, help_text="whether the phase counts hosts its live copy had counted (a what-if lane's)"
            ),
        ),
        migrations.CreateModel(
            name="CarriedHost",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("host_id", models.BigIntegerField(blank=True, null=True)),
                (
                    "failed",
                    models.BooleanField(
                        help_text="counted against the policy live (else a success its failure rate counted)"
                    ),
                ),
                (
                    "phase",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="carried_hosts",
                        to="trains.upgradephase",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(fields=("phase", "host_id"), name="carried_host_once_per_phase")
                ],
            },
        ),
    ]
