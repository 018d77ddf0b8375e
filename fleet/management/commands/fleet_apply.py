"""python manage.py fleet_apply FILE [--dry-run] [--prune]: plan a fleet file against the live
inventory, print the plan, and apply it in one transaction (see docs/fleet-file.md)."""

from __future__ import annotations

import sys
from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.fleetfile import FleetApplyRefused, FleetFileInvalid, fleet_apply, parse_fleet_file, plan_text


class Command(BaseCommand):
    help = "Apply a fleet file (YAML or JSON): print the plan, then write it unless --dry-run."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="the fleet file, or - for standard input")
        parser.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
        parser.add_argument(
            "--prune",
            action="store_true",
            help="retire hosts (and remove rules, owners, placements) the file no longer names",
        )
        parser.add_argument("--reason", default="", help="why, recorded on every event")

    def handle(self, *args: object, file: str, dry_run: bool, prune: bool, reason: str, **options: object) -> None:
        try:
            # Bytes: the fleet file's reader says in one line when they are not UTF-8 text.
            text = sys.stdin.buffer.read() if file == "-" else Path(file).read_bytes()
        except OSError as error:
            raise CommandError(f"cannot read {file}: {error.strerror}") from None
        try:
            plan = fleet_apply(
                spec=parse_fleet_file(text), prune=prune, dry_run=dry_run, actor="fleet_apply", reason=reason
            )
        except FleetFileInvalid as invalid:
            for problem in invalid.problems:
                self.stderr.write(f"error: {problem}")
            raise CommandError(f"{len(invalid.problems)} errors in {file}; nothing was written") from None
        except FleetApplyRefused as refused:
            self.stdout.write(plan_text(refused.plan))
            raise CommandError(f"{len(refused.plan.refusals)} changes refused; nothing was written") from None
        except ValidationError as error:  # a row changed under the apply: plan again
            raise CommandError(f"{' '.join(error.messages)}; nothing was written") from None
        self.stdout.write(plan_text(plan))
        if plan.applied:
            self.stdout.write(f"Applied {len(plan.changes)} changes.")
        elif not dry_run:
            self.stdout.write("Nothing to do.")
