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

import argparse
import datetime as dt
import logging
import re
import signal
import socket
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsplanner_adapters.client import ApiClient, ApiError, ApiUnreachable, Backoff
from opsplanner_adapters.slurm import NodeState, Slurm, SlurmError

ADAPTER = "slurm"
KINDS = ("drain", "undrain")
log = logging.getLogger("opsplanner.slurm_drainer")


# -- configuration -------------------------------------------------------------------------------------
class ConfigError(Exception):
    """The configuration cannot be used; the message is one line naming the key."""


@dataclass(frozen=True)
class DrainerConfig:
    api_url: str
    token: str
    worker: str
    slurm_conf: str | None = None
    reason_prefix: str = "opsplanner:"
    poll_interval_s: float = 5.0
    lease_s: int = 120
    deadline_margin_s: float = 15.0
    max_items: int = 50
    timeout_s: float = 30.0
    backoff_cap_s: float = 60.0
    node_label: str = "slurm_node"
    node_pattern: str = "{short}"
    node_map: dict[str, str] = field(default_factory=dict)

    @property
    def heartbeat_s(self) -> float:
        return self.lease_s / 3

    def node_name(self, item: dict[str, Any]) -> str:
        """The host's Slurm node: the mapping, else the host's label, else the pattern over its name."""
        hostname = str(item.get("hostname") or "")
        if hostname in self.node_map:
            return self.node_map[hostname]
        label = (item.get("labels") or item.get("host_labels") or {}).get(self.node_label)
        if label:
            return str(label)
        return self.node_pattern.format(hostname=hostname, short=hostname.split(".", 1)[0])


_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _table(doc: dict[str, Any], name: str) -> dict[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"[{name}] must be a table")
    return value


def _number(table: dict[str, Any], key: str, default: float, *, section: str, minimum: float = 0.1) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
        raise ConfigError(f"{section}.{key} must be a number of at least {minimum}, not {value!r}")
    return float(value)


def _token(api: dict[str, Any], base: Path) -> str:
    if "token" in api:
        token = api["token"]
    elif "token_file" in api:
        path = base / str(api["token_file"])
        try:
            token = path.read_text().strip()
        except OSError as error:
            raise ConfigError(f"api.token_file {path}: {error.strerror}") from None
    else:
        raise ConfigError("api.token (or api.token_file) is required: an executor token from `manage.py token_create`")
    if not isinstance(token, str) or not token:
        raise ConfigError("api.token must be a non-empty string")
    return token


def _nodes(nodes: dict[str, Any]) -> tuple[str, str, dict[str, str]]:
    pattern = nodes.get("pattern", "{short}")
    try:
        sample = str(pattern).format(hostname="h.example", short="h")
    except (KeyError, IndexError, ValueError):
        raise ConfigError(f"nodes.pattern {pattern!r} may only use {{hostname}} and {{short}}") from None
    if not _NODE_NAME.match(sample):
        raise ConfigError(f"nodes.pattern {pattern!r} does not give a node name")
    mapping = nodes.get("map", {})
    if not isinstance(mapping, dict) or not all(isinstance(v, str) and _NODE_NAME.match(v) for v in mapping.values()):
        raise ConfigError("nodes.map must map host names to Slurm node names")
    return str(nodes.get("label", "slurm_node")), str(pattern), dict(mapping)


