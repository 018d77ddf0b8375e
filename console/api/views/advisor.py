"""Advisor runs: operators queue one (202, a worker runs it); whoever reads the fleet reads them.
`kind` picks the run: a domain-size advice (the default) or a live forecast of one live pool."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import PolymorphicProxySerializer, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.response import Response

from console.api.idempotency import idempotent
from console.api.serializers.advisor import (
    AdvisorRunInput,
    AdvisorRunKindInput,
    AdvisorRunSerializer,
    LiveForecastInput,
)
from console.api.views.common import valid
from opsplanner.models import AdvisorRun
from opsplanner.models.advisor import AdvisorRunKind
from opsplanner.permissions import Action
from simulation.advisor_runs import HARDWARE_KNOBS, advisor_live_forecast_request, advisor_run_request

RUN_REQUEST = PolymorphicProxySerializer(
    component_name="NewAdvisorRun",
    serializers={
        AdvisorRunKind.DOMAIN_SIZE.value: AdvisorRunInput,
        AdvisorRunKind.LIVE_FORECAST.value: LiveForecastInput,
    },
    resource_type_field_name="kind",
)


class AdvisorRunViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Advisor runs: POST queues one (one run at a time; another is refused with 409); poll the run until
    it is done or failed. `kind` domain_size (the default): which maintenance-domain size suits a pool,
    each candidate size simulated. `kind` live_forecast: the live pool copied into scratch databases and
    its pending upgrades forecast over the next days under each policy (`forecast` once done)."""

    serializer_class = AdvisorRunSerializer
    action_permissions = {"create": Action.OPERATE}

    def get_queryset(self) -> QuerySet[AdvisorRun]:
        return AdvisorRun.objects.order_by("-created_at", "-id")

    @extend_schema(request=RUN_REQUEST, responses={202: AdvisorRunSerializer})
    @idempotent
    def create(self, request: Any) -> Response:
        body = request.data if isinstance(request.data, dict) else {}  # a list: the domain-size input says why
        kind = valid(AdvisorRunKindInput, {"kind": body.get("kind", AdvisorRunKind.DOMAIN_SIZE)})["kind"]
        if kind == AdvisorRunKind.LIVE_FORECAST:
            data = valid(LiveForecastInput, request.data)
            run = advisor_live_forecast_request(
                pool=data["pool"], days=data["days"], policies=data.get("policies"), seed=data["seed"],
                actor=request.user,
            )  # fmt: skip
        else:
            data = valid(AdvisorRunInput, request.data)
            run = advisor_run_request(
                pool_hosts=data["pool_hosts"],
                sizes=data["sizes"],
                interruption_cost=data["interruption_cost"],
                capacity_hour_cost=data["capacity_hour_cost"],
                cycle_slo_hours=data["cycle_slo_hours"],
                seed=data["seed"],
                hardware={name: data[name] for name in HARDWARE_KNOBS if name in data},
                actor=request.user,
            )
        return Response(self.get_serializer(run).data, status=status.HTTP_202_ACCEPTED)
