"""Operations (intents), host tasks, approvals and events; the executor endpoints are in executors.py."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Prefetch, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from console.api.idempotency import idempotent
from console.api.pagination import EventCursorPagination, IdCursorPagination
from console.api.serializers import work as s
from console.api.serializers.fleet import ReasonInput
from console.api.views.common import field_error, get_or_field_error, valid
from console.filters import ApprovalFilter, EventFilter, HostTaskFilter, OperationFilter
from fleet.models import Host, Pool
from opsplanner.models import Approval, ApprovalKind, Event, HostTask, Operation
from opsplanner.permissions import Action
from opsplanner.scopes import MAX_SCOPE_LENGTH
from opsplanner.services.approvals import approval_decide
from opsplanner.services.operation_cancel import operation_cancel
from opsplanner.services.operations import operation_submit
from trains.services.emergency import emergency_train_request
from trains.services.reonboarding import upgrade_reonboard_request


class OperationViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Operations. POST submits an intent; the planner resolves its scope into host tasks, or refuses
    with the reason (unknown hosts, an empty scope, incompatible versions, a withdrawn version)."""

    serializer_class = s.OperationSerializer
    filterset_class = OperationFilter
    action_permissions = {"create": Action.OPERATE, "cancel": Action.OPERATE}

    def get_queryset(self) -> QuerySet[Operation]:
        resubmissions = Operation.objects.only("id", "resubmission_of_id").order_by("id")
        return (
            Operation.objects.select_related("component_version__component")
            .prefetch_related(Prefetch("resubmissions", queryset=resubmissions))
            .order_by("-created_at", "-id")
        )

    def _with_counts(self, operations: list[Operation]) -> list[Operation]:
        counts: dict[int, dict[str, int]] = {}
        rows = (
            HostTask.objects.filter(operation_id__in=[o.pk for o in operations])
            .order_by()
            .values_list("operation_id", "state")
            .annotate(n=Count("id"))
        )
        for operation_id, state, n in rows:
            counts.setdefault(operation_id, {})[state] = n
        for operation in operations:
            # An attribute of this response only: OperationSerializer reads it with getattr.
            setattr(operation, "task_counts", counts.get(operation.pk, {}))  # noqa: B010
        return operations

    def list(self, request: Any) -> Response:
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        if page is None:  # not paginated (never: default_limit is set), as in DRF's ListModelMixin
            return Response(self.get_serializer(self._with_counts(list(queryset)), many=True).data)
        return self.get_paginated_response(self.get_serializer(self._with_counts(list(page)), many=True).data)

    def retrieve(self, request: Any, pk: str | None = None) -> Response:
        return Response(self.get_serializer(self._with_counts([self.get_object()])[0]).data)

    @extend_schema(request=s.OperationIntent, responses={201: s.OperationSerializer})
    @idempotent
    def create(self, request: Any) -> Response:
        data = valid(s.OperationIntent, request.data)
        host_ids = None
        scope = data["scope"]
        if data.get("hosts"):
            names = data["hosts"]
            found = dict(Host.objects.filter(hostname__in=names).values_list("hostname", "id"))
            unknown = [name for name in names if name not in found]
            if unknown:
                raise field_error("hosts", f"Unknown hosts: {', '.join(unknown[:20])}.")
            host_ids = [found[name] for name in dict.fromkeys(names)]
            if len(scope) > MAX_SCOPE_LENGTH:
                scope = f"{len(host_ids)} named hosts ({', '.join(names[:5])}, …)"
        operation = operation_submit(
            kind=data["kind"],
            scope=scope,
            reason=data["reason"],
            component=data.get("component", ""),
            version=data.get("version", ""),
            priority=data["priority"],
            actor=request.user,
            needs_drain=data["needs_drain"],
            gang=data["gang"],
            estimated_duration_s=data["estimated_duration_s"],
            executor=data["executor"],
            drainer=data["drainer"],
            max_attempts=data["max_attempts"],
            drain_timeout_s=data["drain_timeout_s"],
            host_ids=host_ids,
        )
        body = self.get_serializer(self._with_counts([operation])[0]).data
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=ReasonInput, responses=s.OperationSerializer)
    @action(detail=True, methods=["post"])
    @idempotent
    def cancel(self, request: Any, pk: str | None = None) -> Response:
        """Cancel the operation's pending tasks; tasks already under way finish."""
        operation = self.get_object()
        operation_cancel(
            operation_id=operation.pk, reason=valid(ReasonInput, request.data)["reason"], actor=request.user
        )
        operation.refresh_from_db()
        return Response(self.get_serializer(self._with_counts([operation])[0]).data)


