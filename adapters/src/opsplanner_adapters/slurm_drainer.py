"""opsplanner-slurm-drainer: drains and returns hosts that are Slurm nodes, for OpsPlanner.

    opsplanner-slurm-drainer --config /etc/opsplanner/slurm-drainer.toml

It claims the drain and undrain items of adapter "slurm" through the API and works on many nodes at
once from one loop (a drain may wait hours for a job; nothing blocks on it):

- drain: `scontrol update State=DRAIN Reason="opsplanner: operation N item M"`, heartbeat while the
  node is draining, done once it is drained (no job left). Shortly before the item's deadline it
  gives up and reports failed with the jobs still running (id, name, user); the node stays drained
  for the undrain that follows. A node another party drained keeps its reason: the drain waits
  for it like any other, and the undrain will not resume it.
- undrain: `State=RESUME` only when the node's reason starts with our prefix, then done once the
  node is idle (or already running a new job) and responding. A node drained by someone else
  ("hardware: dimm") is never resumed: the undrain fails naming that reason, so the host is not
  counted in service while Slurm keeps it out (it goes to repair, and is escalated if it stays out).
- redelivered items are harmless: a node already drained by us is not drained again, a node
  already back in service is done.
- when the API is unreachable the loop backs off (doubling, capped); reports are retried with the
  same idempotency key."""

from __future__ import annotations

import datetime as dt
import logging
import re
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsplanner_adapters.client import ApiClient
from opsplanner_adapters.config import ConfigError, table
from opsplanner_adapters.drainer_loop import (
    DrainerSettings,
    NodeRules,
    claim_what_fits,
    deadline_of,
    drainer_main,
    drainer_settings,
    heartbeat_if_due,
    item_subject,
    report,
    run_loop,
)
from opsplanner_adapters.slurm import NodeState, Slurm, SlurmError

ADAPTER = "slurm"
log = logging.getLogger("opsplanner.slurm_drainer")


# -- configuration -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DrainerConfig(DrainerSettings):
    slurm_conf: str | None = None
    reason_prefix: str = "opsplanner:"
    max_items: int = 50
    node_label: str = "slurm_node"
    node_pattern: str = "{short}"

    def node_name(self, item: dict[str, Any]) -> str:
        """The host's Slurm node: the mapping, else the host's label, else the pattern over its name."""
        hostname = str(item.get("hostname") or "")
        label = (item.get("labels") or item.get("host_labels") or {}).get(self.node_label)
        if label and hostname not in self.node_map:
            return str(label)
        return self.named_node(hostname)


NODES = NodeRules(
    default_pattern="{short}", valid=re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$"), described_as="Slurm node names"
)


def load_config(path: str, *, default_worker: str) -> DrainerConfig:
    """Read and check the TOML file; ConfigError (one line) for anything wrong."""
    doc, common = drainer_settings(path, section="slurm", default_worker=default_worker, max_items=50, nodes=NODES)
    slurm, nodes = table(doc, "slurm"), table(doc, "nodes")
    conf = slurm.get("conf")
    if conf is not None and not Path(str(conf)).is_file():
        raise ConfigError(f"slurm.conf {conf} does not exist")
    prefix = slurm.get("reason_prefix", "opsplanner:")
    if not isinstance(prefix, str) or len(prefix) < 3:
        raise ConfigError("slurm.reason_prefix must be a string of at least 3 characters")
    return DrainerConfig(
        **vars(common),
        slurm_conf=str(conf) if conf is not None else None,
        reason_prefix=prefix,
        node_label=str(nodes.get("label", "slurm_node")),
    )


# -- the work ----------------------------------------------------------------------------------------
@dataclass
class Outcome:
    ok: bool
    reason: str
    details: str = ""


@dataclass
class Active:
    """An item this process works on: its node, when it was last heartbeat, a report to resend."""

    item: dict[str, Any]
    node: str
    deadline: dt.datetime | None
    heartbeat_at: float
    outcome: Outcome | None = None
    # The drain is on the node (ours or someone else's) / the resume was sent: until then a Slurm
    # command that failed is tried again at the next poll.
    requested: bool = False


def jobs_text(jobs: list[Any]) -> str:
    return ", ".join(str(job) for job in jobs)


