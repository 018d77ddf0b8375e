"""The fleet file: the inventory declared in one document, planned and applied like `kubectl apply`.

schema (parse and validate, every problem with its place) → live (one read per kind) → plan (the
diff) → safety (refusals) → apply (one transaction, set-based writes, an event per change); export
writes the live inventory back in the same format. See docs/fleet-file.md."""

from fleet.fleetfile.apply import FleetApplyRefused, fleet_apply, plan_json, plan_text
from fleet.fleetfile.plan import Change, FleetPlan
from fleet.fleetfile.schema import FleetFileInvalid, FleetSpec, Problem, load_document, parse_fleet_file

__all__ = [
    "Change",
    "FleetApplyRefused",
    "FleetFileInvalid",
    "FleetPlan",
    "FleetSpec",
    "Problem",
    "fleet_apply",
    "load_document",
    "parse_fleet_file",
    "plan_json",
    "plan_text",
]
