from django.db import migrations, models
from django.db.models import Exists, OuterRef, Subquery


def cancellations_dated(apps, schema_editor):
    """A closed cancelled operation was cancelled when it closed; an open one that an operator was
    cancelling (its tasks under way still finishing) when its `operation.cancelling` event says."""
    Operation = apps.get_model("opsplanner", "Operation")
    Event = apps.get_model("opsplanner", "Event")
    Operation.objects.filter(state="cancelled").update(cancelled_at=models.F("closed_at"))
    cancelling = Event.objects.filter(
        kind="operation.cancelling", subject_type="opsplanner.operation", subject_id=OuterRef("pk")
    ).order_by("created_at")
    Operation.objects.filter(Exists(cancelling), state="open").update(
        cancelled_at=Subquery(cancelling.values("created_at")[:1])
    )


class Migration(migrations.Migration):
    dependencies = [
        ("opsplanner", "0015_host_task_open_idx"),
    ]

    operations = [
        migrations.AddField(
            model_name="operation",
            name="cancelled_at",
            field=models.DateTimeField(
                blank=True,
                help_text="when it was cancelled; tasks then under way finish, and it closes cancelled",
                null=True,
            ),
        ),
        migrations.RunPython(cancellations_dated, migrations.RunPython.noop),
    ]
