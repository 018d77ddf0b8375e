"""Point Django at a scratch database inside the benchmark process."""

from __future__ import annotations

import os

import django
from django.core.management import call_command

from bench.common import scratch_database_url


def django_on_scratch_database(name: str) -> str:
    url = scratch_database_url(name)
    os.environ["DATABASE_URL"] = url
    # The production shape: DEBUG off (Django would otherwise log every query with its parameters).
    os.environ["DEBUG"] = "0"
    os.environ.setdefault("SECRET_KEY", "benchmark-only-secret-not-for-production")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    call_command("migrate", verbosity=0)
    return url