class Drainer:
    """The loop's state: the items in progress. `step()` does one round: advance each, then claim."""

    def __init__(self, config: DrainerConfig, *, client: ApiClient | None = None, slurm: Slurm | None = None) -> None:
        self.config = config
        self.client = client or config.api_client()
        self.slurm = slurm or Slurm(conf=config.slurm_conf)
        self.active: dict[int, Active] = {}
        self.clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)

    # -- the loop -------------------------------------------------------------------------------------
    def step(self) -> None:
        """Advance every item in hand, then claim what fits (started now, advanced at the next
        step); raises ApiUnreachable or ApiError when the claim fails, after the items moved on."""
        for item_id in list(self.active):
            self.advance(self.active[item_id])
        for item in claim_what_fits(self.client, self.config, adapter=ADAPTER, in_hand=len(self.active)):
            self.start(item)

    def start(self, item: dict[str, Any]) -> None:
        node = self.config.node_name(item)
        active = Active(item=item, node=node, deadline=deadline_of(item), heartbeat_at=time.monotonic())
        self.active[item["id"]] = active
        log.info("claimed %s item %s for host %s (Slurm node %s)", item["kind"], item["id"], item.get("hostname"), node)
        try:
            node_state = self.slurm.node(node)
        except SlurmError as error:
            active.outcome = Outcome(False, f"Slurm node {node} (host {item.get('hostname')}): {error}")
            return
        if item["kind"] == "drain":
            self._begin_drain(active, node_state)
        else:
            self._begin_undrain(active, node_state)

    def advance(self, active: Active) -> None:
        if active.outcome is None:
            try:
                active.outcome = self._check(active)
            except SlurmError as error:
                # A passing failure (slurmctld restarting) is retried until the deadline.
                log.warning("item %s: %s", active.item["id"], error)
                if self._at_deadline(active):
                    active.outcome = Outcome(False, f"Slurm node {active.node}: {error}")
        if active.outcome is not None:
            self._report(active)
        else:
            self._heartbeat(active)

    # -- drain and undrain ----------------------------------------------------------------------------
    def reason_for(self, item: dict[str, Any]) -> str:
        return f"{self.config.reason_prefix} {item_subject(item)}"

    def ours(self, node: NodeState) -> bool:
        return node.reason.startswith(self.config.reason_prefix)

    def _begin_drain(self, active: Active, node: NodeState) -> None:
        if node.drain and self.ours(node):
            log.info("node %s is already drained by us (%s)", active.node, node.reason)
        elif node.drain:
            # Someone else's drain: keep their reason (so we never resume it), wait like any drain.
            log.info("node %s is drained by someone else (%s); waiting, not taking it over", active.node, node.reason)
        else:
            try:
                self.slurm.drain(active.node, self.reason_for(active.item))
            except SlurmError as error:
                log.warning("item %s: %s", active.item["id"], error)
                return
            log.info("node %s: drain set (%s)", active.node, self.reason_for(active.item))
        active.requested = True

    def _begin_undrain(self, active: Active, node: NodeState) -> None:
        if not node.drain:
            active.requested = True
            return  # already resumed (a redelivery): the check says when it is idle
        if not self.ours(node):
            active.outcome = Outcome(
                False,
                f"Slurm node {active.node} is drained by someone else (reason: {node.reason!r}); "
                "opsplanner does not resume a drain it did not set",
            )
            return
        try:
            self.slurm.resume(active.node)
        except SlurmError as error:
            log.warning("item %s: %s", active.item["id"], error)
            return
        log.info("node %s: resumed", active.node)
        active.requested = True

    def _check(self, active: Active) -> Outcome | None:
        node = self.slurm.node(active.node)
        if active.item["kind"] == "drain":
            return self._check_drain(active, node)
        return self._check_undrain(active, node)

    def _check_drain(self, active: Active, node: NodeState) -> Outcome | None:
        if not node.drain:
            if not active.requested:
                self._begin_drain(active, node)  # the last scontrol failed: try again
                return None
            return Outcome(False, f"Slurm node {active.node} was resumed by someone else while draining ({node.state})")
        jobs = self.slurm.jobs(active.node)
        if node.drained and not jobs:
            return Outcome(True, "", f"Slurm node {active.node} drained ({node.reason})")
        if self._at_deadline(active):
            still = jobs_text(jobs) if jobs else f"node state {node.state}"
            count = f"{len(jobs)} job{'s' if len(jobs) != 1 else ''}"
            return Outcome(False, f"Slurm node {active.node} still runs {count} at the drain deadline: {still}")
        return None

    def _check_undrain(self, active: Active, node: NodeState) -> Outcome | None:
        if node.schedulable:
            return Outcome(True, "", f"Slurm node {active.node} back in service ({node.state})")
        if node.drain and not self.ours(node):
            return Outcome(False, f"Slurm node {active.node} is drained by someone else (reason: {node.reason!r})")
        if node.drain and not active.requested:
            self._begin_undrain(active, node)  # the last scontrol failed: try again
        if self._at_deadline(active):
            return Outcome(False, f"Slurm node {active.node} did not come back in time: {node.state} {node.reason}")
        return None

    def _at_deadline(self, active: Active) -> bool:
        if active.deadline is None:
            return False
        margin = dt.timedelta(seconds=self.config.deadline_margin_s)
        return self.clock() >= active.deadline - margin

    # -- talking to the API ---------------------------------------------------------------------------
    def _heartbeat(self, active: Active) -> None:
        still_ours, active.heartbeat_at = heartbeat_if_due(
            self.client, active.item, last_at=active.heartbeat_at, lease_s=self.config.lease_s, log=log
        )
        if not still_ours:
            log.warning("item %s is no longer ours; leaving node %s as it is", active.item["id"], active.node)
            del self.active[active.item["id"]]

    def _report(self, active: Active) -> None:
        """Report the outcome; while the API is unreachable, again at the next step."""
        item, outcome = active.item, active.outcome
        assert outcome is not None
        details = outcome.details or outcome.reason
        if report(self.client, item, adapter=ADAPTER, ok=outcome.ok, reason=outcome.reason, details=details, log=log):
            del self.active[item["id"]]


def run(config: DrainerConfig, *, stop: Callable[[], bool]) -> None:
    run_loop(Drainer(config), config, stop=stop, log=log)


def main(argv: list[str] | None = None) -> int:
    # Items in progress keep their leases when we stop: a restarted drainer gets them back
    # after the lease, and finds the node as it left it.
    return drainer_main(
        argv,
        prog="opsplanner-slurm-drainer",
        description=__doc__.splitlines()[0],
        load=lambda path: load_config(path, default_worker=f"slurm-drainer@{socket.gethostname()}"),
        run=lambda config, stop: run(config, stop=stop),
    )


if __name__ == "__main__":
    sys.exit(main())
