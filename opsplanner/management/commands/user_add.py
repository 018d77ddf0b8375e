"""python manage.py user_add NAME --role operator|service_owner|viewer|executor
        [--password-stdin] [--service S ...] [--email E]

Create a user with exactly one role. Without --password-stdin the user has no usable password
(API tokens only, see token_create, or set one later with changepassword); with it, one line is read
from stdin and checked by Django's password validators. --service (service owners only) makes the
user an owner of those services.
"""

from __future__ import annotations

import getpass
import sys
from typing import Any, TextIO

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from opsplanner.management.commands._users_cli import cli_actor, refused
from opsplanner.roles import Role
from opsplanner.services.users import user_add


def password_read(stdin: TextIO) -> str:
    """One line from stdin (a prompt without echo on a terminal), without its line ending."""
    if stdin is sys.stdin and stdin.isatty():
        return getpass.getpass("Password: ")
    line = stdin.readline()
    if not line:
        raise CommandError("refused: --password-stdin given but stdin is empty.")
    return line.rstrip("\r\n")


class Command(BaseCommand):
    help = f"Create a user with one role ({', '.join(Role.ALL)})."
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--role", required=True, help=f"one of {', '.join(Role.ALL)}")
        parser.add_argument("--password-stdin", action="store_true", help="read the password from one line of stdin")
        parser.add_argument(
            "--service", dest="services", action="extend", nargs="+", default=[], help="owned services (service_owner)"
        )
        parser.add_argument("--email", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        password = password_read(options.get("stdin") or sys.stdin) if options["password_stdin"] else None
        try:
            user = user_add(
                username=options["username"],
                role=options["role"],
                password=password,
                email=options["email"],
                services=options["services"],
                actor=cli_actor(),
            )
        except ValidationError as error:
            raise refused(error) from None
        owned = sorted(user.owned_services.values_list("name", flat=True))
        line = f"created user {user.username} with role {options['role']}"
        if owned:
            line += f", owner of {', '.join(owned)}"
        self.stdout.write(line)
        if password is None:
            name = user.username
            self.stdout.write(
                f"{name} has no usable password (token only): create a token with `manage.py token_create {name}`, "
                f"or set a password with `manage.py changepassword {name}`"
            )
