"""Writes of the inventory, one change at a time (operators; service owners place their own
services; operators and executors report what a host runs). Each endpoint reads its input, calls one
service (fleet.services.host_changes, host_versions, catalogue, inventory, owners, or the fleet
file's hosts source for bulk creation) and answers the changed row. See docs/fleet-file.md
("Through the API")."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.response import Response

from console.api.idempotency import idempotent
from console.api.permissions import RolePermission
from console.api.serializers import fleet as s
from console.api.serializers import inventory as i
from console.api.views import fleet
from console.api.views.common import get_or_field_error, valid
from console.api.views.fleet_apply import FleetPlanSerializer
from console.filters import TRUE_WORDS
from fleet.fleetfile import FleetApplyRefused, FleetFileInvalid, Problem, plan_json
from fleet.fleetfile.schema import HOSTNAME_RE
from fleet.fleetfile.sources import hosts_create
from fleet.models import Component, ComponentVersion, Host, MaintenanceDomain, Pool, Service
from fleet.selectors.inventory import component_named, hosts_named, users_named, version_named
from fleet.services import inventory as created
from fleet.services import owners as service_writes
from fleet.services.catalogue import (
    compatibility_rule_delete,
    component_update,
    component_version_release,
    component_version_withdraw,
    domain_update,
    pool_update,
    service_placements_remove,
    service_placements_set,
    service_update,
)
from fleet.services.host_changes import host_restore, host_retire, host_update
from fleet.services.host_versions import host_versions_report
from opsplanner.permissions import Action, services_visible_to, user_can

HOST_ID = OpenApiParameter("id", OpenApiTypes.STR, OpenApiParameter.PATH, description="the host's id or hostname")


class AnyOfRolePermission(RolePermission):
    """RolePermission where an action may map to a tuple of Actions: any one of them suffices."""

    def has_permission(self, request: Any, view: Any) -> bool:
        needed = getattr(view, "action_permissions", {}).get(getattr(view, "action", None))
        if isinstance(needed, tuple):
            return bool(request.user and request.user.is_authenticated) and any(
                user_can(request.user, one) for one in needed
            )
        return super().has_permission(request, view)


def invalid_rows(invalid: FleetFileInvalid) -> Response:
    """Every problem of the rows by its place, in the API's error format; nothing was written."""
    errors: dict[str, list[str]] = {}
    for problem in invalid.problems:
        errors.setdefault(problem.place, []).append(problem.message)
    detail = f"{len(invalid.problems)} errors; nothing was written: " + "; ".join(map(str, invalid.problems[:5]))
    return Response({"detail": detail, "code": "invalid", "errors": errors}, status=status.HTTP_400_BAD_REQUEST)


class PoolViewSet(fleet.PoolViewSet):
    def _answer(self, pool: Pool, code: int = status.HTTP_200_OK) -> Response:
        return Response(self.get_serializer(self.get_queryset().get(pk=pool.pk)).data, status=code)

    @extend_schema(request=i.PoolInput, responses={201: s.PoolSerializer})
    @idempotent
    def create(self, request: Any) -> Response:
        data = valid(i.PoolInput, request.data)
        data.pop("reason", None)
        return self._answer(created.pool_create(**data, actor=request.user), status.HTTP_201_CREATED)

    @extend_schema(request=i.PoolUpdateInput, responses=s.PoolSerializer)
    def partial_update(self, request: Any, pk: str | None = None) -> Response:
        data = valid(i.PoolUpdateInput, request.data)
        reason = data.pop("reason", "")
        return self._answer(pool_update(pool_id=self.get_object().pk, changes=data, actor=request.user, reason=reason))


