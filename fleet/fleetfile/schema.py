"""The fleet file: one YAML (or JSON) document declaring pools, domains, hosts, components and
versions, compatibility rules and services. parse_fleet_file reads and validates it into frozen
dataclasses; every problem is collected with its place (`hosts[1832].domain: ...`), none is fatal
to the others, and FleetFileInvalid carries them all. docs/fleet-file.md describes every field."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import yaml
from django.core.exceptions import ValidationError

from fleet.fleetfile.reader import Problem, Reader
from fleet.fleetfile.yamlfast import yaml_load
from fleet.models import ComponentLayer, DomainKind, WorkloadClass
from fleet.versions import version_sort_key
from opsplanner.adapters import DRAINERS, EXECUTORS, Adapter

FORMAT_VERSION = 1
MAX_HOSTS_COUNT = 2_147_483_647
FRACTION_PLACES = Decimal("0.0001")
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
NAME_HINT = "use lowercase letters, digits and dashes (up to 63 characters), starting with a letter or digit"
HOSTNAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")


class FleetFileInvalid(ValidationError):
    """The document has problems: `problems` lists every one with its place. Nothing was written."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__([str(problem) for problem in problems], code="invalid")


@dataclass(frozen=True, slots=True)
class DomainSpec:
    name: str
    kind: str
    position: int
    index: int


@dataclass(frozen=True, slots=True)
class PoolSpec:
    name: str
    workload_class: str
    description: str
    planned_buffer_hosts: int | None
    planned_buffer_fraction: Decimal | None
    failure_buffer_hosts: int | None
    failure_buffer_fraction: Decimal | None
    hard_floor_hosts: int | None
    domains: tuple[DomainSpec, ...]
    index: int
    executor: str = Adapter.SIMULATED.value
    drainer: str = Adapter.SIMULATED.value


@dataclass(frozen=True, slots=True)
class HostSpec:
    hostname: str
    pool: str
    domain: str
    sku: str
    gpu_count: int
    labels: dict[str, Any]
    index: int  # its place in the file: hosts[index]


@dataclass(frozen=True, slots=True)
class VersionSpec:
    version: str
    withdrawn_reason: str | None  # None: released
    index: int


@dataclass(frozen=True, slots=True)
class ComponentSpec:
    name: str
    display_name: str
    layer: str
    needs_drain: bool
    needs_reboot: bool
    versions: tuple[VersionSpec, ...]
    index: int


@dataclass(frozen=True, slots=True)
class RuleSpec:
    job_facing: str
    version: str
    lower: str
    min_version: str
    max_version: str
    note: str
    index: int

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.job_facing, self.version, self.lower, self.min_version, self.max_version)


@dataclass(frozen=True, slots=True)
class PlacementSpec:
    hostname: str
    running_jobs: int
    index: int


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    name: str
    display_name: str
    description: str
    owners: tuple[str, ...]
    placements: tuple[PlacementSpec, ...]
    index: int


@dataclass(frozen=True)
class FleetSpec:
    pools: tuple[PoolSpec, ...] = ()
    hosts: tuple[HostSpec, ...] = ()
    components: tuple[ComponentSpec, ...] = ()
    rules: tuple[RuleSpec, ...] = ()
    services: tuple[ServiceSpec, ...] = ()


