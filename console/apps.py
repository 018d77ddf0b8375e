from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "OpsPlanner console"

    def ready(self) -> None:
        from console.api import schema  # noqa: F401 - registers the OpenAPI token scheme
        from console.views import approvals, gantt, pages  # noqa: F401 - register their live pages
