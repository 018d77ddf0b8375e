"""python manage.py check_invariants [--pool NAME]: exit 1 and list the violations, if any."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.models import Pool
from opsplanner.selectors.invariants import check_invariants


class Command(BaseCommand):
    help = "Verify the live database against the invariants (leases, floors, verification, stuck hosts, events)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--pool", default=None, help="check one pool only")

    def handle(self, *args: object, pool: str | None, **options: object) -> None:
        target = None
        if pool is not None:
            target = Pool.objects.filter(name=pool).first()
            if target is None:
                raise CommandError(f"There is no pool named {pool!r}.")
        violations = check_invariants(pool=target)
        for violation in violations:
            self.stderr.write(str(violation))
        if violations:
            raise CommandError(f"{len(violations)} invariant violation(s)", returncode=1)
        self.stdout.write("check_invariants: no violation")
