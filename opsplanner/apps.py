from django.apps import AppConfig
from django.db.models.signals import post_migrate


class OpsPlannerConfig(AppConfig):
    name = "opsplanner"
    verbose_name = "OpsPlanner core"

    def ready(self) -> None:
        from opsplanner import embedded, lookups  # noqa: F401 - registers field__any
        from opsplanner.roles import roles_ensure_after_migrate

        embedded.prepare_var_dir()
        # The role groups exist after `migrate` on every install (and after a test flush).
        post_migrate.connect(roles_ensure_after_migrate, sender=self, dispatch_uid="opsplanner.roles_ensure")
