from django.db import migrations

from opsplanner.dbconstraints import AppendOnlyTable

# Events are the audit trail: the database refuses to change or delete one, whoever asks.


class Migration(migrations.Migration):
    dependencies = [
        ("opsplanner", "0007_task_host_composite_keys"),
    ]

    operations = [
        AppendOnlyTable(
            name="event_append_only",
            table="opsplanner_event",
            message="event_append_only: events are an immutable audit trail; they cannot be changed or deleted",
        ),
    ]
