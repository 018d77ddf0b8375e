"""The step protocol and the executors' configuration: outcomes the API must accept (an
outcome it refuses is lost: the item is never reported and only its lease brings it back), command
logs, and configuration values that must be refused in one line. Fast: real scripts on this host,
the API's own report serializer, no server."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from opsplanner_adapters.agent import Agent, load_config
from opsplanner_adapters.config import ConfigError, number
from opsplanner_adapters.drainer_loop import NodeRules, drainer_settings
from opsplanner_adapters.ssh_executor import config_load
from opsplanner_adapters.steps import LocalTransport, Outcome, StateStore, StepRunner, step_config_from

from console.api.serializers.work import ReportInput
from tests.agent_helpers import FakeHost, agent_config
from tests.processes import ROOT


def upgrade(version: str = "2.0") -> dict[str, Any]:
    params = {"operation": 1, "kind": "upgrade", "component": "gpu_driver", "version": version}
    return {"id": 7, "kind": "execute", "verify_class": "", "attempt": 1, "params": params}


def runner_for(host: FakeHost, tmp_path: Path) -> StepRunner:
    transport = LocalTransport(log_dir=tmp_path / "logs", boot_id_file=str(host.root / "boot_id"), keep_logs=5)
    return StepRunner(transport, StateStore(tmp_path / "state"), step_config_from(host.steps()))


def refusal(outcome: Outcome) -> dict[str, Any]:
    """What the API's report endpoint says of this outcome (empty: accepted)."""
    body = {"outcome": "done" if outcome.ok else "failed", "attempt": 1, "result": outcome.result}
    serializer = ReportInput(data={**body, "reason": outcome.reason[:500]})
    return {} if serializer.is_valid() else dict(serializer.errors)


def test_a_check_that_prints_more_than_a_version_fails_the_item_in_a_report_the_api_accepts(tmp_path: Path) -> None:
    host = FakeHost.make(tmp_path / "host", mode="nothing")  # the installer changes nothing
    (host.root / "check.sh").write_text(
        "#!/bin/sh\necho 'nvidia-smi has failed because it could not communicate"
        " with the NVIDIA driver. Make sure that the latest driver is installed.'\n"
    )

    outcome = runner_for(host, tmp_path).run(upgrade("2.0"))

    assert not outcome.ok
    assert "could not communicate" in outcome.reason
    assert refusal(outcome) == {}


def test_a_command_that_prints_a_nul_byte_gives_a_report_the_api_accepts(tmp_path: Path) -> None:
    host = FakeHost.make(tmp_path / "host")
    (host.root / "health.sh").write_text("#!/bin/sh\nprintf 'GPU 0\\000: ECC errors\\n'\nexit 1\n")
    item = {"id": 9, "kind": "verify", "verify_class": "health", "attempt": 1, "params": {}}

    outcome = runner_for(host, tmp_path).run(item)

    assert outcome.result["passed"] is False
    assert "ECC errors" in outcome.result["details"]
    assert refusal(outcome) == {}


def test_command_logs_kept_at_zero_still_give_each_command_its_output(tmp_path: Path) -> None:
    transport = LocalTransport(log_dir=tmp_path / "logs", keep_logs=0)

    result = transport.run(["sh", "-c", "echo hello"], timeout_s=5)

    assert (result.exit_code, result.output_tail.strip()) == (0, "hello")
    assert list((tmp_path / "logs").glob("*.log")) == []


# -- configuration ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_a_number_setting_refuses_infinity_and_nan_in_one_line(value: float) -> None:
    with pytest.raises(ConfigError, match=r"slurm\.lease_s must be a number"):
        number({"lease_s": value}, "lease_s", 120, section="slurm", minimum=3)


@pytest.mark.parametrize("line", ["lease_s = inf", "max_items = nan", "poll_interval_s = nan"])
def test_a_drainer_file_with_an_infinite_number_is_one_clear_line_not_a_traceback(tmp_path: Path, line: str) -> None:
    path = tmp_path / "drainer.toml"
    path.write_text(f'[api]\nurl = "http://127.0.0.1:9"\ntoken = "t"\n\n[slurm]\n{line}\n')
    rules = NodeRules(default_pattern="{short}", valid=re.compile(r".+"), described_as="nodes")
    key = line.split()[0]
    with pytest.raises(ConfigError, match=rf"slurm\.{key} must be a number"):
        drainer_settings(str(path), section="slurm", default_worker="w", max_items=50, nodes=rules)


