"""Operations (submitted as intents), host tasks, work items, approvals and events."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from console.api.serializers.fast import iso
from console.api.serializers.fields import MAX_ATTEMPT, MAX_ID
from opsplanner.adapters import (
    API_ADAPTERS,
    DRAINER_OVERRIDE_CHOICES,
    EXECUTOR_OVERRIDE_CHOICES,
    POOLS_ADAPTER,
    Adapter,
)
from opsplanner.models import (
    MAX_PRIORITY,
    OPERATOR_KINDS,
    Approval,
    ApprovalKind,
    Event,
    HostTask,
    Operation,
    WorkItem,
    WorkKind,
)
from opsplanner.scopes import MAX_SCOPE_LENGTH
from opsplanner.services.work_items import (
    ACCEPTED,
    DUPLICATE,
    EXTENDED,
    MAX_BATCH,
    MAX_CLAIM,
    MAX_LEASE_SECONDS,
    MAX_WAIT_SECONDS,
    REFUSED,
)


class OperationSerializer(serializers.ModelSerializer):
    component = serializers.SerializerMethodField()
    version = serializers.SerializerMethodField()
    tasks = serializers.SerializerMethodField()
    resubmission_of = serializers.IntegerField(
        source="resubmission_of_id",
        read_only=True,
        allow_null=True,
        help_text="the operation whose superseded work this one asks for again, its newer version withdrawn",
    )
    resubmissions: serializers.PrimaryKeyRelatedField[Operation] = serializers.PrimaryKeyRelatedField(
        many=True, read_only=True, help_text="the operations that ask for this one's superseded work again"
    )

    class Meta:
        model = Operation
        fields = [
            "id",
            "kind",
            "component",
            "version",
            "scope",
            "priority",
            "source",
            "requester",
            "reason",
            "needs_drain",
            "gang",
            "estimated_duration_s",
            "executor",
            "drainer",
            "max_attempts",
            "drain_timeout_s",
            "state",
            "hold_reason",
            "override_buffers",
            "created_at",
            "cancelled_at",
            "closed_at",
            "resubmission_of",
            "resubmissions",
            "tasks",
        ]

    def get_component(self, operation: Operation) -> str | None:
        target = operation.component_version
        return target.component.name if target else None

    def get_version(self, operation: Operation) -> str | None:
        target = operation.component_version
        return target.version if target else None

    def get_tasks(self, operation: Operation) -> dict[str, int]:
        """Host tasks by state (annotated by the viewset's queryset)."""
        return dict(getattr(operation, "task_counts", None) or {})


class OperationIntent(serializers.Serializer):
    """An intent: what to do, to which hosts (a selector the planner resolves, or host names), how urgently."""

    kind = serializers.ChoiceField(choices=OPERATOR_KINDS)
    scope = serializers.CharField(
        max_length=MAX_SCOPE_LENGTH,
        required=False,
        allow_blank=True,
        help_text="e.g. 'pool P', '10% of pool P', 'domain P/D', 'hosts running C below V in pool P'",
    )
    hosts = serializers.ListField(
        child=serializers.CharField(max_length=253), required=False, max_length=10_000, help_text="host names"
    )
    component = serializers.CharField(max_length=63, required=False, allow_blank=True)
    version = serializers.CharField(max_length=64, required=False, allow_blank=True)
    priority = serializers.IntegerField(min_value=0, max_value=MAX_PRIORITY, default=100)
    reason = serializers.CharField(max_length=500)
    needs_drain = serializers.BooleanField(required=False, allow_null=True, default=None)
    gang = serializers.BooleanField(default=False)
    estimated_duration_s = serializers.IntegerField(min_value=1, max_value=7 * 24 * 3600, default=1800)
    executor = serializers.ChoiceField(choices=EXECUTOR_OVERRIDE_CHOICES, default=POOLS_ADAPTER, allow_blank=True)
    drainer = serializers.ChoiceField(choices=DRAINER_OVERRIDE_CHOICES, default=POOLS_ADAPTER, allow_blank=True)
    max_attempts = serializers.IntegerField(min_value=1, max_value=10, default=3)
    drain_timeout_s = serializers.IntegerField(min_value=1, max_value=7 * 24 * 3600, default=3600)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        scope, hosts = attrs.get("scope", "").strip(), attrs.get("hosts")
        if bool(scope) == bool(hosts):
            raise serializers.ValidationError({"scope": "Give a scope selector or a list of hosts (exactly one)."})
        if hosts:
            attrs["scope"] = "hosts: " + ", ".join(hosts)
            if len(attrs["scope"]) > MAX_SCOPE_LENGTH:
                attrs["host_names"] = hosts
        return attrs


class HostTaskSerializer(serializers.ModelSerializer):
    hostname = serializers.CharField(source="host.hostname", read_only=True)

    class Meta:
        model = HostTask
        fields = [
            "id",
            "operation",
            "host",
            "hostname",
            "pool_id",
            "priority",
            "state",
            "drain_key",
            "waiting_code",
            "waiting_reason",
            "failure_reason",
            "failure_code",
            "created_at",
            "admitted_at",
            "finished_at",
            "state_changed_at",
            "drain_returned_at",
        ]


class WorkItemSerializer(serializers.ModelSerializer):
    hostname = serializers.CharField(source="host.hostname", read_only=True)
    # Adapters name the host in their own system by a label (a Slurm node, a Kubernetes node) and
    # say whose drain it is by the operation.
    host_labels = serializers.JSONField(source="host.labels", read_only=True)
    operation = serializers.IntegerField(source="host_task.operation_id", read_only=True)
    attempt = serializers.IntegerField(source="attempts", read_only=True)

    class Meta:
        model = WorkItem
        fields = [
            "id",
            "kind",
            "verify_class",
            "host",
            "hostname",
            "host_labels",
            "operation",
            "host_task",
            "pool_id",
            "adapter",
            "state",
            "params",
            "attempt",
            "max_attempts",
            "claimed_by",
            "claimed_at",
            "lease_expires_at",
            "deadline_at",
            "result",
            "outcome_reason",
            "created_at",
            "finished_at",
        ]


class ClaimInput(serializers.Serializer):
    adapter = serializers.ChoiceField(
        choices=[(a.value, a.label) for a in API_ADAPTERS],
        default=Adapter.EXTERNAL.value,
        help_text="whose items: an adapter only ever claims items of its own kind",
    )
    kinds = serializers.ListField(child=serializers.ChoiceField(choices=WorkKind.choices), required=False)
    pool = serializers.IntegerField(min_value=1, max_value=MAX_ID, required=False)
    host = serializers.CharField(
        max_length=253, required=False, allow_blank=True, help_text="a hostname: claim only that host's items"
    )
    limit = serializers.IntegerField(min_value=1, max_value=MAX_CLAIM, default=10)
    lease_seconds = serializers.IntegerField(min_value=1, max_value=MAX_LEASE_SECONDS, default=300)
    worker = serializers.CharField(
        max_length=100, required=False, allow_blank=True, help_text="a name for this process, under your user"
    )
    wait_seconds = serializers.IntegerField(
        min_value=0,
        max_value=MAX_WAIT_SECONDS,
        default=0,
        help_text="a long poll: when nothing is ready, wait up to this long for an item (empty list at the bound)",
    )


class HeartbeatInput(serializers.Serializer):
    attempt = serializers.IntegerField(
        min_value=1, max_value=MAX_ATTEMPT, help_text="the attempt number the claim returned"
    )
    lease_seconds = serializers.IntegerField(min_value=1, max_value=MAX_LEASE_SECONDS, default=300)
    worker = serializers.CharField(max_length=100, required=False, allow_blank=True)


class StepInput(serializers.Serializer):
    """One command an adapter ran for the item: what it exited with and the tail of its output."""

    name = serializers.CharField(max_length=63, help_text="check, install, reboot, verify:<class>, ...")
    exit_code = serializers.IntegerField(allow_null=True, help_text="null when it timed out or could not start")
    output_tail = serializers.CharField(max_length=8192, allow_blank=True, default="", trim_whitespace=False)
    duration_s = serializers.FloatField(min_value=0)
    timed_out = serializers.BooleanField(default=False)
    attempt = serializers.IntegerField(min_value=1, max_value=MAX_ATTEMPT, required=False)


class ResultInput(serializers.Serializer):
    versions = serializers.DictField(child=serializers.CharField(max_length=64), required=False)
    passed = serializers.BooleanField(required=False)
    details = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    steps = StepInput(many=True, required=False, max_length=20, help_text="the commands run, in order")  # type: ignore[call-arg]  # stub gap: many=True takes min/max_length (DRF 3.14+)


class ClaimNextInput(serializers.Serializer):
    """After the report is accepted, claim the next ready item of the same host in the same request."""

    claim_next = serializers.BooleanField(
        default=False, help_text="claim the next ready item of the same host and answer it as `next`"
    )
    claim_kinds = serializers.ListField(
        child=serializers.ChoiceField(choices=WorkKind.choices), required=False, help_text="only these kinds"
    )
    lease_seconds = serializers.IntegerField(
        min_value=1, max_value=MAX_LEASE_SECONDS, default=300, help_text="the lease of the next item"
    )


class ReportInput(ClaimNextInput):
    outcome = serializers.ChoiceField(choices=["done", "failed"])
    attempt = serializers.IntegerField(
        min_value=1, max_value=MAX_ATTEMPT, help_text="the attempt number the claim returned"
    )
    result = ResultInput(required=False)
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
    worker = serializers.CharField(max_length=100, required=False, allow_blank=True)


class ReportedWorkItem(WorkItemSerializer):
    """The reported item, and the next one claimed for its host (null when none, or not asked)."""

    next = WorkItemSerializer(read_only=True, allow_null=True)

    class Meta(WorkItemSerializer.Meta):
        fields = [*WorkItemSerializer.Meta.fields, "next"]


class BatchReportItem(serializers.Serializer):
    id = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    attempt = serializers.IntegerField(
        min_value=1, max_value=MAX_ATTEMPT, help_text="the attempt number the claim returned"
    )
    outcome = serializers.ChoiceField(choices=["done", "failed"])
    result = ResultInput(required=False)
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
    report_key = serializers.CharField(
        max_length=128,
        required=False,
        help_text="this outcome's idempotency key; by default derived from the request's Idempotency-Key and the id",
    )


class BatchReportInput(ClaimNextInput):
    reports = BatchReportItem(many=True, min_length=1, max_length=MAX_BATCH)  # type: ignore[call-arg]  # stub gap: many=True takes min/max_length (DRF 3.14+)
    worker = serializers.CharField(max_length=100, required=False, allow_blank=True)


class BatchItemAnswer(serializers.Serializer):
    id = serializers.IntegerField()
    status = serializers.ChoiceField(
        choices=[ACCEPTED, DUPLICATE, REFUSED], help_text="duplicate: this report key was already applied"
    )
    code = serializers.CharField(required=False, help_text="why it was refused: not_found, conflict, invalid")
    detail = serializers.CharField(required=False)


class BatchReportAnswer(serializers.Serializer):
    results = BatchItemAnswer(many=True, help_text="one per report, in the order sent")
    next = WorkItemSerializer(many=True, help_text="with claim_next: the next item claimed for each host reported")


class BatchHeartbeatItem(serializers.Serializer):
    id = serializers.IntegerField(min_value=1, max_value=MAX_ID)
    attempt = serializers.IntegerField(
        min_value=1, max_value=MAX_ATTEMPT, help_text="the attempt number the claim returned"
    )


class BatchHeartbeatInput(serializers.Serializer):
    items = BatchHeartbeatItem(many=True, min_length=1, max_length=MAX_BATCH)  # type: ignore[call-arg]  # stub gap: many=True takes min/max_length (DRF 3.14+)
    lease_seconds = serializers.IntegerField(min_value=1, max_value=MAX_LEASE_SECONDS, default=300)
    worker = serializers.CharField(max_length=100, required=False, allow_blank=True)


class BatchHeartbeatItemAnswer(serializers.Serializer):
    id = serializers.IntegerField()
    status = serializers.ChoiceField(
        choices=[EXTENDED, REFUSED], help_text="refused: the item is no longer yours on that attempt; stop it"
    )
    lease_expires_at = serializers.DateTimeField(required=False)
    code = serializers.CharField(required=False, help_text="not_found or conflict")
    detail = serializers.CharField(required=False)


class BatchHeartbeatAnswer(serializers.Serializer):
    results = BatchHeartbeatItemAnswer(many=True, help_text="one per item, in the order sent")


class HeartbeatAnswer(serializers.Serializer):
    lease_expires_at = serializers.DateTimeField()


class ApprovalSerializer(serializers.ModelSerializer):
    class Meta:
        model = Approval
        fields = [
            "id",
            "kind",
            "subject_type",
            "subject_id",
            "summary",
            "requester",
            "reason",
            "state",
            "decider",
            "decision_reason",
            "decided_at",
            "created_at",
            "expires_at",
        ]


class ApprovalRequestInput(serializers.Serializer):
    """Request a decision. emergency_train: pool, component, version (scope, domains_at_once optional);
    reonboard_upgrade: upgrade."""

    kind = serializers.ChoiceField(choices=[ApprovalKind.EMERGENCY_TRAIN, ApprovalKind.REONBOARD_UPGRADE])
    reason = serializers.CharField(max_length=500)
    pool = serializers.IntegerField(min_value=1, max_value=MAX_ID, required=False)
    component = serializers.CharField(max_length=63, required=False)
    version = serializers.CharField(max_length=64, required=False)
    scope = serializers.CharField(max_length=MAX_SCOPE_LENGTH, required=False, allow_blank=True, default="")
    domains_at_once = serializers.IntegerField(min_value=1, max_value=100, default=1)
    upgrade = serializers.IntegerField(min_value=1, max_value=MAX_ID, required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        needed = ("pool", "component", "version") if attrs["kind"] == ApprovalKind.EMERGENCY_TRAIN else ("upgrade",)
        missing = {name: f"Required for a {attrs['kind']} request." for name in needed if name not in attrs}
        if missing:
            raise serializers.ValidationError(missing)
        return attrs


class EventSerializer(serializers.ModelSerializer):
    class Meta:
        model = Event
        fields = [
            "id",
            "created_at",
            "kind",
            "actor",
            "actor_id",
            "subject_type",
            "subject_id",
            "pool_id",
            "host_id",
            "reason",
            "data",
        ]

    def to_representation(self, event: Event) -> dict[str, Any]:
        return {
            "id": event.id,
            "created_at": iso(event.created_at),
            "kind": event.kind,
            "actor": event.actor,
            "actor_id": event.actor_id,
            "subject_type": event.subject_type,
            "subject_id": event.subject_id,
            "pool_id": event.pool_id,
            "host_id": event.host_id,
            "reason": event.reason,
            "data": event.data,
        }
