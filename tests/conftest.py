"""The suite runs against real PostgreSQL and Redis, never a silent SQLite fallback."""

from __future__ import annotations

import os

import pytest
from django.conf import settings

from config.preflight import ServiceUnavailable, require_postgres, require_redis


def pytest_configure(config: pytest.Config) -> None:
    # Worker processes started by tests enqueue follow-up steps themselves; this process does not.
    settings.KICK_TASKS = False
    try:
        if settings.DATABASE_IS_SQLITE:
            raise ServiceUnavailable(
                "DATABASE_URL is unset or SQLite; the tests need PostgreSQL. Run `make test`, or set "
                "DATABASE_URL=postgresql://postgres@127.0.0.1:5432/opsplanner"
            )
        require_postgres(os.environ["DATABASE_URL"])
        require_redis(os.environ.get("REDIS_URL", ""))
    except ServiceUnavailable as error:
        pytest.exit(f"tests need real servers: {error}", returncode=2)


@pytest.fixture
def operator(django_user_model):
    from opsplanner.roles import Role, roles_ensure

    user = django_user_model.objects.create_user(username="op", password="op-password-1")
    user.groups.add(roles_ensure()[Role.OPERATOR])
    return user


# Fixtures registered for every test module: the advisor's runs recorded instead of sent to the broker,
# and the browser tests' real web server and Chromium.
from tests.advisor_helpers import enqueued  # noqa: E402, F401
from tests.browser import chromium, live_server_idle_before_flush, live_server_process  # noqa: E402, F401
