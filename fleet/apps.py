from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "Fleet inventory"

    def ready(self) -> None:
        from fleet.views import hosts  # noqa: F401 - registers the host page's live renderer
