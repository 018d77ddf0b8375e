"""python manage.py submit_operation --kind upgrade --component gpu-driver --target-version 560.35.03 \
        --scope "10% of pool ai-train-east" --reason "driver rollout" [--wait]

Submit an operation from the command line (the same service the API and the UI call). With
--wait, follow it until it is closed, printing its tasks by state.
"""

from __future__ import annotations

import time

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db.models import Count

from opsplanner.adapters import POOLS_ADAPTER
from opsplanner.models import OPERATOR_KINDS, HostTask, Operation, OperationSource, OperationState
from opsplanner.services.operations import operation_submit, operator_source_refusal


class Command(BaseCommand):
    help = "Submit an ad-hoc operation (upgrade, reboot, verification) over a scope of hosts."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--kind", required=True, choices=OPERATOR_KINDS, help="repairs are the repair flow's own")
        parser.add_argument("--scope", required=True, help="'pool P', 'N%% of pool P', 'domain P/D', 'hosts: a, b'")
        parser.add_argument("--reason", required=True)
        parser.add_argument("--component", default="")
        parser.add_argument("--target-version", dest="target_version", default="")
        parser.add_argument("--priority", type=int, default=100)
        parser.add_argument(
            "--source",
            default=OperationSource.AD_HOC,
            choices=OperationSource.values,
            help="only ad_hoc: the others are submitted by trains and the repair flow",
        )
        parser.add_argument("--gang", action="store_true")
        parser.add_argument("--executor", default=POOLS_ADAPTER, help="an executor; default: the pool's")
        parser.add_argument("--drainer", default=POOLS_ADAPTER, help="a drainer; default: the pool's")
        parser.add_argument("--wait", action="store_true", help="follow the operation until it is closed")
        parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait at most")

    def handle(self, *args: object, **options: object) -> None:
        if why := operator_source_refusal(str(options["source"])):
            raise CommandError(f"refused: {why}")
        try:
            operation = operation_submit(
                kind=str(options["kind"]),
                scope=str(options["scope"]),
                reason=str(options["reason"]),
                component=str(options["component"]),
                version=str(options["target_version"]),
                priority=int(options["priority"]),  # type: ignore[call-overload]
                source=str(options["source"]),
                gang=bool(options["gang"]),
                executor=str(options["executor"]),
                drainer=str(options["drainer"]),
                actor="command line",
            )
        except ValidationError as error:
            raise CommandError("refused: " + " ".join(error.messages)) from None
        self.stdout.write(f"submitted operation #{operation.pk} with {operation.tasks.count()} host tasks")
        if options["wait"]:
            self._follow(operation, float(options["timeout"]))  # type: ignore[arg-type]

    def _follow(self, operation: Operation, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            counts = dict(
                HostTask.objects.filter(operation=operation)
                .values("state")
                .annotate(n=Count("id"))
                .values_list("state", "n")
            )
            line = ", ".join(f"{state} {count}" for state, count in sorted(counts.items()))
            if line != last:
                self.stdout.write(f"operation #{operation.pk}: {line}")
                self.stdout.flush()
                last = line
            state = Operation.objects.values_list("state", flat=True).get(pk=operation.pk)
            if state != OperationState.OPEN:
                self.stdout.write(f"operation #{operation.pk} {state}")
                return
            time.sleep(1)
        raise CommandError(f"operation #{operation.pk} still open after {timeout:.0f} s")
