"""The host agent: runs on each host, claims that host's execute and verify items (adapter "agent")
and does them with the step protocol (`opsplanner_adapters.steps`).

    opsplanner-agent --config /etc/opsplanner/agent.toml

One TOML file configures it (a bad file is one line on stderr and exit code 2):

    [api]
    url = "https://opsplanner.example"
    token_file = "/etc/opsplanner/agent.token"   # or token = "..."
    timeout_s = 30

    [agent]
    hostname = "gpu-0001"              # default: this machine's name
    state_dir = "/var/lib/opsplanner-agent"
    log_dir = "/var/log/opsplanner-agent"
    keep_logs = 200                    # command logs kept, newest first
    lease_seconds = 300
    heartbeat_seconds = 60
    wait_seconds = 50                  # long poll of a claim (0 to 60)
    boot_id_file = "/proc/sys/kernel/random/boot_id"

    [steps]                            # see steps.py: components, verify, reboot, reboot_exit_code
    reboot = ["systemctl", "reboot"]
    [steps.components.gpu_driver]
    install = ["/opt/fw/install-driver", "{version}"]
    check = ["/opt/fw/driver-version"]

The loop: claim one item (long poll), heartbeat it from a thread while its steps run, report it
(retried with the same idempotency key until the API answers), back off while the API is
unreachable. On start it resumes the items in its state directory: one still ours is carried on
(after a reboot, the check decides); one no longer ours is left to its lease and claimed again."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsplanner_adapters.client import ApiClient, ApiError, ApiUnreachable, Backoff, Heartbeat
from opsplanner_adapters.config import HTTP_SCHEMES, ConfigError, api_settings, read_toml, setting, table
from opsplanner_adapters.steps import (
    DEFAULT_BOOT_ID_FILE,
    Abandon,
    LocalTransport,
    Outcome,
    RebootPending,
    StateStore,
    StepConfig,
    StepRunner,
    step_config_from,
)

ADAPTER = "agent"
KINDS = ("execute", "verify")
log = logging.getLogger("opsplanner_adapters.agent")


@dataclass(frozen=True)
class AgentConfig:
    url: str
    token: str
    hostname: str
    state_dir: Path
    log_dir: Path
    steps: StepConfig
    keep_logs: int = 200
    lease_seconds: int = 300
    heartbeat_seconds: float = 60.0
    wait_seconds: int = 50
    timeout_s: float = 30.0
    boot_id_file: str = DEFAULT_BOOT_ID_FILE

    @property
    def worker(self) -> str:
        return f"agent@{self.hostname}"


def load_config(path: Path) -> AgentConfig:
    """The agent's configuration from its TOML file; ConfigError with one clear line otherwise.
    Relative paths (token_file, state_dir, log_dir) are relative to the working directory."""
    data = read_toml(path)
    api, agent = table(data, "api"), table(data, "agent")
    url = api.get("url")
    if isinstance(url, str) and not url.startswith(HTTP_SCHEMES):  # the agent's documented wording
        raise ConfigError(f"api.url must start with http:// or https:// (got {url!r})")
    settings = api_settings(data, base=Path(), default_worker="agent")  # the worker is agent@hostname
    config = AgentConfig(
        url=settings.url,
        token=settings.token,
        hostname=setting(agent, "hostname", str, "[agent]", socket.gethostname()),
        state_dir=Path(setting(agent, "state_dir", str, "[agent]")),
        log_dir=Path(setting(agent, "log_dir", str, "[agent]")),
        steps=step_config_from(table(data, "steps")),
        keep_logs=setting(agent, "keep_logs", int, "[agent]", 200),
        lease_seconds=setting(agent, "lease_seconds", int, "[agent]", 300),
        heartbeat_seconds=float(setting(agent, "heartbeat_seconds", (int, float), "[agent]", 60)),
        wait_seconds=setting(agent, "wait_seconds", int, "[agent]", 50),
        timeout_s=settings.timeout_s,
        boot_id_file=setting(agent, "boot_id_file", str, "[agent]", DEFAULT_BOOT_ID_FILE),
    )
    if not 0 < config.heartbeat_seconds < config.lease_seconds:
        raise ConfigError("agent.heartbeat_seconds must be above 0 and below agent.lease_seconds")
    return config


class Agent:
    def __init__(self, config: AgentConfig, *, client: ApiClient | None = None) -> None:
        self.config = config
        self.client = client or ApiClient(config.url, config.token, config.worker, config.timeout_s)
        self.store = StateStore(config.state_dir)
        self.transport = LocalTransport(
            log_dir=config.log_dir,
            boot_id_file=config.boot_id_file,
            keep_logs=config.keep_logs,
            running_file=config.state_dir / "running.json",
        )
        self.runner = StepRunner(self.transport, self.store, config.steps, on_step=self._logged)
        self.backoff = Backoff(base_s=1.0, cap_s=60.0)
        self.stopping = threading.Event()

    def resume(self) -> None:
        """Carry on with the items claimed before a restart that are still ours."""
        for state in self.store.all():
            item = state.get("item") or {}
            if not item.get("id"):
                continue
            if self._still_ours(item):
                log.info("resuming item %s (attempt %s)", item["id"], item["attempt"])
                self.work(item)
            else:
                log.info("item %s is no longer ours; when it comes back, the check decides", item["id"])

    def _still_ours(self, item: Mapping[str, Any]) -> bool:
        while not self.stopping.is_set():
            try:
                ours = self.client.heartbeat(item, lease_seconds=self.config.lease_seconds)
                self.backoff.reset()
                return ours
            except ApiUnreachable as error:
                self._pause(error)
        return False

    def loop(self) -> None:
        while not self.stopping.is_set():
            try:
                items = self.client.claim(
                    adapter=ADAPTER,
                    kinds=KINDS,
                    host=self.config.hostname,
                    limit=1,
                    lease_seconds=self.config.lease_seconds,
                    wait_seconds=self.config.wait_seconds,
                )
                self.backoff.reset()
            except ApiUnreachable as error:
                self._pause(error)
                continue
            except ApiError as error:  # a bad token or an unknown host: say so, and retry slowly
                log.error("the API refused the claim: %s", error)
                self._pause(error)
                continue
            for item in items:
                self.work(item)

    def work(self, item: Mapping[str, Any]) -> None:
        """Do one item while heartbeating it, then report the outcome."""
        with Heartbeat(
            self.client, item, lease_seconds=self.config.lease_seconds, every_s=self.config.heartbeat_seconds
        ) as beat:
            outcome = self._outcome(item)
        if outcome is None:
            return
        if beat.lost:
            return  # someone else has it now; our state stays for when it comes back
        self._report(item, outcome)

    def _outcome(self, item: Mapping[str, Any]) -> Outcome | None:
        while not self.stopping.is_set():
            try:
                return self.runner.run(item)
            except Abandon as why:
                log.warning("item %s: %s", item["id"], why)
                return None
            except RebootPending:
                log.info("item %s: waiting for the host to reboot", item["id"])
                self._wait_for_reboot(item)
            except Exception as error:
                log.exception("item %s: the steps broke", item["id"])
                return Outcome(False, f"the agent could not run the steps: {error}"[:500], {})
        return None

    def _wait_for_reboot(self, item: Mapping[str, Any]) -> None:
        """A real reboot kills us here; otherwise go on once the boot id changes (or we are stopped)."""
        state = self.store.load(item["id"]) or {}
        before = (state.get("reboot") or {}).get("boot_id")
        while not self.stopping.wait(1.0):
            if self.transport.boot_id() != before:
                return

    def _report(self, item: Mapping[str, Any], outcome: Outcome) -> None:
        """Report until the API answers; the state file keeps an outcome not reported yet."""
        if self.client.report_until_answered(
            item,
            ok=outcome.ok,
            reason=outcome.reason,
            result=outcome.result,
            backoff=self.backoff,
            stopping=self.stopping,
        ):
            self.runner.forget(item["id"])

    def _pause(self, error: Exception) -> None:
        delay = self.backoff.next_delay()
        log.warning("%s; trying again in %.1fs", error, delay)
        self.stopping.wait(delay)

    def _logged(self, step: Mapping[str, Any]) -> None:
        log.info(
            "step %s: exit %s in %.1fs%s",
            step["name"],
            step["exit_code"],
            step["duration_s"],
            " (timed out)" if step["timed_out"] else "",
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="opsplanner-agent",
        description="OpsPlanner host agent: claims this host's work items and runs their steps.",
    )
    parser.add_argument("--config", required=True, type=Path, help="the agent's TOML file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    try:
        config = load_config(args.config)
    except ConfigError as error:
        print(f"opsplanner-agent: {error}", file=sys.stderr)
        return 2
    try:
        agent = Agent(config)
    except OSError as error:
        print(f"opsplanner-agent: cannot use {error.filename}: {error.strerror}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: agent.stopping.set())
    log.info("agent for %s against %s", config.hostname, config.url)
    try:
        agent.resume()
        agent.loop()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
