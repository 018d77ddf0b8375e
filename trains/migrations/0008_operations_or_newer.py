"""A train's operations, regular or emergency, take their target or a newer release (Operation.or_newer)."""

from django.db import migrations


def trains_operations_or_newer(apps, schema_editor):
    Operation = apps.get_model("opsplanner", "Operation")
    Operation.objects.filter(visit_link__isnull=False, or_newer=False).update(or_newer=True)


class Migration(migrations.Migration):
    dependencies = [
        ("trains", "0007_visit_operation_catch_up"),
        ("opsplanner", "0019_operation_or_newer"),
    ]

    operations = [migrations.RunPython(trains_operations_or_newer, migrations.RunPython.noop)]
