"""python manage.py token_create NAME [--ttl HOURS] [--description D]

Create an API token (knox) for an active user. The token is printed once, alone on stdout, so a
script can capture it (`TOKEN=$(manage.py token_create executor-1)`); everything else goes to
stderr. Only its hash is stored, and the event does not contain it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandParser
from knox.settings import knox_settings

from opsplanner.management.commands._users_cli import cli_actor, refused
from opsplanner.services.users import MAX_TOKEN_TTL, token_create


class Command(BaseCommand):
    help = "Create an API token for a user and print it once on stdout."

    def add_arguments(self, parser: CommandParser) -> None:
        default_hours = int(knox_settings.TOKEN_TTL.total_seconds() // 3600) if knox_settings.TOKEN_TTL else 0
        max_hours = int(MAX_TOKEN_TTL.total_seconds() // 3600)
        parser.add_argument("username")
        parser.add_argument(
            "--ttl",
            type=int,
            default=None,
            help=f"hours the token lives (default {default_hours}, at most {max_hours})",
        )
        parser.add_argument("--description", default="", help="what the token is for, recorded in the event")

    def handle(self, *args: Any, **options: Any) -> None:
        hours = options["ttl"]
        ttl = None if hours is None else dt.timedelta(hours=min(max(hours, -1), 10**6))
        try:
            created = token_create(
                username=options["username"], ttl=ttl, description=options["description"], actor=cli_actor()
            )
        except ValidationError as error:
            raise refused(error) from None
        expiry = f"expires {created.expiry:%Y-%m-%d %H:%M} UTC" if created.expiry else "never expires"
        self.stderr.write(f"token for {created.user.username}, {expiry}; it is shown only this once:", style_func=str)
        self.stdout.write(created.token)