class HostTaskViewSet(viewsets.ReadOnlyModelViewSet):
    """Host tasks with their state and, while pending, why they are not admitted."""

    serializer_class = s.HostTaskSerializer
    filterset_class = HostTaskFilter
    pagination_class = IdCursorPagination

    def get_queryset(self) -> QuerySet[HostTask]:
        return HostTask.objects.select_related("host")


class ApprovalViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Approval requests. Any operator may request; a different operator decides (two-person rule)."""

    serializer_class = s.ApprovalSerializer
    filterset_class = ApprovalFilter
    action_permissions = {"create": Action.OPERATE, "approve": Action.APPROVE, "reject": Action.APPROVE}

    def get_queryset(self) -> QuerySet[Approval]:
        return Approval.objects.order_by("-created_at", "-id")

    @extend_schema(request=s.ApprovalRequestInput, responses={201: s.ApprovalSerializer})
    @idempotent
    def create(self, request: Any) -> Response:
        data = valid(s.ApprovalRequestInput, request.data)
        if data["kind"] == ApprovalKind.EMERGENCY_TRAIN:
            pool = get_or_field_error(Pool.objects.all(), "pool", data["pool"], "pool")
            train = emergency_train_request(
                pool=pool,
                component=data["component"],
                version=data["version"],
                reason=data["reason"],
                scope=data["scope"],
                domains_at_once=data["domains_at_once"],
                actor=request.user,
            )
            approval = Approval.objects.get(
                kind=ApprovalKind.EMERGENCY_TRAIN, subject_type="trains.train", subject_id=train.pk
            )
        else:
            from trains.models import Upgrade

            upgrade = get_or_field_error(Upgrade.objects.all(), "upgrade", data["upgrade"], "upgrade")
            approval = upgrade_reonboard_request(upgrade_id=upgrade.pk, reason=data["reason"], actor=request.user)
        return Response(self.get_serializer(approval).data, status=status.HTTP_201_CREATED)

    def _decide(self, request: Any, *, approve: bool) -> Response:
        approval = self.get_object()
        reason = valid(ReasonInput, request.data)["reason"]
        decided = approval_decide(approval_id=approval.pk, approve=approve, reason=reason, actor=request.user)
        return Response(self.get_serializer(decided).data)

    @extend_schema(request=ReasonInput, responses=s.ApprovalSerializer)
    @action(detail=True, methods=["post"])
    @idempotent
    def approve(self, request: Any, pk: str | None = None) -> Response:
        return self._decide(request, approve=True)

    @extend_schema(request=ReasonInput, responses=s.ApprovalSerializer)
    @action(detail=True, methods=["post"])
    @idempotent
    def reject(self, request: Any, pk: str | None = None) -> Response:
        return self._decide(request, approve=False)


class EventViewSet(viewsets.ReadOnlyModelViewSet):
    """The audit trail, read-only: filter by host, pool, operation, train, kind and time range."""

    serializer_class = s.EventSerializer
    filterset_class = EventFilter
    pagination_class = EventCursorPagination

    def get_queryset(self) -> QuerySet[Event]:
        return Event.objects.all()
