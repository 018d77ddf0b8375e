"""python manage.py fleet_sync slurm [--dry-run]: the hosts a Slurm cluster knows, proposed as a
fleet-file diff against the inventory and applied by the fleet file's plan and apply (adds and
updates, never removes). The rules (partition → pool, feature or name → domain) are options."""

from __future__ import annotations

import re
from typing import Any, NoReturn

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from fleet.fleetfile import FleetApplyRefused, FleetFileInvalid, plan_text
from fleet.fleetfile.apply import retired_host_said
from fleet.sync import SourceError, Synced, sync_hosts
from fleet.sync.slurm import SlurmRules, by_node, host_rows, slurm_nodes


def _pool_map(pairs: list[str]) -> dict[str, str]:
    mapping = {}
    for pair in pairs:
        partition, sep, pool = pair.partition("=")
        if not sep or not partition or not pool:
            raise CommandError(f"--pool-map {pair!r}: expected PARTITION=POOL")
        mapping[partition] = pool
    return mapping


class Command(BaseCommand):
    help = "Sync hosts from a system that knows them (slurm): print the plan, then apply it unless --dry-run."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("source", choices=["slurm"], help="where the hosts come from")
        parser.add_argument("--dry-run", action="store_true", help="print the plan, write nothing")
        parser.add_argument("--slurm-conf", default=None, help="the cluster's slurm.conf (default: SLURM_CONF)")
        parser.add_argument(
            "--reader", choices=["auto", "json", "scontrol"], default="auto", help="sinfo --json, or scontrol"
        )
        parser.add_argument(
            "--pool-map", action="append", default=[], metavar="PARTITION=POOL",
            help="the pool of a partition's nodes (repeat; default: the pool named like the partition)",
        )  # fmt: skip
        parser.add_argument("--domain-feature", default="rack", help="a node feature with this prefix is its domain")
        parser.add_argument(
            "--domain-pattern", default="", help="else a regex on the node name; its `domain` (or first) group"
        )
        parser.add_argument("--hostname-format", default="{node}", help="the host's name: {node}, {hostname}")
        parser.add_argument("--sku", default="slurm-node", help="the SKU of hosts without an SKU feature")
        parser.add_argument("--sku-feature", default="", help="a node feature with this prefix is its SKU")
        parser.add_argument("--reason", default="", help="why, recorded on every event")

    def handle(self, *args: object, **options: Any) -> None:
        try:
            options["hostname_format"].format(node="n1", hostname="h1")
        except (KeyError, IndexError, ValueError):
            raise CommandError("--hostname-format may only use {node} and {hostname}") from None
        try:
            re.compile(options["domain_pattern"])
        except re.error as error:
            raise CommandError(f"--domain-pattern {options['domain_pattern']!r} is not a regex: {error}") from None
        rules = SlurmRules(
            pool_map=_pool_map(options["pool_map"]),
            domain_feature=options["domain_feature"],
            domain_pattern=options["domain_pattern"],
            hostname_format=options["hostname_format"],
            sku=options["sku"],
            sku_feature=options["sku_feature"],
        )
        try:
            nodes = slurm_nodes(conf=options["slurm_conf"], reader=options["reader"])
        except SourceError as error:
            raise CommandError(str(error)) from None
        found = host_rows(nodes, rules)
        for skipped in found.skipped:
            self.stdout.write(f"skipped: node {skipped}")
        if found.problems:
            self._fail(found.problems)
        synced = self._apply(found.rows, options)
        for hostname in synced.kept_retired:
            self.stdout.write(f"kept retired, though Slurm lists it: {retired_host_said(hostname)}")
        plan = synced.plan
        self.stdout.write(plan_text(plan))
        if plan.applied:
            self.stdout.write(f"Applied {len(plan.changes)} changes.")
        elif not options["dry_run"]:
            self.stdout.write("Nothing to do.")

    def _apply(self, rows: list[dict[str, Any]], options: dict[str, Any]) -> Synced:
        try:
            return sync_hosts(
                rows=rows,
                dry_run=options["dry_run"],
                actor="fleet_sync",
                reason=options["reason"] or "synced from Slurm",
            )
        except FleetFileInvalid as invalid:
            self._fail(by_node(invalid.problems, rows))
        except FleetApplyRefused as refused:
            self.stdout.write(plan_text(refused.plan))
            raise CommandError(f"{len(refused.plan.refusals)} changes refused; nothing was written") from None
        except ValidationError as error:  # a row changed under the apply: sync again
            raise CommandError(f"{' '.join(error.messages)}; nothing was written") from None

    def _fail(self, problems: list[Any]) -> NoReturn:
        for problem in problems:
            self.stderr.write(f"error: {problem}")
        raise CommandError(f"{len(problems)} errors in what Slurm lists; nothing was written")
