"""Versions compare in SQL by their sort keys, byte by byte, whatever the database's locale: under a
locale that ignores punctuation a pre-release sorted after its release (fleet migration 0010)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from simulation.runner import sibling_database_url

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.django_db


def test_the_sort_key_column_is_compared_byte_by_byte_on_postgresql() -> None:
    # A later migration that alters the column without its collation would reset it to the
    # database's: this says so before a fleet with pre-releases finds out.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT collation_name FROM information_schema.columns "
            "WHERE table_name = 'fleet_componentversion' AND column_name = 'sort_key'"
        )
        assert cursor.fetchone()[0] == "C"


# Run by `manage.py shell` in the database whose locale ignores punctuation: what the product's
# comparisons (version__sort_key__gte, order_by sort_key) make of a release and its candidates.
COMPARE = """
import json
from fleet.models import ComponentVersion
from tests.builders import make_component, make_version
component = make_component(name="gpu-driver")
for version in ("1.0", "1.0-rc1", "1.0-rc2", "1.0.1", "0.9"):
    make_version(component, version)
release = ComponentVersion.objects.get(component=component, version="1.0")
at_or_beyond = ComponentVersion.objects.filter(component=component, sort_key__gte=release.sort_key)
print(json.dumps({
    "at_or_beyond": sorted(at_or_beyond.values_list("version", flat=True)),
    "order": list(
        ComponentVersion.objects.filter(component=component).order_by("sort_key").values_list("version", flat=True)
    ),
}))
"""


def _manage(url: str, *args: str) -> str:
    env = dict(os.environ, DATABASE_URL=url, DEBUG="1")
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
def test_a_release_candidate_stays_below_its_release_in_a_database_whose_locale_ignores_punctuation() -> None:
    db = settings.DATABASES["default"]
    name = f"test_collation_{secrets.token_hex(4)}"
    url = sibling_database_url(name)
    admin = psycopg.connect(
        dbname="postgres", user=db.get("USER") or None, host=db.get("HOST") or None, port=db.get("PORT") or None,
        autocommit=True,
    )  # fmt: skip
    with admin:
        # ICU's English with punctuation ignored at the first level, as glibc's en_US.UTF-8 does.
        admin.execute(
            f"CREATE DATABASE {name} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-u-ka-shifted' "
            "LOCALE 'C.UTF-8'"
        )
        try:
            with psycopg.connect(url) as fresh:  # the premise: this database's own order is wrong
                premise = fresh.execute("SELECT '000000001.000000000!rc1' < '000000001.000000000~'").fetchone()
            _manage(url, "migrate", "-v0")
            seen = json.loads(_manage(url, "shell", "-c", COMPARE).strip().splitlines()[-1])
        finally:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    assert premise == (False,), "in this database's locale the release candidate's key sorts after the release's"
    assert seen["at_or_beyond"] == ["1.0", "1.0.1"], "a release candidate is not at or beyond its release"
    assert seen["order"] == ["0.9", "1.0-rc1", "1.0-rc2", "1.0", "1.0.1"]
