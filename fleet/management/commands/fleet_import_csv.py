"""python manage.py fleet_import_csv FILE --pool P [--dry-run]: hosts of one pool from a CSV
(hostname, domain, sku, gpus, labels as k=v;k=v), planned and applied like a fleet file."""

from __future__ import annotations

import sys
from pathlib import Path

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.fleetfile import FleetApplyRefused, FleetFileInvalid, plan_text
from fleet.fleetfile.csv_source import csv_import


class Command(BaseCommand):
    help = "Import hosts of one pool from a CSV: print the plan, then apply it unless --dry-run."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", help="the CSV file, or - for standard input")
        parser.add_argument("--pool", required=True, help="the pool the hosts belong to (it must exist)")
        parser.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
        parser.add_argument("--reason", default="", help="why, recorded on every event")

    def handle(self, *args: object, file: str, pool: str, dry_run: bool, reason: str, **options: object) -> None:
        try:
            text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as error:
            raise CommandError(f"cannot read {file}: {error}") from None
        try:
            plan = csv_import(text=text, pool=pool, dry_run=dry_run, actor="fleet_import_csv", reason=reason)
        except FleetFileInvalid as invalid:
            for problem in invalid.problems:
                self.stderr.write(f"error: {problem}")
            raise CommandError(f"{len(invalid.problems)} errors in {file}; nothing was written") from None
        except FleetApplyRefused as refused:
            self.stdout.write(plan_text(refused.plan))
            raise CommandError(f"{len(refused.plan.refusals)} changes refused; nothing was written") from None
        except ValidationError as error:
            raise CommandError(f"{' '.join(error.messages)}; nothing was written") from None
        self.stdout.write(plan_text(plan))
        if plan.applied:
            self.stdout.write(f"Applied {len(plan.changes)} changes.")
        elif not dry_run:
            self.stdout.write("Nothing to do.")
