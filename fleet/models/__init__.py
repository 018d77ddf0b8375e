from fleet.models.components import (
    RELEASED_WHERE,
    CompatibilityRule,
    Component,
    ComponentLayer,
    ComponentVersion,
    InstalledVersion,
    WithdrawnBy,
)
from fleet.models.hosts import FAILURE_OUT_STATES, PLANNED_OUT_STATES, Host, HostState
from fleet.models.pools import BufferSize, DomainKind, MaintenanceDomain, Pool, WorkloadClass
from fleet.models.services import CapacityReservation, OptOutWindow, Service, ServicePlacement

__all__ = [
    "FAILURE_OUT_STATES",
    "PLANNED_OUT_STATES",
    "RELEASED_WHERE",
    "BufferSize",
    "CapacityReservation",
    "CompatibilityRule",
    "Component",
    "ComponentLayer",
    "ComponentVersion",
    "DomainKind",
    "Host",
    "HostState",
    "InstalledVersion",
    "MaintenanceDomain",
    "OptOutWindow",
    "Pool",
    "Service",
    "ServicePlacement",
    "WithdrawnBy",
    "WorkloadClass",
]
