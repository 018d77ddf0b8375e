from django.apps import AppConfig


class OpsPlannerConfig(AppConfig):
    name = "opsplanner"
    verbose_name = "OpsPlanner core"

    def ready(self) -> None:
        from opsplanner import embedded, lookups  # noqa: F401 - registers field__any

        embedded.prepare_var_dir()
