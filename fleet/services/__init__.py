"""Services that write the inventory: one transaction each, validated, with their events."""

from fleet.services.hosts import HostTransitionError, host_create, host_transition
from fleet.services.inventory import (
    compatibility_rule_create,
    component_create,
    component_version_create,
    domain_create,
    installed_version_set,
    pool_create,
)
from fleet.services.owners import (
    optout_window_cancel,
    optout_window_create,
    optout_window_update,
    reservation_cancel,
    reservation_create,
    reservation_update,
    service_create,
    service_place,
)

__all__ = [
    "HostTransitionError",
    "compatibility_rule_create",
    "component_create",
    "component_version_create",
    "domain_create",
    "host_create",
    "host_transition",
    "installed_version_set",
    "optout_window_cancel",
    "optout_window_create",
    "optout_window_update",
    "pool_create",
    "reservation_cancel",
    "reservation_create",
    "reservation_update",
    "service_create",
    "service_place",
]