class DomainViewSet(fleet.DomainViewSet):
    def _answer(self, domain: MaintenanceDomain, code: int = status.HTTP_200_OK) -> Response:
        return Response(self.get_serializer(self.get_queryset().get(pk=domain.pk)).data, status=code)

    @extend_schema(request=i.DomainInput, responses={201: s.DomainSerializer})
    @idempotent
    def create(self, request: Any) -> Response:
        data = valid(i.DomainInput, request.data)
        pool = get_or_field_error(Pool.objects.all(), "pool", data.pop("pool"), "pool")
        return self._answer(created.domain_create(pool=pool, **data, actor=request.user), status.HTTP_201_CREATED)

    @extend_schema(request=i.DomainUpdateInput, responses=s.DomainSerializer)
    def partial_update(self, request: Any, pk: str | None = None) -> Response:
        data = valid(i.DomainUpdateInput, request.data)
        return self._answer(domain_update(domain_id=self.get_object().pk, **data, actor=request.user))


class HostViewSet(fleet.HostViewSet):
    """Hosts by id or hostname. Writes take the fleet file's fields (pool and domain by name)."""

    lookup_value_regex = r"[^/]+"
    permission_classes = [AnyOfRolePermission]
    action_permissions = {"versions": (Action.OPERATE, Action.EXECUTE)}

    def get_object(self) -> Host:
        return self._host(retired=False)

    def _host(self, *, retired: bool) -> Host:
        value = self.kwargs["pk"]
        manager = Host.all_objects if retired else Host.objects
        host = (
            manager.filter(pk=int(value)).first() if value.isascii() and value.isdigit() and len(value) < 19 else None
        )
        if host is None and HOSTNAME_RE.match(value):
            host = manager.filter(hostname=value).first()
        if host is None:
            raise Http404
        return host

    def _detail(self, host: Host, code: int = status.HTTP_200_OK) -> Response:
        host = Host.all_objects.select_related("pool", "domain").get(pk=host.pk)
        return Response(s.HostDetailSerializer(host).data, status=code)

    @extend_schema(request=i.HostRowSerializer, responses={201: s.HostDetailSerializer})
    @idempotent
    def create(self, request: Any) -> Response:
        try:
            hosts_create(rows=[request.data], actor=request.user, reason="created through the API")
        except FleetFileInvalid as invalid:
            problems = [Problem(p.place.removeprefix("hosts[0]."), p.message) for p in invalid.problems]
            return invalid_rows(FleetFileInvalid(problems))
        hostname = request.data["hostname"]
        return self._detail(Host.objects.get(hostname=hostname), status.HTTP_201_CREATED)

    @extend_schema(parameters=[HOST_ID], request=i.HostUpdateInput, responses=s.HostDetailSerializer)
    def partial_update(self, request: Any, pk: str | None = None) -> Response:
        data = valid(i.HostUpdateInput, request.data)
        host = host_update(host_id=self.get_object().pk, **data, actor=request.user)
        return self._detail(host)

    @extend_schema(parameters=[HOST_ID], request=i.HostRetireInput, responses=s.HostDetailSerializer)
    @action(detail=True, methods=["post"])
    @idempotent
    def retire(self, request: Any, pk: str | None = None) -> Response:
        """Retire the host: it leaves every count and gets no work; refused under live work."""
        reason = valid(i.HostRetireInput, request.data)["reason"]
        return self._detail(host_retire(hostname=self._host(retired=True).hostname, reason=reason, actor=request.user))

    @extend_schema(parameters=[HOST_ID], request=i.HostRetireInput, responses=s.HostDetailSerializer)
    @action(detail=True, methods=["post"])
    @idempotent
    def restore(self, request: Any, pk: str | None = None) -> Response:
        """Bring a retired host back in service."""
        reason = valid(i.HostRetireInput, request.data)["reason"]
        return self._detail(host_restore(hostname=self._host(retired=True).hostname, reason=reason, actor=request.user))

    @extend_schema(
        request=i.BulkHostsSchema,
        parameters=[OpenApiParameter("dry_run", OpenApiTypes.BOOL, description="check and plan only")],
        responses={
            201: OpenApiResponse(FleetPlanSerializer, description="created: the plan carried out"),
            200: OpenApiResponse(FleetPlanSerializer, description="dry run: the plan, nothing written"),
        },
    )
    @action(detail=False, methods=["post"])
    @idempotent
    def bulk(self, request: Any) -> Response:
        """Create many hosts in one transaction (up to 10,000): all of them, or none with every
        problem named by its index (`hosts[12].domain`)."""
        rows = valid(i.BulkHostsInput, request.data)["hosts"]
        dry_run = request.query_params.get("dry_run", "").lower() in TRUE_WORDS
        try:
            plan = hosts_create(rows=rows, dry_run=dry_run, actor=request.user, reason="created through the API")
        except FleetFileInvalid as invalid:
            return invalid_rows(invalid)
        except FleetApplyRefused as refused:
            return Response({"detail": "; ".join(refused.plan.refusals), "code": "conflict"}, status=409)
        return Response(plan_json(plan), status=status.HTTP_200_OK if dry_run else status.HTTP_201_CREATED)

    @extend_schema(parameters=[HOST_ID], request=i.HostVersionsInput, responses=i.HostVersionsSerializer)
    @action(detail=True, methods=["post"])
    @idempotent
    def versions(self, request: Any, pk: str | None = None) -> Response:
        """What the host actually runs; a version that differs from what OpsPlanner believes is drift."""
        data = valid(i.HostVersionsInput, request.data)
        host = self.get_object()
        outcomes = host_versions_report(
            host=host, versions=data["versions"], actor=request.user, reason=data.get("reason", "")
        )
        drift = host.installed_versions.filter(drift_from__isnull=False).exists()
        body = {"hostname": host.hostname, "drift": drift, "versions": outcomes}
        return Response(i.HostVersionsSerializer(body).data)


