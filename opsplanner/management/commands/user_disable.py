"""python manage.py user_disable NAME [--reason TEXT]

Deactivate a user: they can no longer log in, their API tokens are revoked and their sessions end.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandParser

from opsplanner.management.commands._users_cli import cli_actor, refused
from opsplanner.services.users import user_disable


class Command(BaseCommand):
    help = "Deactivate a user, revoke their API tokens and end their sessions."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--reason", default="", help="why, recorded in the event")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            result = user_disable(username=options["username"], reason=options["reason"], actor=cli_actor())
        except ValidationError as error:
            raise refused(error) from None
        self.stdout.write(
            f"disabled {result.user.username}: {result.tokens_revoked} token(s) revoked, "
            f"{result.sessions_ended} session(s) ended"
        )
