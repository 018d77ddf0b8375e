"""Executor and drainer endpoints: claim ready work items of the API adapters, heartbeat, report.

Every adapter but the built-in simulator (`API_ADAPTERS`: external, agent, ssh, slurm, kubernetes)
works through these endpoints; a claim names its adapter (and may name one host), and an adapter
never gets another adapter's items.

The claimer is the authenticated user (plus an optional process name), so one integration cannot
heartbeat or report another's claims. Claims are safe with many executors at once (SKIP LOCKED);
a report carries an Idempotency-Key: the same report again returns the first answer.

Batches: `report/` and `heartbeat/` take many items in one request and answer each on its own (a
refused item does not fail the others). A batch report sent with an Idempotency-Key is replayed
with its first answer; each outcome's report key is its `report_key` or derived from that header
and the item id, so a replay without the header answers `duplicate` for what was applied.
Reports may `claim_next`: the next ready item of the same host, claimed in the same request.
A claim may long-poll (`wait_seconds`)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from console.api.idempotency import HEADER, MAX_KEY_LENGTH, check_key, idempotent
from console.api.pagination import IdCursorPagination
from console.api.serializers import work as s
from console.api.views.common import valid
from console.filters import WorkItemFilter
from opsplanner.adapters import API_ADAPTERS
from opsplanner.models import WorkItem
from opsplanner.permissions import Action, user_roles
from opsplanner.roles import Role
from opsplanner.services.work_item_batches import (
    ItemAnswer,
    ItemReport,
    work_items_heartbeat_batch,
    work_items_report_batch,
)
from opsplanner.services.work_items import (
    ACCEPTED,
    claim_host_id,
    work_item_claim_next,
    work_item_heartbeat,
    work_item_report,
    work_item_report_claim_next,
    work_items_claim_waiting,
)

IDEMPOTENCY_KEY = OpenApiParameter(
    HEADER, OpenApiTypes.STR, OpenApiParameter.HEADER, required=True, description="retries return the first answer"
)


BATCH_IDEMPOTENCY_KEY = OpenApiParameter(
    HEADER,
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    required=False,
    description="retries return the first answer; also the base of the reports' keys that give no report_key",
)


# What the work-item serializer reads of an item's relations, in the same query.
ITEM_RELATED = ("host", "host_task")


def worker_name(user: Any, process: str | None) -> str:
    return f"{user.get_username()}/{process}" if process else user.get_username()


def item_report_key(request_key: str, item_id: int, attempt: int, report_key: str | None) -> str:
    """An outcome's own key, else one derived from the request's Idempotency-Key, the item id and
    the attempt (hashed when it would be too long); empty when there is neither (the service refuses it)."""
    if report_key:
        return report_key
    if not request_key:
        return ""
    derived = f"{request_key}#{item_id}.{attempt}"
    return derived if len(derived) <= MAX_KEY_LENGTH else "sha256:" + hashlib.sha256(derived.encode()).hexdigest()


def loaded(items: Iterable[WorkItem | None]) -> dict[int, WorkItem]:
    """The items again with what the serializer reads of their hosts and tasks, by id: one query
    (only those columns: a claim of 500 otherwise parses some 6,000 timestamps it never shows)."""
    ids = [item.pk for item in items if item is not None]
    if not ids:
        return {}
    own = [field.name for field in WorkItem._meta.concrete_fields]
    answer = WorkItem.objects.select_related(*ITEM_RELATED).only(
        *own, "host__hostname", "host__labels", "host_task__operation"
    )
    return {item.pk: item for item in answer.filter(pk__in=ids)}


def answer_rows(answers: Sequence[ItemAnswer]) -> list[dict[str, Any]]:
    keep = ("code", "detail", "lease_expires_at")
    return [
        {"id": a.item_id, "status": a.status, **{name: getattr(a, name) for name in keep if getattr(a, name)}}
        for a in answers
    ]


class WorkItemViewSet(viewsets.ReadOnlyModelViewSet):
    """Work items of the API adapters. Executors see and act on them; operators and viewers may read them all."""

    serializer_class = s.WorkItemSerializer
    filterset_class = WorkItemFilter
    pagination_class = IdCursorPagination
    action_permissions = {
        "claim": Action.EXECUTE,
        "heartbeat": Action.EXECUTE,
        "report": Action.EXECUTE,
        "report_batch": Action.EXECUTE,
        "heartbeat_batch": Action.EXECUTE,
        "list": Action.READ,
        "retrieve": Action.READ,
    }

    def check_permissions(self, request: Any) -> None:
        # Executors may read the items too (what they claimed), but nothing else in the API.
        if self.action in ("list", "retrieve") and Role.EXECUTOR in user_roles(request.user):
            return
        super().check_permissions(request)

    def get_queryset(self) -> QuerySet[WorkItem]:
        queryset = WorkItem.objects.select_related(*ITEM_RELATED)
        if Role.EXECUTOR in user_roles(self.request.user) and Role.OPERATOR not in user_roles(self.request.user):
            queryset = queryset.filter(adapter__in=API_ADAPTERS)
        return queryset

    @extend_schema(request=s.ClaimInput, responses=s.WorkItemSerializer(many=True))
    @action(detail=False, methods=["post"], pagination_class=None, filter_backends=[])
    def claim(self, request: Any) -> Response:
        """Claim up to `limit` ready items of one adapter (of these kinds, in this pool, of this host)
        for `lease_seconds`; with `wait_seconds`, wait that long for one when none is ready (a long poll)."""
        data = valid(s.ClaimInput, request.data)
        items = work_items_claim_waiting(
            worker=worker_name(request.user, data.get("worker")),
            wait_seconds=data["wait_seconds"],
            adapter=data["adapter"],
            host_id=claim_host_id(data["host"]) if data.get("host") else None,
            kinds=data.get("kinds") or None,
            pool_id=data.get("pool"),
            limit=data["limit"],
            lease_seconds=data["lease_seconds"],
            only=(),  # the answer is loaded again below, with the hosts
        )
        claimed = sorted(loaded(items).values(), key=lambda item: item.pk)
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

    @extend_schema(request=s.ReportInput, responses=s.ReportedWorkItem, parameters=[IDEMPOTENCY_KEY])
    @action(detail=True, methods=["post"])
    def report(self, request: Any, pk: str | None = None) -> Response:
        """Report done or failed with the results (new versions, verification outcome); with
        `claim_next`, also claim the next ready item of the same host (`next`, null when none)."""
        item = self.get_object()
        key = request.headers.get(HEADER, "")
        check_key(key)
        data = valid(s.ReportInput, request.data)
        report: dict[str, Any] = {
            "item_id": item.pk,
            "worker": worker_name(request.user, data.get("worker")),
            "key": key,
            "outcome": data["outcome"],
            "result": dict(data.get("result") or {}),
            "reason": data["reason"],
            "attempt": data["attempt"],
        }
        following = None
        if data["claim_next"]:
            reported, following = work_item_report_claim_next(
                **report, kinds=data.get("claim_kinds") or None, lease_seconds=data["lease_seconds"]
            )
        else:
            reported = work_item_report(**report)
        nxt = s.WorkItemSerializer(loaded([following])[following.pk]).data if following else None
        return Response({**self.get_serializer(reported).data, "next": nxt})

    @extend_schema(
        request=s.BatchReportInput,
        responses=s.BatchReportAnswer,
        parameters=[BATCH_IDEMPOTENCY_KEY],
        operation_id="work_items_report_batch",
    )
    @action(detail=False, methods=["post"], url_path="report", url_name="report-batch", pagination_class=None)
    @idempotent
    def report_batch(self, request: Any) -> Response:
        """Report many outcomes at once; each is accepted, a duplicate (its key was applied) or
        refused with a code, without failing the others. With an Idempotency-Key a retry returns the
        first answer; with `claim_next`, the next ready item of each host reported is claimed (`next`)."""
        data = valid(s.BatchReportInput, request.data)
        request_key = request.headers.get(HEADER, "")
        worker = worker_name(request.user, data.get("worker"))
        answers = work_items_report_batch(
            worker=worker,
            adapters=API_ADAPTERS,
            reports=[
                ItemReport(
                    item_id=r["id"],
                    attempt=r["attempt"],
                    outcome=r["outcome"],
                    key=item_report_key(request_key, r["id"], r["attempt"], r.get("report_key")),
                    result=dict(r.get("result") or {}),
                    reason=r["reason"],
                )
                for r in data["reports"]
            ],
        )
        following: list[WorkItem | None] = []
        if data["claim_next"]:
            hosts = list(dict.fromkeys((a.host_id, a.adapter) for a in answers if a.status == ACCEPTED and a.host_id))
            following = work_item_claim_next(
                worker=worker,
                hosts=hosts,
                kinds=data.get("claim_kinds") or None,
                lease_seconds=data["lease_seconds"],
            )
        nxt = sorted(loaded(following).values(), key=lambda item: item.pk)
        return Response({"results": answer_rows(answers), "next": s.WorkItemSerializer(nxt, many=True).data})

    @extend_schema(
        request=s.BatchHeartbeatInput, responses=s.BatchHeartbeatAnswer, operation_id="work_items_heartbeat_batch"
    )
    @action(detail=False, methods=["post"], url_path="heartbeat", url_name="heartbeat-batch", pagination_class=None)
    def heartbeat_batch(self, request: Any) -> Response:
        """Extend the leases of many items you run; the refused ones are no longer yours (taken back
        after a missed lease, finished, or claimed again): stop working on them."""
        data = valid(s.BatchHeartbeatInput, request.data)
        answers = work_items_heartbeat_batch(
            worker=worker_name(request.user, data.get("worker")),
            attempts=[(item["id"], item["attempt"]) for item in data["items"]],
            lease_seconds=data["lease_seconds"],
            adapters=API_ADAPTERS,
        )
        return Response(s.BatchHeartbeatAnswer({"results": answer_rows(answers)}).data)
