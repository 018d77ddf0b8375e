"""python manage.py fleet_export [--pool P] [--output FILE] [--json]: the live inventory as a fleet
file; applying it back changes nothing."""

from __future__ import annotations

from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.fleetfile.export import fleet_export_document, fleet_export_text


class Command(BaseCommand):
    help = "Write the live inventory (every pool, or one) as a fleet file."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--pool", default=None, help="only this pool (its domains, hosts and placements)")
        parser.add_argument("--output", default=None, help="write to this file instead of standard output")
        parser.add_argument("--json", action="store_true", help="JSON instead of YAML")

    def handle(self, *args: object, pool: str | None, output: str | None, json: bool, **options: object) -> None:
        try:
            text = fleet_export_text(fleet_export_document(pool=pool), as_json=json)
        except ValidationError as error:
            raise CommandError(" ".join(error.messages)) from None
        if output is None:
            self.stdout.write(text, ending="")
        else:
            try:
                Path(output).write_text(text, encoding="utf-8")
            except OSError as error:  # no such directory, a directory, no permission, ...
                raise CommandError(f"--output: cannot write {output}: {error.strerror}") from None
            self.stderr.write(f"fleet_export: wrote {output}")