def load_config(path: str, *, default_worker: str) -> DrainerConfig:
    """Read and check the TOML file; ConfigError (one line) for anything wrong."""
    try:
        doc = tomllib.loads(Path(path).read_text())
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path} is not valid TOML: {error}") from None
    api, slurm, nodes = _table(doc, "api"), _table(doc, "slurm"), _table(doc, "nodes")
    url = api.get("url")
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise ConfigError(f"api.url must be an http:// or https:// URL, not {url!r}")
    conf = slurm.get("conf")
    if conf is not None and not Path(str(conf)).is_file():
        raise ConfigError(f"slurm.conf {conf} does not exist")
    prefix = slurm.get("reason_prefix", "opsplanner:")
    if not isinstance(prefix, str) or len(prefix) < 3:
        raise ConfigError("slurm.reason_prefix must be a string of at least 3 characters")
    label, pattern, mapping = _nodes(nodes)
    return DrainerConfig(
        api_url=url,
        token=_token(api, Path(path).parent),
        worker=str(api.get("worker") or default_worker),
        timeout_s=_number(api, "timeout_s", 30, section="api"),
        slurm_conf=str(conf) if conf is not None else None,
        reason_prefix=prefix,
        poll_interval_s=_number(slurm, "poll_interval_s", 5, section="slurm"),
        lease_s=int(_number(slurm, "lease_s", 120, section="slurm", minimum=3)),
        deadline_margin_s=_number(slurm, "deadline_margin_s", 15, section="slurm", minimum=0),
        max_items=int(_number(slurm, "max_items", 50, section="slurm", minimum=1)),
        backoff_cap_s=_number(api, "backoff_cap_s", 60, section="api", minimum=1),
        node_label=label,
        node_pattern=pattern,
        node_map=mapping,
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


def _parse_time(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def jobs_text(jobs: list[Any]) -> str:
    return ", ".join(str(job) for job in jobs)


class Drainer:
    """The loop's state: the items in progress. `step()` does one round: advance each, then claim."""

    def __init__(self, config: DrainerConfig, *, client: ApiClient | None = None, slurm: Slurm | None = None) -> None:
        self.config = config
        self.client = client or ApiClient(config.api_url, config.token, config.worker, timeout_s=config.timeout_s)
        self.slurm = slurm or Slurm(conf=config.slurm_conf)
        self.active: dict[int, Active] = {}
        self.clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)

    # -- the loop -------------------------------------------------------------------------------------
    def step(self) -> None:
        """Advance every item in hand, then claim what fits (started now, advanced at the next
        step); raises ApiUnreachable or ApiError when the claim fails, after the items moved on."""
        for item_id in list(self.active):
            self.advance(self.active[item_id])
        room = self.config.max_items - len(self.active)
        if room > 0:
            claimed = self.client.claim(
                adapter=ADAPTER, kinds=KINDS, limit=room, lease_seconds=self.config.lease_s, wait_seconds=0
            )
            for item in claimed:
                self.start(item)

    def start(self, item: dict[str, Any]) -> None:
        node = self.config.node_name(item)
        active = Active(
            item=item, node=node, deadline=_parse_time(item.get("deadline_at")), heartbeat_at=time.monotonic()
        )
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
        owner = f"operation {item['operation']}" if item.get("operation") else f"task {item.get('host_task')}"
        return f"{self.config.reason_prefix} {owner} item {item['id']}"

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
        if time.monotonic() - active.heartbeat_at < self.config.heartbeat_s:
            return
        try:
            still_ours = self.client.heartbeat(active.item, lease_seconds=self.config.lease_s)
        except (ApiUnreachable, ApiError) as error:
            log.warning("heartbeat of item %s: %s", active.item["id"], error)
            return
        active.heartbeat_at = time.monotonic()
        if not still_ours:
            log.warning("item %s is no longer ours; leaving node %s as it is", active.item["id"], active.node)
            del self.active[active.item["id"]]

    def _report(self, active: Active) -> None:
        item, outcome = active.item, active.outcome
        assert outcome is not None
        key = f"slurm-{item['id']}-{item['attempt']}"
        result = {"details": (outcome.details or outcome.reason)[:2000]}
        try:
            self.client.report(item, ok=outcome.ok, reason=outcome.reason, result=result, report_key=key)
        except ApiUnreachable as error:
            log.warning("report of item %s: %s; retrying", item["id"], error)
            return
        except ApiError as error:
            # Already finished by the tick (its deadline passed) or taken back: nothing more to say.
            log.warning("report of item %s refused: %s", item["id"], error)
        log.info("item %s %s: %s", item["id"], "done" if outcome.ok else "failed", outcome.details or outcome.reason)
        del self.active[item["id"]]


def run(config: DrainerConfig, *, stop: Callable[[], bool]) -> None:
    drainer = Drainer(config)
    backoff = Backoff(base_s=config.poll_interval_s, cap_s=config.backoff_cap_s)
    log.info("claiming %s items at %s as %s", ", ".join(KINDS), config.api_url, config.worker)
    while not stop():
        try:
            drainer.step()
            backoff.reset()
            delay = config.poll_interval_s
        except ApiUnreachable as error:
            # The items in hand were advanced before the claim: nodes keep draining, reports wait.
            delay = backoff.next_delay()
            log.warning("API unreachable (%s); next try in %.1fs", error, delay)
        except ApiError as error:
            delay = backoff.next_delay()
            log.error("the API refused the claim: %s; next try in %.1fs", error, delay)
        _sleep(delay, stop)


def _sleep(seconds: float, stop: Callable[[], bool]) -> None:
    end = time.monotonic() + seconds
    while not stop() and time.monotonic() < end:
        time.sleep(min(0.2, end - time.monotonic()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="opsplanner-slurm-drainer", description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the TOML configuration file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        config = load_config(args.config, default_worker=f"slurm-drainer@{socket.gethostname()}")
    except ConfigError as error:
        print(f"opsplanner-slurm-drainer: {error}", file=sys.stderr)
        return 2
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    signal.signal(signal.SIGINT, lambda signum, frame: stopping.append(signum))
    # Items in progress keep their leases when we stop: a restarted drainer gets them back
    # after the lease, and finds the node as it left it.
    run(config, stop=lambda: bool(stopping))
    return 0


if __name__ == "__main__":
    sys.exit(main())