def ssh_executor_file(tmp_path: Path, ssh_extra: str) -> Path:
    (tmp_path / "key").write_text("not read at load time")
    (tmp_path / "known_hosts").write_text("")
    path = tmp_path / "ssh.toml"
    path.write_text(
        '[api]\nurl = "http://127.0.0.1:9"\ntoken = "t"\n\n[executor]\nstate_dir = "state"\n\n'
        f'[ssh]\nknown_hosts = "known_hosts"\nkey_file = "key"\n{ssh_extra}\n\n'
        '[hosts.gpu-1]\naddress = "127.0.0.1"\n\n[steps.verify.health]\ncommand = ["true"]\n'
    )
    return path


@pytest.mark.parametrize(
    "line",
    [
        "connect_timeout_s = -1",
        "connect_timeout_s = 0",
        "reboot_timeout_s = -5",
        "reboot_poll_s = -1",
        "reboot_poll_s = nan",
    ],
)
def test_the_ssh_executor_refuses_a_timeout_that_is_not_a_positive_number(tmp_path: Path, line: str) -> None:
    key = line.split()[0]
    with pytest.raises(ConfigError, match=rf"\[ssh\]: `{key}` must be a positive number"):
        config_load(ssh_executor_file(tmp_path, line))


def test_the_ssh_executor_still_reads_good_timeouts(tmp_path: Path) -> None:
    config = config_load(ssh_executor_file(tmp_path, "connect_timeout_s = 5\nreboot_poll_s = 0.5"))
    assert (config.ssh.connect_timeout_s, config.ssh.reboot_poll_s, config.ssh.reboot_timeout_s) == (5.0, 0.5, 900.0)


# -- an install a crash of the agent left running -----------------------------------------------------------

SLOW_INSTALL = """#!/bin/sh
d=$(dirname "$0")
echo "$1" >> "$d/installs"
echo "$$" >> "$d/install.pids"
[ -f "$d/busy" ] && echo overlap >> "$d/overlaps"
touch "$d/busy"
sleep 3
rm -f "$d/busy"
echo "$1" > "$d/version"
"""
# The agent's runner in a process of its own, doing attempt 1 of the upgrade.
CRASHING_AGENT = """
import sys
from pathlib import Path
from opsplanner_adapters.agent import Agent, load_config
item = {"id": 7, "kind": "execute", "verify_class": "", "attempt": 1,
        "params": {"operation": 1, "kind": "upgrade", "component": "gpu_driver", "version": "2.0"}}
Agent(load_config(Path(sys.argv[1]))).runner.run(item)
"""


def test_a_restarted_agent_never_installs_beside_an_install_its_crash_left_running(tmp_path: Path) -> None:
    """kill -9 of the agent leaves its install running (in a session of its own). The item comes
    back with a new attempt: the agent must let that install end before running anything, so
    that two installs never run at once (the check then finds the new version: no install again)."""
    host = FakeHost.make(tmp_path / "host", version="1.0")
    (host.root / "install.sh").write_text(SLOW_INSTALL)
    config = agent_config(
        tmp_path / "agent" / "agent.toml", url="http://127.0.0.1:9", token="t", hostname="h", host=host
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "adapters" / "src"))
    agent = subprocess.Popen([sys.executable, "-c", CRASHING_AGENT, str(config)], env=env)
    try:
        deadline = time.monotonic() + 10
        while not host.installs():
            assert time.monotonic() < deadline, "the install did not start"
            time.sleep(0.05)
        agent.kill()  # kill -9 mid-install
        agent.wait()

        outcome = Agent(load_config(config)).runner.run(upgrade("2.0") | {"attempt": 2})

        assert host.read("overlaps") == "", "a second install ran beside the first"
        assert outcome.ok, outcome.reason
        assert host.installs() == ["2.0"]
    finally:
        for pid in host.read("install.pids").split():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid), signal.SIGKILL)
