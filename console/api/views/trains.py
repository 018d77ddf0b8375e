"""Trains (pause, resume, forecast), visits and upgrades (create, replan, offboard, re-onboard and skip-phase
requests)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from console.api.errors import Conflict
from console.api.idempotency import idempotent
from console.api.serializers import trains as s
from console.api.serializers.fleet import ReasonInput
from console.api.serializers.work import ApprovalSerializer
from console.api.views.common import get_or_field_error, valid
from fleet.models import Pool
from opsplanner.permissions import Action
from trains.filters import TrainFilter, UpgradeFilter, VisitFilter
from trains.models import Train, TrainStop, Upgrade, UpgradePhase, Visit
from trains.selectors import train_forecast
from trains.services.offboarding import upgrade_offboard
from trains.services.phases import upgrade_phase_skip_request
from trains.services.reonboarding import upgrade_reonboard_request
from trains.services.replan import upgrade_replan
from trains.services.trains import train_create, train_pause, train_resume
from trains.services.upgrades import upgrade_create


class TrainViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = s.TrainSerializer
    filterset_class = TrainFilter
    action_permissions = {"create": Action.OPERATE, "pause": Action.OPERATE, "resume": Action.OPERATE}

    def get_queryset(self) -> QuerySet[Train]:
        stops = TrainStop.objects.select_related("domain").order_by("position")
        return Train.objects.select_related("pool").prefetch_related(Prefetch("stops", queryset=stops)).order_by("id")

    @extend_schema(request=s.TrainInput, responses={201: s.TrainSerializer})
    @idempotent
    def create(self, request: Any) -> Response:
        data = valid(s.TrainInput, request.data)
        pool = get_or_field_error(Pool.objects.all(), "pool", data.pop("pool"), "pool")
        train = train_create(pool=pool, actor=request.user, **data)
        return Response(self.get_serializer(self.get_queryset().get(pk=train.pk)).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses=s.ForecastSerializer)
    @action(detail=True, methods=["get"], filter_backends=[])
    def forecast(self, request: Any, pk: str | None = None) -> Response:
        """When each domain was last visited and will next be, and whether the cycle meets its SLO."""
        return Response(s.ForecastSerializer(train_forecast(self.get_object())).data)

    @extend_schema(request=ReasonInput, responses=s.TrainSerializer)
    @action(detail=True, methods=["post"])
    @idempotent
    def pause(self, request: Any, pk: str | None = None) -> Response:
        train = train_pause(
            train_id=self.get_object().pk, reason=valid(ReasonInput, request.data)["reason"], actor=request.user
        )
        return Response(self.get_serializer(self.get_queryset().get(pk=train.pk)).data)

    @extend_schema(request=ReasonInput, responses=s.TrainSerializer)
    @action(detail=True, methods=["post"])
    @idempotent
    def resume(self, request: Any, pk: str | None = None) -> Response:
        train = train_resume(
            train_id=self.get_object().pk, reason=valid(ReasonInput, request.data)["reason"], actor=request.user
        )
        return Response(self.get_serializer(self.get_queryset().get(pk=train.pk)).data)


class VisitViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = s.VisitSerializer
    filterset_class = VisitFilter

    def get_queryset(self) -> QuerySet[Visit]:
        return Visit.objects.select_related("domain", "cycle").order_by("-id")


class UpgradeViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = s.UpgradeSerializer
    filterset_class = UpgradeFilter
    action_permissions = {
        "create": Action.OPERATE,
        "replan": Action.OPERATE,
        "offboard": Action.OPERATE,
        "reonboard": Action.OPERATE,
        "skip_phase": Action.OPERATE,
    }

    def get_queryset(self) -> QuerySet[Upgrade]:
        phases = UpgradePhase.objects.select_related("domain").order_by("position")
        return (
            Upgrade.objects.select_related("component_version__component")
            .prefetch_related(Prefetch("phases", queryset=phases))
            .order_by("-created_at", "-id")
        )

    @extend_schema(request=s.UpgradeInput, responses={201: s.UpgradeSerializer})
    @idempotent
    def create(self, request: Any) -> Response:
        data = valid(s.UpgradeInput, request.data)
        pool = get_or_field_error(Pool.objects.all(), "pool", data.pop("pool"), "pool")
        phases = data.pop("phases", None)
        upgrade = upgrade_create(
            pool=pool,
            actor=request.user,
            # An empty list is passed on as given: the service refuses it, where None is one phase.
            phases=None if phases is None else [{k: v for k, v in p.items() if v not in ("", None)} for p in phases],
            **data,
        )
        return Response(
            self.get_serializer(self.get_queryset().get(pk=upgrade.pk)).data, status=status.HTTP_201_CREATED
        )

    @extend_schema(request=s.UpgradeReplanInput, responses=s.UpgradeSerializer)
    @action(detail=True, methods=["post"])
    @idempotent
    def replan(self, request: Any, pk: str | None = None) -> Response:
        """Change an active upgrade's priority, deadline, multi-cycle or hosts per visit (only the fields
        sent); a visit already running keeps its plan, the next one takes the new values."""
        upgrade_replan(upgrade_id=self.get_object().pk, actor=request.user, **valid(s.UpgradeReplanInput, request.data))
        return Response(self.get_serializer(self.get_object()).data)  # read again, in the same transaction

    @extend_schema(request=ReasonInput, responses=s.UpgradeSerializer)
    @action(detail=True, methods=["post"])
    @idempotent
    def offboard(self, request: Any, pk: str | None = None) -> Response:
        """Take the upgrade out of every train: pending work cancelled, version withdrawn, rollbacks."""
        upgrade = self.get_object()
        reason = valid(ReasonInput, request.data)["reason"]
        with transaction.atomic():
            if not upgrade_offboard(upgrade=upgrade, reason=reason, actor=request.user):
                raise Conflict(f"Upgrade #{upgrade.pk} is {upgrade.state}; only an active upgrade is offboarded.")
        return Response(self.get_serializer(self.get_queryset().get(pk=upgrade.pk)).data)

    @extend_schema(request=ReasonInput, responses={201: ApprovalSerializer})
    @action(detail=True, methods=["post"])
    @idempotent
    def reonboard(self, request: Any, pk: str | None = None) -> Response:
        """Ask a second operator to put an offboarded upgrade back (an approval request)."""
        approval = upgrade_reonboard_request(
            upgrade_id=self.get_object().pk, reason=valid(ReasonInput, request.data)["reason"], actor=request.user
        )
        return Response(ApprovalSerializer(approval).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=ReasonInput, responses={201: ApprovalSerializer})
    @action(detail=True, methods=["post"], url_path="skip-phase")
    @idempotent
    def skip_phase(self, request: Any, pk: str | None = None) -> Response:
        """Ask a second operator to graduate the upgrade's held phase without its evidence (an approval request)."""
        approval = upgrade_phase_skip_request(
            upgrade_id=self.get_object().pk, reason=valid(ReasonInput, request.data)["reason"], actor=request.user
        )
        return Response(ApprovalSerializer(approval).data, status=status.HTTP_201_CREATED)