class ComponentViewSet(fleet.ComponentViewSet):
    def _answer(self, component: Component, code: int = status.HTTP_200_OK) -> Response:
        return Response(self.get_serializer(self.get_queryset().get(pk=component.pk)).data, status=code)

    @extend_schema(request=i.ComponentInput, responses={201: s.ComponentSerializer})
    @idempotent
    def create(self, request: Any) -> Response:
        data = valid(i.ComponentInput, request.data)
        return self._answer(created.component_create(**data, actor=request.user), status.HTTP_201_CREATED)

    @extend_schema(request=i.ComponentUpdateInput, responses=s.ComponentSerializer)
    def partial_update(self, request: Any, pk: str | None = None) -> Response:
        data = valid(i.ComponentUpdateInput, request.data)
        return self._answer(component_update(component_id=self.get_object().pk, **data, actor=request.user))

    @extend_schema(request=i.VersionInput, responses={201: s.ComponentSerializer})
    @action(detail=True, methods=["post"], url_path="versions")
    @idempotent
    def add_version(self, request: Any, pk: str | None = None) -> Response:
        """Add a released version of the component."""
        component = self.get_object()
        created.component_version_create(component=component, **valid(i.VersionInput, request.data), actor=request.user)
        return self._answer(component, status.HTTP_201_CREATED)

    @extend_schema(request=s.ReasonInput, responses=s.ComponentSerializer)
    @action(detail=True, methods=["post"], url_path=r"versions/(?P<version>[^/]+)/withdraw")
    @idempotent
    def withdraw_version(self, request: Any, pk: str | None = None, version: str = "") -> Response:
        """Withdraw a version: its active upgrades are offboarded, their pending work cancelled with the reason."""
        component, found = self._version(version)
        reason = valid(s.ReasonInput, request.data)["reason"]
        component_version_withdraw(version_id=found.pk, reason=reason, actor=request.user)
        return self._answer(component)

    @extend_schema(request=s.ReasonInput, responses=s.ComponentSerializer)
    @action(detail=True, methods=["post"], url_path=r"versions/(?P<version>[^/]+)/release")
    @idempotent
    def release_version(self, request: Any, pk: str | None = None, version: str = "") -> Response:
        """Release a version an operator withdrew: upgrades may target it again (its offboarded upgrades
        stay offboarded). A version withdrawn by an upgrade's offboarding or by the fleet file is
        released there; the refusal says so."""
        component, found = self._version(version)
        reason = valid(s.ReasonInput, request.data)["reason"]
        component_version_release(version_id=found.pk, reason=reason, actor=request.user)
        return self._answer(component)

    def _version(self, version: str) -> tuple[Component, ComponentVersion]:
        component = self.get_object()
        found = (
            ComponentVersion.objects.filter(component=component, version=version).first()
            if version.isprintable()
            else None
        )
        if found is None:
            raise Http404
        return component, found


