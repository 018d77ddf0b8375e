"""Domain-size advisor runs: operators queue one (202, a worker runs it); whoever reads the fleet reads them."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.response import Response

from console.api.idempotency import idempotent
from console.api.serializers.advisor import AdvisorRunInput, AdvisorRunSerializer
from console.api.views.common import valid
from opsplanner.models import AdvisorRun
from opsplanner.permissions import Action
from simulation.advisor_runs import HARDWARE_KNOBS, advisor_run_request


class AdvisorRunViewSet(mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Which maintenance-domain size suits a pool: POST queues a simulation of each candidate size
    (at most two runs at once; a third is refused with 409); poll the run until it is done or failed."""

    serializer_class = AdvisorRunSerializer
    action_permissions = {"create": Action.OPERATE}

    def get_queryset(self) -> QuerySet[AdvisorRun]:
        return AdvisorRun.objects.order_by("-created_at", "-id")

    @extend_schema(request=AdvisorRunInput, responses={202: AdvisorRunSerializer})
    @idempotent
    def create(self, request: Any) -> Response:
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
