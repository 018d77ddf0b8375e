"""Fixtures of the service owners' page tests: a fixed clock, a fleet, an owner and two services."""

from __future__ import annotations

import pytest

from fleet import services
from opsplanner import clock
from opsplanner.roles import Role
from tests.builders import make_fleet, make_service
from tests.owners.helpers import NOW
from tests.trains_builders import make_user


@pytest.fixture(autouse=True)
def fixed_clock():
    """One clock for the services, the views and the forecast, so times on the page are exact."""
    with clock.use_clock(lambda: NOW):
        yield


@pytest.fixture
def fleet():
    return make_fleet(domains=2, hosts_per_domain=3, pool_name="ai-train-east")


@pytest.fixture
def owner():
    return make_user(Role.SERVICE_OWNER)


@pytest.fixture
def service(owner, fleet):
    _, hosts = fleet
    service = make_service(name="llm-train", owners=[owner])
    services.service_place(service=service, hosts=hosts[3:])  # the hosts of rack-0002
    return service


@pytest.fixture
def other_service(fleet):
    _, hosts = fleet
    service = make_service(name="web-search", owners=[make_user(Role.SERVICE_OWNER)])
    services.service_place(service=service, hosts=hosts[:3])
    return service
