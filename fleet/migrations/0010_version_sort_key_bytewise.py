"""Version sort keys compare byte by byte on PostgreSQL, whatever the database's locale.

The sort key (fleet/versions.py) orders versions as plain strings: '!' before '~' puts a
pre-release before its release. SQL compares it with the column's collation, by default the
database's: under a locale that ignores punctuation (glibc's en_US.UTF-8, an ICU locale with
alternate=shifted) "1.0-rc1" sorted after "1.0", so a host on the release candidate counted as
already running the release, and the release upgrade skipped it. The column is compared under "C"
from now on. SQLite compares text byte by byte (BINARY) already.
"""

from django.db import migrations

SORT_KEY_LENGTH = 93  # fleet.versions.SORT_KEY_LENGTH when this was written


def _alter(schema_editor, collation):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"ALTER TABLE fleet_componentversion ALTER COLUMN sort_key "
            f'TYPE varchar({SORT_KEY_LENGTH}) COLLATE "{collation}"'
        )


def bytewise(apps, schema_editor):
    _alter(schema_editor, "C")


def as_the_database(apps, schema_editor):
    _alter(schema_editor, "default")


class Migration(migrations.Migration):
    dependencies = [("fleet", "0009_installed_version_drift")]

    operations = [migrations.RunPython(bytewise, as_the_database, elidable=False)]
