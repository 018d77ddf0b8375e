"""Executor and drainer endpoints: claim ready external work items, heartbeat, report.

The claimer is the authenticated user (plus an optional process name), so one integration cannot
heartbeat or report another's claims. Claims are safe with many executors at once (SKIP LOCKED);
a report carries an Idempotency-Key: the same report again returns the first answer."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from opsplanner.api.idempotency import HEADER, check_key
from opsplanner.api.pagination import IdCursorPagination
from opsplanner.api.serializers import work as s
from opsplanner.api.views.common import valid
from opsplanner.filters import WorkItemFilter
from opsplanner.models import Adapter, WorkItem
from opsplanner.permissions import Action, user_roles
from opsplanner.roles import Role
from opsplanner.services.work_items import work_item_heartbeat, work_item_report, work_items_claim

IDEMPOTENCY_KEY = OpenApiParameter(
    HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER, required=True, description="retries return the first answer"
)


def worker_name(user: Any, process: str | None) -> str:
    return f"{user.get_username()}/{process}" if process else user.get_username()


class WorkItemViewSet(viewsets.ReadOnlyModelViewSet):
    """External work items. Executors see and act on them; operators and viewers may read them all."""

    serializer_class = s.WorkItemSerializer
    filterset_class = WorkItemFilter
    pagination_class = IdCursorPagination
    action_permissions = {
        "claim": Action.EXECUTE,
        "heartbeat": Action.EXECUTE,
        "report": Action.EXECUTE,
        "list": Action.READ,
        "retrieve": Action.READ,
    }

    def check_permissions(self, request: Any) -> None:
        # Executors may read the items too (what they claimed), but nothing else in the API.
        if self.action in ("list", "retrieve") and Role.EXECUTOR in user_roles(request.user):
            return
        super().check_permissions(request)

    def get_queryset(self) -> QuerySet[WorkItem]:
        queryset = WorkItem.objects.select_related("host")
        if Role.EXECUTOR in user_roles(self.request.user) and Role.OPERATOR not in user_roles(self.request.user):
            queryset = queryset.filter(adapter=Adapter.EXTERNAL)
        return queryset

    @extend_schema(request=s.ClaimInput, responses=s.WorkItemSerializer(many=True))
    @action(detail=False, methods=["post"], pagination_class=None, filter_backends=[])
    def claim(self, request: Any) -> Response:
        """Claim up to `limit` ready items (of these kinds, in this pool) for `lease_seconds`."""
        data = valid(s.ClaimInput, request.data)
        items = work_items_claim(
            worker=worker_name(request.user, data.get("worker")),
            adapter=Adapter.EXTERNAL,
            kinds=data.get("kinds") or None,
            pool_id=data.get("pool"),
            limit=data["limit"],
            lease_seconds=data["lease_seconds"],
        )
        claimed = WorkItem.objects.filter(pk__in=[item.pk for item in items]).select_related("host").order_by("id")
        return Response(s.WorkItemSerializer(claimed, many=True).data)

    @extend_schema(request=s.HeartbeatInput, responses=s.HeartbeatAnswer)
    @action(detail=True, methods=["post"])
    def heartbeat(self, request: Any, pk: str | None = None) -> Response:
        """Extend the lease of an item you are running; 409 when it is no longer yours."""
        item = self.get_object()
        data = valid(s.HeartbeatInput, request.data)
        expires = work_item_heartbeat(
            item_id=item.pk,
            worker=worker_name(request.user, data.get("worker")),
            lease_seconds=data["lease_seconds"],
            attempt=data["attempt"],
        )
        return Response(s.HeartbeatAnswer({"lease_expires_at": expires}).data)

    @extend_schema(request=s.ReportInput, responses=s.WorkItemSerializer, parameters=[IDEMPOTENCY_KEY])
    @action(detail=True, methods=["post"])
    def report(self, request: Any, pk: str | None = None) -> Response:
        """Report done or failed with the results (new versions, verification outcome)."""
        item = self.get_object()
        key = request.headers.get(HEADER, "")
        check_key(key)
        data = valid(s.ReportInput, request.data)
        reported = work_item_report(
            item_id=item.pk,
            worker=worker_name(request.user, data.get("worker")),
            key=key,
            outcome=data["outcome"],
            result=dict(data.get("result") or {}),
            reason=data["reason"],
            attempt=data["attempt"],
        )
        return Response(self.get_serializer(reported).data)