class CompatibilityRuleViewSet(fleet.CompatibilityRuleViewSet):
    @extend_schema(request=i.RuleInput, responses={201: s.CompatibilityRuleSerializer})
    @idempotent
    def create(self, request: Any) -> Response:
        data = valid(i.RuleInput, request.data)
        version = version_named(data["job_facing_component"], data["job_facing_version"], field="job_facing_version")
        lower = component_named(data["lower_component"], field="lower_component")
        rule = created.compatibility_rule_create(
            job_facing_version=version, lower_component=lower, min_version=data["min_version"],
            max_version=data["max_version"], note=data["note"], actor=request.user,
        )  # fmt: skip
        return Response(self.get_serializer(self.get_queryset().get(pk=rule.pk)).data, status=status.HTTP_201_CREATED)

    def destroy(self, request: Any, pk: str | None = None) -> Response:
        compatibility_rule_delete(rule_id=self.get_object().pk, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class ServiceViewSet(fleet.ServiceViewSet):
    action_permissions = {"placements": Action.MANAGE_OWN_SERVICE, "remove_placements": Action.MANAGE_OWN_SERVICE}

    def get_queryset(self) -> QuerySet[Service]:
        queryset = super().get_queryset()
        if self.action in ("placements", "remove_placements"):
            # A service you do not own is, to you, a service that does not exist (404).
            return services_visible_to(self.request.user, queryset, field="self")
        return queryset

    def _answer(self, service: Service, code: int = status.HTTP_200_OK) -> Response:
        return Response(self.get_serializer(self.get_queryset().get(pk=service.pk)).data, status=code)

    @extend_schema(request=i.ServiceInput, responses={201: s.ServiceSerializer})
    @idempotent
    def create(self, request: Any) -> Response:
        data = valid(i.ServiceInput, request.data)
        owners = users_named(data.pop("owners", []))
        service = service_writes.service_create(**data, owners=owners, actor=request.user)
        return self._answer(service, status.HTTP_201_CREATED)

    @extend_schema(request=i.ServiceUpdateInput, responses=s.ServiceSerializer)
    def partial_update(self, request: Any, pk: str | None = None) -> Response:
        data = valid(i.ServiceUpdateInput, request.data)
        if "owners" in data:
            data["owners"] = users_named(data["owners"])
        return self._answer(service_update(service_id=self.get_object().pk, **data, actor=request.user))

    @extend_schema(request=i.PlacementsInput, responses=i.PlacementsSerializer)
    @action(detail=True, methods=["post"])
    @idempotent
    def placements(self, request: Any, pk: str | None = None) -> Response:
        """Place the service on hosts (owners: their own services), or change its running jobs there."""
        data = valid(i.PlacementsInput, request.data)
        service = self.get_object()
        counts = service_placements_set(
            service=service, hosts=hosts_named(data["hosts"]), running_jobs=data["running_jobs"], actor=request.user
        )
        return Response({**counts, "removed": 0})

    @extend_schema(request=i.PlacementsRemoveInput, responses=i.PlacementsSerializer)
    @action(detail=True, methods=["post"], url_path="placements/remove")
    @idempotent
    def remove_placements(self, request: Any, pk: str | None = None) -> Response:
        """Take the service off hosts (owners: their own services)."""
        data = valid(i.PlacementsRemoveInput, request.data)
        service = self.get_object()
        removed = service_placements_remove(service=service, hosts=hosts_named(data["hosts"]), actor=request.user)
        return Response({"added": 0, "changed": 0, "removed": removed})