def load_document(text: str | bytes) -> Any:
    """The document as Python data: JSON when it looks like JSON, else YAML (fleet.fleetfile.yamlfast)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as error:
            raise FleetFileInvalid([Problem("document", f"not UTF-8 text: {error}")]) from None
    try:
        return _json_or_yaml(text)
    except yaml.YAMLError as error:
        raise FleetFileInvalid([Problem("document", f"not valid YAML: {error}".replace("\n", " "))]) from None
    except RecursionError:
        raise FleetFileInvalid([Problem("document", "nested too deeply to read")]) from None
    except ValueError as error:  # an impossible date (2024-02-30), an integer of over 4300 digits
        message = str(error).split(";")[0]  # without Python's advice to raise its digit limit
        raise FleetFileInvalid([Problem("document", f"a value cannot be read: {message}")]) from None


def _json_or_yaml(text: str) -> Any:
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass  # YAML's flow style starts with { too
    return yaml_load(text)


def parse_fleet_file(text: str | bytes) -> FleetSpec:
    """Read and validate a fleet file; raise FleetFileInvalid listing every problem."""
    return fleet_spec_from_document(load_document(text))


def fleet_spec_from_document(document: Any) -> FleetSpec:
    reader = Reader()
    top = reader.mapping(document, "document", {"version", "pools", "hosts", "components", "compatibility", "services"})
    if top is None:
        raise FleetFileInvalid(reader.problems)
    if "version" in top and top["version"] != FORMAT_VERSION:
        reader.add("version", f"this is format version {FORMAT_VERSION}; the file says {top['version']!r}")
    pools = tuple(_each(reader, top, "pools", _pool))
    components = tuple(_each(reader, top, "components", _component))
    hosts = tuple(_each(reader, top, "hosts", _host))
    rules = tuple(_each(reader, top, "compatibility", _rule))
    services = tuple(_each(reader, top, "services", _service))
    spec = FleetSpec(pools=pools, hosts=hosts, components=components, rules=rules, services=services)
    _cross_check(reader, spec)
    if reader.problems:
        raise FleetFileInvalid(reader.problems)
    return spec


def _each(reader: Reader, top: dict[str, Any], key: str, parse: Callable[[Reader, Any, str, int], Any]) -> list[Any]:
    items = reader.sequence(top.get(key, []), key)
    parsed = (parse(reader, item, f"{key}[{index}]", index) for index, item in enumerate(items))
    return [item for item in parsed if item is not None]


# Pools and domains -------------------------------------------------------------------------------

POOL_KEYS = {
    "name",
    "workload_class",
    "description",
    "planned_buffer",
    "failure_buffer",
    "hard_floor",
    "executor",
    "drainer",
    "domains",
}
EXECUTOR_NAMES = [a.value for a in EXECUTORS]
DRAINER_NAMES = [a.value for a in DRAINERS]


def _pool(reader: Reader, raw: Any, place: str, index: int) -> PoolSpec | None:
    data = reader.mapping(
        raw, place, POOL_KEYS, required=("name", "workload_class", "planned_buffer", "failure_buffer")
    )
    if data is None:
        return None
    name = reader.name(data.get("name"), f"{place}.name")
    workload = reader.choice(data.get("workload_class"), f"{place}.workload_class", WorkloadClass.values)
    planned = _buffer(reader, data.get("planned_buffer"), f"{place}.planned_buffer")
    failure = _buffer(reader, data.get("failure_buffer"), f"{place}.failure_buffer")
    if planned and failure and planned[1] is not None and failure[1] is not None and planned[1] + failure[1] >= 1:
        reader.add(f"{place}.failure_buffer", "the planned and failure fractions together must be below 1")
    hard_floor = data.get("hard_floor")
    if hard_floor is not None:
        hard_floor = reader.integer(hard_floor, f"{place}.hard_floor", 0, MAX_HOSTS_COUNT)
    domains = [
        _domain(reader, item, f"{place}.domains[{index}]", index)
        for index, item in enumerate(reader.sequence(data.get("domains", []), f"{place}.domains"))
    ]
    description = reader.text(data.get("description", ""), f"{place}.description", 10_000, blank=True)
    executor = reader.choice(data.get("executor", Adapter.SIMULATED.value), f"{place}.executor", EXECUTOR_NAMES)
    drainer = reader.choice(data.get("drainer", Adapter.SIMULATED.value), f"{place}.drainer", DRAINER_NAMES)
    if name is not None:
        raw = data.get("domains") if isinstance(data.get("domains"), list) else []
        reader.pools[name] = {str(d.get("name") if isinstance(d, dict) else d) for d in raw}
    if (
        name is None
        or workload is None
        or planned is None
        or failure is None
        or description is None
        or executor is None
        or drainer is None
    ):
        return None
    return PoolSpec(
        name=name,
        workload_class=workload,
        description=description,
        planned_buffer_hosts=planned[0],
        planned_buffer_fraction=planned[1],
        failure_buffer_hosts=failure[0],
        failure_buffer_fraction=failure[1],
        hard_floor_hosts=hard_floor,
        domains=tuple(d for d in domains if d is not None),
        index=index,
        executor=executor,
        drainer=drainer,
    )


def _buffer(reader: Reader, value: Any, place: str) -> tuple[int | None, Decimal | None] | None:
    """(hosts, None) for a whole number, (None, fraction) for a number below 1 or a percentage."""
    if isinstance(value, bool) or value is None:
        reader.add(place, "give a host count (a whole number) or a fraction below 1 (0.05 or '5%')")
        return None
    if isinstance(value, int):
        count = reader.integer(value, place, 0, MAX_HOSTS_COUNT)
        return None if count is None else (count, None)
    try:
        if isinstance(value, str) and value.strip().endswith("%"):
            fraction = Decimal(value.strip()[:-1].strip()) / 100
        elif isinstance(value, str) and value.strip().isdigit():
            return _buffer(reader, int(value.strip()), place)
        else:
            fraction = Decimal(str(value))
    except (InvalidOperation, ValueError):
        reader.add(place, f"{value!r} is neither a host count nor a fraction")
        return None
    if not fraction.is_finite() or not Decimal(0) <= fraction < 1:
        reader.add(place, f"a fraction must be at least 0 and below 1, not {value}; give hosts as a whole number")
        return None
    if fraction != fraction.quantize(FRACTION_PLACES):
        reader.add(place, f"a fraction has at most 4 decimal places, not {value}")
        return None
    return (None, fraction.quantize(FRACTION_PLACES))


def _domain(reader: Reader, raw: Any, place: str, index: int) -> DomainSpec | None:
    if isinstance(raw, str):
        raw = {"name": raw}
    data = reader.mapping(raw, place, {"name", "kind", "position"}, required=("name",))
    if data is None:
        return None
    name = reader.name(data.get("name"), f"{place}.name")
    kind = reader.choice(data.get("kind", DomainKind.RACK), f"{place}.kind", DomainKind.values)
    position = reader.integer(data.get("position", index + 1), f"{place}.position", 0, MAX_HOSTS_COUNT)
    if name is None or kind is None or position is None:
        return None
    return DomainSpec(name=name, kind=kind, position=position, index=index)


# Hosts -------------------------------------------------------------------------------------------

HOST_KEYS = {"hostname", "pool", "domain", "sku", "gpu_count", "labels"}


def _host(reader: Reader, raw: Any, place: str, index: int) -> HostSpec | None:
    data = reader.mapping(raw, place, HOST_KEYS, required=("hostname", "pool", "domain", "sku"))
    if data is None:
        return None
    hostname = reader.text(data.get("hostname"), f"{place}.hostname", 253)
    if hostname is not None and not HOSTNAME_RE.match(hostname):
        reader.add(f"{place}.hostname", f"{hostname!r} is not a lowercase DNS name (letters, digits, dashes, dots)")
        hostname = None
    pool = reader.text(data.get("pool"), f"{place}.pool", 63)
    domain = reader.text(data.get("domain"), f"{place}.domain", 63)
    sku = reader.text(data.get("sku"), f"{place}.sku", 64)
    gpu_count = reader.integer(data.get("gpu_count", 0), f"{place}.gpu_count", 0, 64)
    labels = reader.labels(data.get("labels", {}), f"{place}.labels")
    if hostname is not None:
        reader.hostnames.add(hostname)
    if pool is not None and pool not in reader.pools:
        reader.add(f"{place}.pool", f"no pool {pool!r} in the file")
    elif pool is not None and domain is not None and domain not in reader.pools[pool]:
        reader.add(f"{place}.domain", f"no domain {domain!r} in pool {pool}")
    if hostname is None or pool is None or domain is None or sku is None or gpu_count is None or labels is None:
        return None
    return HostSpec(
        hostname=hostname, pool=pool, domain=domain, sku=sku, gpu_count=gpu_count, labels=labels, index=index
    )


# Components, versions, compatibility -------------------------------------------------------------

COMPONENT_KEYS = {"name", "display_name", "layer", "needs_drain", "needs_reboot", "versions"}


def _component(reader: Reader, raw: Any, place: str, index: int) -> ComponentSpec | None:
    data = reader.mapping(raw, place, COMPONENT_KEYS, required=("name", "layer"))
    if data is None:
        return None
    name = reader.name(data.get("name"), f"{place}.name")
    display = reader.text(data.get("display_name", name or ""), f"{place}.display_name", 120, blank=True)
    layer = reader.choice(data.get("layer"), f"{place}.layer", ComponentLayer.values)
    needs_drain = reader.boolean(data.get("needs_drain", True), f"{place}.needs_drain")
    needs_reboot = reader.boolean(data.get("needs_reboot", True), f"{place}.needs_reboot")
    versions = [
        _version(reader, item, f"{place}.versions[{index}]", index)
        for index, item in enumerate(reader.sequence(data.get("versions", []), f"{place}.versions"))
    ]
    if name is not None:
        raw = data.get("versions") if isinstance(data.get("versions"), list) else []
        reader.components[name] = (layer, {str(v.get("version") if isinstance(v, dict) else v) for v in raw})
    if name is None or display is None or layer is None or needs_drain is None or needs_reboot is None:
        return None
    return ComponentSpec(
        name=name,
        display_name=display or name,
        layer=layer,
        needs_drain=needs_drain,
        needs_reboot=needs_reboot,
        versions=tuple(v for v in versions if v is not None),
        index=index,
    )


def _version(reader: Reader, raw: Any, place: str, index: int) -> VersionSpec | None:
    if not isinstance(raw, dict):
        raw = {"version": raw}
    data = reader.mapping(raw, place, {"version", "withdrawn"}, required=("version",))
    if data is None:
        return None
    version = reader.version(data.get("version"), f"{place}.version" if "withdrawn" in data else place)
    withdrawn = data.get("withdrawn")
    if withdrawn is not None:
        withdrawn = reader.text(withdrawn, f"{place}.withdrawn", 500, blank=True)
    if version is None or ("withdrawn" in data and withdrawn is None):
        return None
    return VersionSpec(version=version, withdrawn_reason=withdrawn, index=index)


RULE_KEYS = {"job_facing", "version", "lower", "min", "max", "note"}


def _rule(reader: Reader, raw: Any, place: str, index: int) -> RuleSpec | None:
    data = reader.mapping(raw, place, RULE_KEYS, required=("job_facing", "version", "lower"))
    if data is None:
        return None
    job_facing = reader.name(data.get("job_facing"), f"{place}.job_facing")
    version = reader.version(data.get("version"), f"{place}.version")
    lower = reader.name(data.get("lower"), f"{place}.lower")
    low = reader.version(data.get("min", ""), f"{place}.min", blank=True)
    high = reader.version(data.get("max", ""), f"{place}.max", blank=True)
    note = reader.text(data.get("note", ""), f"{place}.note", 200, blank=True)
    _rule_references(reader, place, job_facing, version, lower)
    if low == "" and high == "":
        reader.add(place, "give at least one bound (min or max)")
        return None
    if low and high and version_sort_key(low) > version_sort_key(high):
        reader.add(f"{place}.max", f"{high} is below the lowest version {low}")
        return None
    if job_facing is None or version is None or lower is None or low is None or high is None or note is None:
        return None
    return RuleSpec(
        job_facing=job_facing, version=version, lower=lower, min_version=low, max_version=high, note=note, index=index
    )


def _rule_references(
    reader: Reader, place: str, job_facing: str | None, version: str | None, lower: str | None
) -> None:
    declared = reader.components
    if job_facing is not None and job_facing not in declared:
        reader.add(f"{place}.job_facing", f"no component {job_facing!r} in the file")
    elif job_facing is not None and declared[job_facing][0] not in (None, ComponentLayer.JOB_FACING):
        reader.add(f"{place}.job_facing", f"{job_facing} is not a job-facing component")
    elif job_facing is not None and version is not None and version not in declared[job_facing][1]:
        reader.add(f"{place}.version", f"no version {version} of {job_facing} in the file")
    if lower is not None and lower not in declared:
        reader.add(f"{place}.lower", f"no component {lower!r} in the file")
    elif lower is not None and declared[lower][0] not in (None, ComponentLayer.LOWER_LEVEL):
        reader.add(f"{place}.lower", f"{lower} is not a lower-level component")


# Services ----------------------------------------------------------------------------------------

SERVICE_KEYS = {"name", "display_name", "description", "owners", "placements"}


def _service(reader: Reader, raw: Any, place: str, index: int) -> ServiceSpec | None:
    data = reader.mapping(raw, place, SERVICE_KEYS, required=("name",))
    if data is None:
        return None
    name = reader.name(data.get("name"), f"{place}.name")
    display = reader.text(data.get("display_name", name or ""), f"{place}.display_name", 120, blank=True)
    description = reader.text(data.get("description", ""), f"{place}.description", 10_000, blank=True)
    owners = [
        reader.text(owner, f"{place}.owners[{i}]", 150)
        for i, owner in enumerate(reader.sequence(data.get("owners", []), f"{place}.owners"))
    ]
    placements = [
        _placement(reader, item, f"{place}.placements[{i}]", i)
        for i, item in enumerate(reader.sequence(data.get("placements", []), f"{place}.placements"))
    ]
    known_owners = [owner for owner in owners if owner is not None]
    known_placements = [placement for placement in placements if placement is not None]
    if (
        name is None
        or display is None
        or description is None
        or len(known_owners) < len(owners)
        or len(known_placements) < len(placements)
    ):
        return None
    return ServiceSpec(
        name=name,
        display_name=display or name,
        description=description,
        owners=tuple(known_owners),
        placements=tuple(known_placements),
        index=index,
    )


def _placement(reader: Reader, raw: Any, place: str, index: int) -> PlacementSpec | None:
    if not isinstance(raw, dict):
        raw = {"host": raw}
    data = reader.mapping(raw, place, {"host", "running_jobs"}, required=("host",))
    if data is None:
        return None
    host = reader.text(data.get("host"), f"{place}.host" if "running_jobs" in data else place, 253)
    jobs = reader.integer(data.get("running_jobs", 1), f"{place}.running_jobs", 0, MAX_HOSTS_COUNT)
    if host is not None and host not in reader.hostnames:
        reader.add(place, f"no host {host!r} in the file")
        return None
    if host is None or jobs is None:
        return None
    return PlacementSpec(hostname=host, running_jobs=jobs, index=index)


# Across sections ---------------------------------------------------------------------------------


def _cross_check(reader: Reader, spec: FleetSpec) -> None:
    """Names unique where they must be, and every reference to something the file declares."""
    domains: dict[str, set[str]] = {}
    for pool in _unique(reader, spec.pools, "pools", lambda p: p.name, "pool"):
        domains[pool.name] = set()
        for domain in pool.domains:
            if domain.name in domains[pool.name]:
                reader.add(
                    f"pools[{pool.index}].domains[{domain.index}].name",
                    f"domain {domain.name!r} is named twice in the pool",
                )
            domains[pool.name].add(domain.name)
    hostnames: set[str] = set()
    for host in spec.hosts:
        place = f"hosts[{host.index}]"
        if host.hostname in hostnames:
            reader.add(f"{place}.hostname", f"host {host.hostname!r} is named twice")
        hostnames.add(host.hostname)
    _check_components(reader, spec)
    _check_services(reader, spec)


def _unique(reader: Reader, items: tuple[Any, ...], section: str, key: Callable[[Any], str], what: str) -> list[Any]:
    seen: set[str] = set()
    for item in items:
        if key(item) in seen:
            reader.add(f"{section}[{item.index}].name", f"{what} {key(item)!r} is named twice")
        seen.add(key(item))
    return list(items)


def _check_components(reader: Reader, spec: FleetSpec) -> None:
    for component in _unique(reader, spec.components, "components", lambda c: c.name, "component"):
        versions: set[str] = set()
        for version in component.versions:
            if version.version in versions:
                reader.add(
                    f"components[{component.index}].versions[{version.index}]",
                    f"version {version.version} is named twice",
                )
            versions.add(version.version)
    seen: set[tuple[str, ...]] = set()
    for rule in spec.rules:
        if rule.key in seen:
            reader.add(f"compatibility[{rule.index}]", "this rule is named twice")
        seen.add(rule.key)


def _check_services(reader: Reader, spec: FleetSpec) -> None:
    for service in _unique(reader, spec.services, "services", lambda s: s.name, "service"):
        place = f"services[{service.index}]"
        placed: set[str] = set()
        for placement in service.placements:
            if placement.hostname in placed:
                reader.add(f"{place}.placements[{placement.index}]", f"host {placement.hostname} is placed twice")
            placed.add(placement.hostname)
        for index, owner in enumerate(service.owners):
            if service.owners.index(owner) != index:
                reader.add(f"{place}.owners[{index}]", f"owner {owner!r} is named twice")


__all__ = [
    "ComponentSpec",
    "DomainSpec",
    "FleetFileInvalid",
    "FleetSpec",
    "HostSpec",
    "PlacementSpec",
    "PoolSpec",
    "Problem",
    "RuleSpec",
    "ServiceSpec",
    "VersionSpec",
    "load_document",
    "parse_fleet_file",
]
