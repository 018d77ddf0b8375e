from django.apps import AppConfig


class TrainsConfig(AppConfig):
    name = "trains"
    verbose_name = "Maintenance trains"

    def ready(self) -> None:
        # What an approval unlocks for trains and upgrades (the approvals service dispatches by kind).
        from opsplanner.models import ApprovalKind
        from opsplanner.services.approvals import approval_handler_register
        from trains.services.emergency import on_emergency_decided
        from trains.services.phases import on_phase_skip_decided
        from trains.services.reonboarding import on_reonboard_decided

        approval_handler_register(kind=ApprovalKind.EMERGENCY_TRAIN, handler=on_emergency_decided)
        approval_handler_register(kind=ApprovalKind.REONBOARD_UPGRADE, handler=on_reonboard_decided)
        approval_handler_register(kind=ApprovalKind.SKIP_PHASE, handler=on_phase_skip_decided)
        # The trains page's live renderer registers when its module is imported.
        from trains.views import trains_pages  # noqa: F401
