"""What the Slurm and the Kubernetes drainers share: their common settings, the claim loop, the
lease heartbeat, the report, and the process's entry point. Each drainer brings what differs:
how it drains and returns a node (`slurm_drainer`: one loop polling every node; `kube_drainer`:
a thread per item), its table (`[slurm]`, `[kubernetes]`) and how its nodes are named.

The loop: step (the drainer advances the items in hand and claims what fits), then wait
`poll_interval_s`; while the API is unreachable or refuses the claim, wait longer (doubling up to
`backoff_cap_s`). On SIGTERM or SIGINT the loop ends and items in progress keep their leases: a
restarted drainer gets them back after the lease and finds the node as it was left."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import re
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from opsplanner_adapters.client import ApiClient, ApiError, ApiUnreachable, Backoff
from opsplanner_adapters.config import ConfigError, api_settings, number, read_toml, table

KINDS = ("drain", "undrain")
MAX_DETAILS = 2000  # the API keeps `details` up to this many characters


@dataclass(frozen=True)
class DrainerSettings:
    """The settings both drainers have; each drainer's configuration adds its own."""

    api_url: str
    token: str
    worker: str
    poll_interval_s: float = 5.0
    lease_s: int = 120
    deadline_margin_s: float = 15.0
    max_items: int = 20
    timeout_s: float = 30.0
    backoff_cap_s: float = 60.0
    node_pattern: str = "{hostname}"
    node_map: dict[str, str] = field(default_factory=dict)

    def api_client(self) -> ApiClient:
        return ApiClient(self.api_url, self.token, self.worker, timeout_s=self.timeout_s)

    def named_node(self, hostname: str) -> str:
        """The host's node by the `[nodes]` table: the mapping, else the pattern over its name."""
        if hostname in self.node_map:
            return self.node_map[hostname]
        return self.node_pattern.format(hostname=hostname, short=hostname.split(".", 1)[0])


@dataclass(frozen=True)
class NodeRules:
    """How a drainer's nodes are named: the default pattern, what a node name looks like, and
    how the `nodes.map` message calls them."""

    default_pattern: str
    valid: re.Pattern[str]
    described_as: str


def drainer_settings(
    path: str, *, section: str, default_worker: str, max_items: int, nodes: NodeRules
) -> tuple[dict[str, Any], DrainerSettings]:
    """The parsed file and its common settings (`[api]`, the loop's keys of `[section]`, `[nodes]`)."""
    doc = read_toml(path)
    api = api_settings(doc, base=Path(path).parent, default_worker=default_worker)
    own = table(doc, section)
    pattern, mapping = _node_naming(table(doc, "nodes"), nodes)
    settings = DrainerSettings(
        api_url=api.url,
        token=api.token,
        worker=api.worker,
        timeout_s=api.timeout_s,
        backoff_cap_s=number(table(doc, "api"), "backoff_cap_s", 60, section="api", minimum=1),
        poll_interval_s=number(own, "poll_interval_s", 5, section=section),
        lease_s=int(number(own, "lease_s", 120, section=section, minimum=3)),
        deadline_margin_s=number(own, "deadline_margin_s", 15, section=section, minimum=0),
        max_items=int(number(own, "max_items", max_items, section=section, minimum=1)),
        node_pattern=pattern,
        node_map=mapping,
    )
    return doc, settings


def _node_naming(nodes: Mapping[str, Any], rules: NodeRules) -> tuple[str, dict[str, str]]:
    pattern = nodes.get("pattern", rules.default_pattern)
    try:
        sample = str(pattern).format(hostname="h.example", short="h")
    except (KeyError, IndexError, ValueError):
        raise ConfigError(f"nodes.pattern {pattern!r} may only use {{hostname}} and {{short}}") from None
    if not rules.valid.match(sample):
        raise ConfigError(f"nodes.pattern {pattern!r} does not give a node name")
    mapping = nodes.get("map", {})
    if not isinstance(mapping, dict) or not all(isinstance(v, str) and rules.valid.match(v) for v in mapping.values()):
        raise ConfigError(f"nodes.map must map host names to {rules.described_as}")
    return str(pattern), dict(mapping)


# -- an item -----------------------------------------------------------------------------------------
def item_subject(item: Mapping[str, Any]) -> str:
    """What the item is part of, for a drain's mark on the node: "operation 12 item 345"."""
    owner = f"operation {item['operation']}" if item.get("operation") else f"task {item.get('host_task')}"
    return f"{owner} item {item['id']}"


