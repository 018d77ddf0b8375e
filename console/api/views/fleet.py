"""Fleet endpoints: read for every role but executors; opt-out windows and reservations are
written by the owners of their service (and operators)."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, F, Prefetch, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from console.api.errors import Conflict
from console.api.idempotency import idempotent
from console.api.pagination import IdCursorPagination
from console.api.serializers import fleet as s
from console.api.serializers.trains import ForecastSerializer
from console.api.views.common import field_error, get_or_field_error, valid
from fleet.filters import DomainFilter, HostFilter, OptOutWindowFilter, ReservationFilter
from fleet.models import (
    CapacityReservation,
    CompatibilityRule,
    Component,
    ComponentVersion,
    Host,
    MaintenanceDomain,
    OptOutWindow,
    Pool,
    Service,
)
from fleet.selectors.inventory import domains_with_sizes, pools_with_usage
from fleet.services import optout_window_cancel, optout_window_create, reservation_create
from fleet.services.owners import reservation_cancel
from opsplanner.permissions import Action, owned_service_ids, services_visible_to, user_roles
from opsplanner.roles import Role
from trains.models import LIVE_TRAIN_STATES, Train
from trains.selectors import train_forecast


class PoolViewSet(viewsets.ReadOnlyModelViewSet):
    """Pools with their live buffer usage (host counts by state against the buffers and floor)."""

    serializer_class = s.PoolSerializer

    def get_queryset(self) -> QuerySet[Pool]:
        return pools_with_usage(Pool.objects.order_by("name"))

    @extend_schema(responses=ForecastSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def forecast(self, request: Any, pk: str | None = None) -> Response:
        """Planned drains of the pool: each live train's forecast per domain."""
        pool = self.get_object()
        trains = Train.objects.filter(pool=pool, state__in=LIVE_TRAIN_STATES).select_related("pool").order_by("pk")
        return Response(ForecastSerializer([train_forecast(train) for train in trains], many=True).data)


class DomainViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = s.DomainSerializer
    filterset_class = DomainFilter

    def get_queryset(self) -> QuerySet[MaintenanceDomain]:
        return domains_with_sizes(MaintenanceDomain.objects.select_related("pool")).order_by("id")


class HostViewSet(viewsets.ReadOnlyModelViewSet):
    """Hosts; the detail adds installed versions, the current holder, incompatibilities and services.
    A host's history is the events list filtered by host."""

    filterset_class = HostFilter
    pagination_class = IdCursorPagination

    def get_queryset(self) -> QuerySet[Host]:
        if self.action == "list":
            # One model object per row, not three: the names come along as annotations.
            return Host.objects.annotate(pool_name=F("pool__name"), domain_name=F("domain__name"))
        return Host.objects.select_related("pool", "domain")

    def get_serializer_class(self) -> type:
        return s.HostDetailSerializer if self.action == "retrieve" else s.HostSerializer


class ComponentViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = s.ComponentSerializer

    def get_queryset(self) -> QuerySet[Component]:
        versions = ComponentVersion.objects.order_by("sort_key")
        return Component.objects.prefetch_related(Prefetch("versions", queryset=versions)).order_by("name")


class CompatibilityRuleViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = s.CompatibilityRuleSerializer

    def get_queryset(self) -> QuerySet[CompatibilityRule]:
        return CompatibilityRule.objects.select_related("job_facing_version__component", "lower_component").order_by(
            "id"
        )


class ServiceViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = s.ServiceSerializer

    def get_queryset(self) -> QuerySet[Service]:
        return Service.objects.prefetch_related("owners").annotate(n_hosts=Count("placements")).order_by("name")


class _WindowViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Windows of services: operators and viewers read all; a service owner reads and writes only
    those of services they own (others are 404)."""

    action_permissions = {
        "list": Action.READ,
        "retrieve": Action.READ,
        "create": Action.MANAGE_OWN_SERVICE,
        "cancel": Action.MANAGE_OWN_SERVICE,
    }
    model: type[OptOutWindow] | type[CapacityReservation]

    def get_queryset(self) -> QuerySet:
        queryset = self.model.objects.select_related("service", "created_by").order_by("-starts_at", "-id")
        roles = user_roles(self.request.user)
        if self.action in ("list", "retrieve") and Role.VIEWER in roles:
            return queryset
        return services_visible_to(self.request.user, queryset)

    def _service(self, service_id: int) -> Service:
        service = Service.objects.filter(pk=service_id).first()
        roles = user_roles(self.request.user)
        if service is None or (Role.OPERATOR not in roles and service.pk not in owned_service_ids(self.request.user)):
            # A service you do not own is, to you, a service that does not exist.
            raise field_error("service", f"There is no service #{service_id} that you own.")
        return service

    def _cancel(self, request: Any, cancel: Any, id_field: str) -> Response:
        window = self.get_object()
        reason = valid(s.ReasonInput, request.data)["reason"]
        if not cancel(**{id_field: window.pk}, reason=reason, actor=request.user):
            raise Conflict(f"{window._meta.verbose_name.capitalize()} #{window.pk} was already cancelled.")
        window.refresh_from_db()
        return Response(self.get_serializer(window).data)


class OptOutWindowViewSet(_WindowViewSet):
    serializer_class = s.OptOutWindowSerializer
    filterset_class = OptOutWindowFilter
    model = OptOutWindow

    @extend_schema(request=s.WindowInput, responses={201: s.OptOutWindowSerializer})
    @idempotent
    def create(self, request: Any) -> Response:
        data = valid(s.WindowInput, request.data)
        window = optout_window_create(
            service=self._service(data["service"]),
            starts_at=data["starts_at"],
            ends_at=data["ends_at"],
            reason=data["reason"],
            actor=request.user,
        )
        return Response(self.get_serializer(window).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.ReasonInput, responses=s.OptOutWindowSerializer)
    @action(detail=True, methods=["post"])
    @idempotent
    def cancel(self, request: Any, pk: str | None = None) -> Response:
        return self._cancel(request, optout_window_cancel, "window_id")


class ReservationViewSet(_WindowViewSet):
    serializer_class = s.ReservationSerializer
    filterset_class = ReservationFilter
    model = CapacityReservation

    def get_queryset(self) -> QuerySet:
        return super().get_queryset().select_related("pool")

    @extend_schema(request=s.ReservationInput, responses={201: s.ReservationSerializer})
    @idempotent
    def create(self, request: Any) -> Response:
        data = valid(s.ReservationInput, request.data)
        service = self._service(data["service"])
        pool = get_or_field_error(Pool.objects.all(), "pool", data["pool"], "pool")
        reservation = reservation_create(
            service=service,
            pool=pool,
            min_hosts_in_service=data["min_hosts_in_service"],
            starts_at=data["starts_at"],
            ends_at=data["ends_at"],
            reason=data["reason"],
            actor=request.user,
        )
        return Response(self.get_serializer(reservation).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=s.ReasonInput, responses=s.ReservationSerializer)
    @action(detail=True, methods=["post"])
    @idempotent
    def cancel(self, request: Any, pk: str | None = None) -> Response:
        return self._cancel(request, reservation_cancel, "reservation_id")
