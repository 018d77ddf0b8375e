from django.apps import AppConfig


class OpsPlannerConfig(AppConfig):
    name = "opsplanner"
    verbose_name = "OpsPlanner core"

    def ready(self) -> None:
        from opsplanner import embedded

        embedded.prepare_var_dir()