def deadline_of(item: Mapping[str, Any]) -> dt.datetime | None:
    """The item's `deadline_at`, None without one."""
    value = item.get("deadline_at")
    if not value:
        return None
    return dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def heartbeat_if_due(
    api: ApiClient, item: Mapping[str, Any], *, last_at: float, lease_s: int, log: logging.Logger
) -> tuple[bool, float]:
    """Extend the item's lease once a third of it has passed since `last_at` (time.monotonic()):
    (still ours, when it was last extended). A failed heartbeat counts as still ours: the lease has
    room for a few misses."""
    if time.monotonic() - last_at < lease_s / 3:
        return True, last_at
    try:
        still_ours = api.heartbeat(item, lease_seconds=lease_s)
    except (ApiUnreachable, ApiError) as error:
        log.warning("heartbeat of item %s: %s", item["id"], error)
        return True, last_at
    return still_ours, time.monotonic()


def report(
    api: ApiClient,
    item: Mapping[str, Any],
    *,
    adapter: str,
    ok: bool,
    reason: str,
    details: str,
    log: logging.Logger,
) -> bool:
    """Report the outcome (the same idempotency key every time, so a retry is harmless): True once
    the API has answered, False while it is unreachable (try again later)."""
    key = f"{adapter}-{item['id']}-{item['attempt']}"
    try:
        api.report(item, ok=ok, reason=reason, result={"details": details[:MAX_DETAILS]}, report_key=key)
    except ApiUnreachable as error:
        log.warning("report of item %s: %s; retrying", item["id"], error)
        return False
    except ApiError as error:
        # Finished by the tick already (its deadline passed) or taken back: nothing more to say.
        log.warning("report of item %s refused: %s", item["id"], error)
        return True
    log.info("item %s %s: %s", item["id"], "done" if ok else "failed", details or reason)
    return True


# -- the process -------------------------------------------------------------------------------------
class Stepper(Protocol):
    def step(self) -> None:
        """Advance the items in hand and claim what fits; ApiUnreachable or ApiError when the API
        cannot be used (the loop backs off)."""


def claim_what_fits(api: ApiClient, settings: DrainerSettings, *, adapter: str, in_hand: int) -> list[dict[str, Any]]:
    """Claim as many drain and undrain items as there is room for beside those `in_hand`."""
    room = settings.max_items - in_hand
    if room <= 0:
        return []
    return api.claim(adapter=adapter, kinds=KINDS, limit=room, lease_seconds=settings.lease_s, wait_seconds=0)


def run_loop(drainer: Stepper, settings: DrainerSettings, *, stop: Callable[[], bool], log: logging.Logger) -> None:
    """Step until stopped, backing off while the API cannot be used."""
    backoff = Backoff(base_s=settings.poll_interval_s, cap_s=settings.backoff_cap_s)
    log.info("claiming %s items at %s as %s", ", ".join(KINDS), settings.api_url, settings.worker)
    while not stop():
        try:
            drainer.step()
            backoff.reset()
            delay = settings.poll_interval_s
        except ApiUnreachable as error:
            # The items in hand moved on before the claim: nodes keep draining, reports wait.
            delay = backoff.next_delay()
            log.warning("API unreachable (%s); next try in %.1fs", error, delay)
        except ApiError as error:
            delay = backoff.next_delay()
            log.error("the API refused the claim: %s; next try in %.1fs", error, delay)
        sleep_unless_stopped(delay, stop)


def sleep_unless_stopped(seconds: float, stop: Callable[[], bool]) -> None:
    end = time.monotonic() + seconds
    while not stop() and time.monotonic() < end:
        time.sleep(min(0.2, max(0.0, end - time.monotonic())))


Config = TypeVar("Config")


def drainer_main(
    argv: list[str] | None,
    *,
    prog: str,
    description: str,
    load: Callable[[str], Config],
    run: Callable[[Config, Callable[[], bool]], None],
    quiet_loggers: tuple[str, ...] = (),
) -> int:
    """The command line of a drainer: `--config FILE`; a configuration error is one line on stderr
    and exit status 2; SIGTERM and SIGINT end the loop (items in progress keep their leases)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", required=True, help="the TOML configuration file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    for name in quiet_loggers:
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        config = load(args.config)
    except ConfigError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    signal.signal(signal.SIGINT, lambda signum, frame: stopping.append(signum))
    run(config, lambda: bool(stopping))
    return 0
