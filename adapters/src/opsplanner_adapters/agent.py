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
    wait_seconds = 20                  # long poll of a claim
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
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opsplanner_adapters.client import ApiClient, ApiError, ApiUnreachable, Backoff
from opsplanner_adapters.steps import (
    DEFAULT_BOOT_ID_FILE,
    Abandon,
    ConfigError,
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
    wait_seconds: int = 20
    timeout_s: float = 30.0
    boot_id_file: str = DEFAULT_BOOT_ID_FILE

    @property
    def worker(self) -> str:
        return f"agent@{self.hostname}"


def _get(table: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any = None) -> Any:
    value = table.get(key, default)
    if value is None:
        raise ConfigError(f"{where}.{key} is missing")
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ConfigError(f"{where}.{key} has the wrong type ({type(value).__name__})")
    return value


def load_config(path: Path) -> AgentConfig:
    """The agent's configuration from its TOML file; ConfigError with one clear line otherwise."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as error:
        raise ConfigError(f"cannot read {path}: {error.strerror or error}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"{path} is not valid TOML: {error}") from None
    api, agent = data.get("api") or {}, data.get("agent") or {}
    token = api.get("token")
    if token is None and "token_file" in api:
        try:
            token = Path(_get(api, "token_file", str, "api")).read_text().strip()
        except OSError as error:
            raise ConfigError(f"cannot read api.token_file: {error.strerror or error}") from None
    if not isinstance(token, str) or not token:
        raise ConfigError("api.token or api.token_file is required")
    url = _get(api, "url", str, "api")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"api.url must start with http:// or https:// (got {url!r})")
    config = AgentConfig(
        url=url,
        token=token,
        hostname=_get(agent, "hostname", str, "agent", socket.gethostname()),
        state_dir=Path(_get(agent, "state_dir", str, "agent")),
        log_dir=Path(_get(agent, "log_dir", str, "agent")),
        steps=step_config_from(data.get("steps") or {}),
        keep_logs=_get(agent, "keep_logs", int, "agent", 200),
        lease_seconds=_get(agent, "lease_seconds", int, "agent", 300),
        heartbeat_seconds=float(_get(agent, "heartbeat_seconds", (int, float), "agent", 60)),
        wait_seconds=_get(agent, "wait_seconds", int, "agent", 20),
        timeout_s=float(_get(api, "timeout_s", (int, float), "api", 30)),
        boot_id_file=_get(agent, "boot_id_file", str, "agent", DEFAULT_BOOT_ID_FILE),
    )
    if not 0 < config.heartbeat_seconds < config.lease_seconds:
        raise ConfigError("agent.heartbeat_seconds must be above 0 and below agent.lease_seconds")
    return config


class Heartbeat:
    """Keeps one item's lease alive from a thread until stopped; `lost` once the API says it is not ours."""

    def __init__(self, client: ApiClient, item: Mapping[str, Any], *, every_s: float, lease_seconds: int) -> None:
        self.client, self.item, self.every_s, self.lease_seconds = client, item, every_s, lease_seconds
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{item['id']}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.client.timeout_s + 1)

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                if not self.client.heartbeat(self.item, lease_seconds=self.lease_seconds):
                    log.warning("item %s is no longer ours; its outcome will not be reported", self.item["id"])
                    self.lost.set()
                    return
            except (ApiUnreachable, ApiError) as error:
                log.warning("heartbeat of item %s failed: %s", self.item["id"], error)


class Agent:
    def __init__(self, config: AgentConfig, *, client: ApiClient | None = None) -> None:
        self.config = config
        self.client = client or ApiClient(config.url, config.token, config.worker, config.timeout_s)
        self.store = StateStore(config.state_dir)
        self.transport = LocalTransport(
            log_dir=config.log_dir, boot_id_file=config.boot_id_file, keep_logs=config.keep_logs
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
            self.client, item, every_s=self.config.heartbeat_seconds, lease_seconds=self.config.lease_seconds
        ) as beat:
            outcome = self._outcome(item)
        if outcome is None:
            return
        if beat.lost.is_set():
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
        key = f"{self.config.worker}:{item['id']}:{item['attempt']}"
        while True:
            try:
                self.client.report(item, ok=outcome.ok, reason=outcome.reason, result=outcome.result, report_key=key)
                self.backoff.reset()
                self.runner.forget(item["id"])
                log.info("item %s reported %s", item["id"], "done" if outcome.ok else "failed")
                return
            except ApiUnreachable as error:
                if self.stopping.is_set():
                    return  # the state file keeps the outcome; it is reported after the restart
                self._pause(error)
            except ApiError as error:
                log.error("item %s: the report was refused: %s", item["id"], error)
                return

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
