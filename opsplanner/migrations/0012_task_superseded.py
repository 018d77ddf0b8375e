# Superseded versions skipped: a cancelled task may have the code superseded (a newer version
# of the component went to its host in its place).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0009_installed_version_drift"),
        ("opsplanner", "0011_adapters_per_pool"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="hosttask",
            name="host_task_failure_code_fits_state",
        ),
        migrations.AlterField(
            model_name="hosttask",
            name="failure_code",
            field=models.CharField(
                blank=True,
                choices=[
                    ("drain_failed", "Drain failed"),
                    ("execute_failed", "Execution failed"),
                    ("unknown_version", "Executor reported a version not in the catalogue"),
                    ("check_failed", "Verification failed"),
                    ("not_returnable", "Pre-return gate refused"),
                    ("return_failed", "Return to service failed"),
                    ("cancelled", "Cancelled"),
                    ("superseded", "Superseded by a newer version"),
                ],
                default="",
                max_length=16,
            ),
        ),
        migrations.AddConstraint(
            model_name="hosttask",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(
                        (
                            "failure_code__in",
                            [
                                "drain_failed",
                                "execute_failed",
                                "unknown_version",
                                "check_failed",
                                "not_returnable",
                                "return_failed",
                            ],
                        ),
                        ("state", "failed"),
                    ),
                    models.Q(("failure_code__in", ["cancelled", "superseded"]), ("state", "cancelled")),
                    models.Q(models.Q(("state__in", ["failed", "cancelled"]), _negated=True), ("failure_code", "")),
                    _connector="OR",
                ),
                name="host_task_failure_code_fits_state",
                violation_error_message=(
                    "A failed task has the code of its failure, a cancelled task the code cancelled or "
                    "superseded, and no other task has a failure code."
                ),
            ),
        ),
    ]
