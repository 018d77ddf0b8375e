"""python manage.py user_role NAME --role operator|service_owner|viewer|executor [--service S ...]

Replace a user's role (a user holds one role group at a time). For a service owner, --service sets
the services they own (without it, what they own stays); any other role owns no service.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandParser

from opsplanner.management.commands._users_cli import cli_actor, refused
from opsplanner.roles import Role
from opsplanner.services.users import user_role_set


class Command(BaseCommand):
    help = f"Replace a user's role ({', '.join(Role.ALL)})."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", required=True, help=f"one of {', '.join(Role.ALL)}")
        parser.add_argument(
            "--service",
            dest="services",
            action="extend",
            nargs="+",
            default=None,
            help="owned services (service_owner)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            user = user_role_set(
                username=options["username"], role=options["role"], services=options["services"], actor=cli_actor()
            )
        except ValidationError as error:
            raise refused(error) from None
        owned = sorted(user.owned_services.values_list("name", flat=True))
        line = f"{user.username} now has role {options['role']}"
        if options["role"] == Role.SERVICE_OWNER:
            line += f", owner of {', '.join(owned)}" if owned else ", owning no service yet"
        self.stdout.write(line)
        if user.is_superuser:
            self.stderr.write(
                f"note: {user.username} is a superuser, and acts as an operator whatever their role", style_func=str
            )
