"""POST /api/fleet/apply/: a fleet file (JSON, or YAML text), planned and applied like the
fleet_apply command; operators only. ?dry_run=true plans without writing, ?prune=true retires what
the file no longer names. Answers the plan; a file with errors is 400 with every error by its place;
a plan that touches live work is 409 with the refusals. Nothing is written unless all is well."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.parsers import BaseParser
from rest_framework.response import Response
from rest_framework.views import APIView

from console.api.parsers import JSONParser
from console.filters import TRUE_WORDS
from fleet.fleetfile import FleetApplyRefused, FleetFileInvalid, fleet_apply, plan_json
from fleet.fleetfile.schema import fleet_spec_from_document, parse_fleet_file
from opsplanner.permissions import Action


class YAMLTextParser(BaseParser):
    """The body as text, for the fleet file's own parser (which reports YAML errors by place)."""

    media_type = "application/yaml"

    # DRF takes whatever a parser returns as request.data; the stubs only allow mappings.
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> str:  # type: ignore[override]
        return stream.read().decode("utf-8", errors="replace")


class TextYAMLParser(YAMLTextParser):
    media_type = "text/yaml"


class WithdrawalForeseenSerializer(serializers.Serializer):
    """What withdrawing the version will do (fleet.fleetfile.withdrawals.WithdrawalForeseen)."""

    offboards = serializers.ListField(child=serializers.IntegerField(), help_text="active upgrades offboarded")
    rolls_back_hosts = serializers.IntegerField(help_text="hosts rolled back to the version they ran before")
    rollback_refused_hosts = serializers.IntegerField(
        help_text="hosts not rolled back: the version they ran before is withdrawn (an event says so)"
    )
    cancels_tasks = serializers.IntegerField(help_text="pending tasks of other operations aimed at it cancelled")
    stops_installs = serializers.IntegerField(help_text="installs of it no executor has claimed, stopped")
    reopens = serializers.ListField(child=serializers.IntegerField(), help_text="completed upgrades made active again")
    fallen_back_alerts = serializers.ListField(
        child=serializers.IntegerField(), help_text="completed upgrades its rollback takes below, left so with an alert"
    )
    resubmits_operations = serializers.IntegerField(help_text="ad-hoc operations asked again for work it superseded")
    resubmits_hosts = serializers.IntegerField(help_text="the hosts of those operations")
    resubmission_refused_hosts = serializers.IntegerField(help_text="hosts that work is not asked again on")


class FleetChangeSerializer(serializers.Serializer):
    kind = serializers.CharField()
    action = serializers.ChoiceField(choices=["create", "update", "remove"])
    name = serializers.CharField()
    # A declared field named "fields": DRF's metaclass moves it out of the class attributes, so the
    # Serializer.fields property the stubs see is not shadowed at run time.
    fields = serializers.DictField(  # type: ignore[assignment]
        child=serializers.ListField(), help_text="field: [before, after]"
    )
    note = serializers.CharField(allow_blank=True)
    withdrawal = WithdrawalForeseenSerializer(required=False, help_text="a version withdrawn: what that will do")


class FleetPlanSerializer(serializers.Serializer):
    applied = serializers.BooleanField()
    dry_run = serializers.BooleanField()
    prune = serializers.BooleanField()
    changes = FleetChangeSerializer(many=True)
    counts = serializers.DictField(child=serializers.DictField(child=serializers.IntegerField()))
    refusals = serializers.ListField(child=serializers.CharField())


class FleetApplyView(APIView):
    """Apply a fleet file (docs/fleet-file.md): the body is the document as JSON, or as YAML text
    (Content-Type: application/yaml). Answers the plan: every change with its fields before and after."""

    action_permissions = {"*": Action.OPERATE}
    parser_classes = [JSONParser, YAMLTextParser, TextYAMLParser]

    @extend_schema(
        request={"application/json": OpenApiTypes.OBJECT, "application/yaml": OpenApiTypes.STR},
        parameters=[
            OpenApiParameter("dry_run", OpenApiTypes.BOOL, description="plan only, write nothing"),
            OpenApiParameter("prune", OpenApiTypes.BOOL, description="retire hosts the file no longer names"),
        ],
        responses={200: FleetPlanSerializer},
    )
    def post(self, request: Any) -> Response:
        dry_run = request.query_params.get("dry_run", "").lower() in TRUE_WORDS
        prune = request.query_params.get("prune", "").lower() in TRUE_WORDS
        try:
            data = request.data
            spec = parse_fleet_file(data) if isinstance(data, str) else fleet_spec_from_document(data)
            plan = fleet_apply(spec=spec, prune=prune, dry_run=dry_run, actor=request.user)
        except FleetFileInvalid as invalid:
            errors: dict[str, list[str]] = {}
            for problem in invalid.problems:
                errors.setdefault(problem.place, []).append(problem.message)
            detail = f"{len(invalid.problems)} errors in the fleet file; nothing was written"
            return Response({"detail": detail, "code": "invalid", "errors": errors}, status=status.HTTP_400_BAD_REQUEST)
        except FleetApplyRefused as refused:
            body = {
                "detail": "; ".join(refused.plan.refusals),
                "code": "conflict",
                "refusals": refused.plan.refusals,
                "plan": plan_json(refused.plan),
            }
            return Response(body, status=status.HTTP_409_CONFLICT)
        return Response(plan_json(plan))
