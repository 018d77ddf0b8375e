"""The host agent as its own process against the real web server: it claims its host's execute and
verify items, survives a reboot and a kill -9 in the middle without installing twice, and a failed
check sends the host to repair with the output on the host page. The ticks and the simulated
drainer run in this process; the fake host is scripts in a directory (tests/agent_helpers.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.test import Client
from knox.models import AuthToken

from fleet import services as fleet_services
from fleet.models import Host, HostState, InstalledVersion, Pool
from opsplanner.models import HostTask, TaskState, WorkItem, WorkKind, WorkState
from opsplanner.roles import Role
from opsplanner.services.operations import operation_submit
from opsplanner.services.simulator import simulated_work_step
from opsplanner.services.tick import pool_tick
from tests.agent_helpers import FakeHost, agent_config, start_agent
from tests.browser import LiveServer, live_server_process  # noqa: F401 (a fixture)
from tests.builders import _catalogue
from tests.driving import instant_simulator
from tests.processes import ROOT
from tests.trains_builders import make_user

# The web server and the agent are other processes: what they should see must be committed.
pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

HOSTNAME = "gpu-0001.agent.test"
TARGET = "560.35.03"


class Agents:
    """Agent processes for one fake host, started and killed as the test says."""

    def __init__(self, config: Path) -> None:
        self.config, self.started = config, []

    def start(self) -> subprocess.Popen[bytes]:
        self.started.append(start_agent(self.config, self.config.parent / "agent.log"))
        return self.started[-1]

    def kill(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait()

    def output(self) -> str:
        log = self.config.parent / "agent.log"
        return log.read_text(errors="replace") if log.exists() else ""


@pytest.fixture
def fake_host(tmp_path: Path) -> FakeHost:
    return FakeHost.make(tmp_path / "host", version="550.127.05", reboot_mode="wait")


@pytest.fixture
def agents(live_server_process: LiveServer, fake_host: FakeHost, tmp_path: Path) -> Iterator[Agents]:  # noqa: F811
    _, token = AuthToken.objects.create(make_user(Role.EXECUTOR))
    config = agent_config(
        tmp_path / "agent" / "agent.toml",
        url=live_server_process.url,
        token=token,
        hostname=HOSTNAME,
        host=fake_host,
        component="gpu-driver",
        lease_seconds=8,
    )
    running = Agents(config)
    yield running
    running.kill()
    for pid in fake_host.read("install.pids").split():  # installs left running by a killed agent
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pid), signal.SIGKILL)


@pytest.fixture
def pool() -> Pool:
    """One host, drained by the simulator, executed by the agent, running driver 550."""
    instant_simulator()
    catalogue = _catalogue()
    pool = fleet_services.pool_create(
        name="agent-pool",
        workload_class="ai_training",
        planned_buffer_hosts=1,
        failure_buffer_hosts=1,
        executor="agent",
    )
    domain = fleet_services.domain_create(pool=pool, name="rack-1", position=1)
    host = fleet_services.host_create(hostname=HOSTNAME, domain=domain, sku="gpu-h100-8x", gpu_count=8)
    for component, version in (("cuda-runtime", "12.4.1"), ("gpu-driver", "550.127.05"), ("bios", "2.14.0")):
        fleet_services.installed_version_set(host=host, version=catalogue[component][version])
    return pool


def upgrade() -> HostTask:
    operation = operation_submit(
        kind="upgrade", component="gpu-driver", version=TARGET, scope=f"hosts: {HOSTNAME}", reason="driver rollout"
    )
    return operation.tasks.get()


def drive_until(pool: Pool, condition: Callable[[], object], *, what: str, agents: Agents, timeout: float = 90) -> None:
    """Tick the pool and run the simulated drainer until the condition holds (the agent works meanwhile)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            items = list(WorkItem.objects.filter(pool_id=pool.pk).values_list("kind", "state", "attempts"))
            raise AssertionError(f"timed out waiting for {what}; items: {items}\nagent:\n{agents.output()[-3000:]}")
        pool_tick(pool_id=pool.pk, kick=False)
        simulated_work_step()
        time.sleep(0.2)


def task_state(task: HostTask) -> str:
    return HostTask.objects.get(pk=task.pk).state


def installed_driver() -> str:
    return InstalledVersion.objects.get(host__hostname=HOSTNAME, component__name="gpu-driver").version.version


def test_the_agent_upgrades_through_a_reboot_and_only_checks_after_it(
    pool: Pool, agents: Agents, fake_host: FakeHost
) -> None:
    fake_host.set("mode", "reboot")
    agents.start()
    task = upgrade()
    drive_until(pool, lambda: fake_host.read("reboots"), what="the reboot command", agents=agents)
    # The reboot takes the agent down; the host comes back with a new boot id; the agent starts again.
    agents.kill()
    fake_host.boot()
    agents.start()
    drive_until(pool, lambda: task_state(task) == TaskState.DONE, what="the upgrade", agents=agents)
    assert fake_host.installs() == [TARGET]
    assert installed_driver() == TARGET
    assert Host.objects.get(hostname=HOSTNAME).state == HostState.IN_SERVICE
    execute = WorkItem.objects.get(host_task=task, kind=WorkKind.EXECUTE)
    assert (execute.adapter, execute.state, execute.attempts) == ("agent", WorkState.DONE, 1)
    assert [s["name"] for s in execute.result["steps"]][-1] == "check:gpu-driver"
    verifies = WorkItem.objects.filter(host_task=task, kind=WorkKind.VERIFY)
    assert sorted(v.result["passed"] for v in verifies) == [True, True, True]
    assert "resuming item" in agents.output()


def test_a_killed_agent_installs_at_most_once_more_and_the_check_decides(
    pool: Pool, agents: Agents, fake_host: FakeHost
) -> None:
    fake_host.set("mode", "hang")
    agents.start()
    task = upgrade()
    drive_until(pool, lambda: fake_host.installs(), what="the install to start", agents=agents)
    agents.kill()  # kill -9 mid-install
    fake_host.set("mode", "")  # the next install works
    agents.start()
    drive_until(pool, lambda: task_state(task) == TaskState.DONE, what="the upgrade", agents=agents)
    assert fake_host.installs() == [TARGET, TARGET]
    execute = WorkItem.objects.get(host_task=task, kind=WorkKind.EXECUTE)
    assert (execute.state, execute.attempts) == (WorkState.DONE, 2)
    assert installed_driver() == TARGET
    assert "was interrupted; giving the claim up" in agents.output()


def test_a_failing_check_sends_the_host_to_repair_with_the_output_on_the_host_page(
    pool: Pool, agents: Agents, fake_host: FakeHost
) -> None:
    fake_host.set("mode", "nothing")  # the installer says yes and changes nothing
    agents.start()
    task = upgrade()
    drive_until(pool, lambda: task_state(task) == TaskState.FAILED, what="the upgrade to fail", agents=agents)
    agents.kill()
    assert Host.objects.get(hostname=HOSTNAME).state == HostState.REPAIR
    execute = WorkItem.objects.get(host_task=task, kind=WorkKind.EXECUTE)
    assert execute.state == WorkState.FAILED
    assert "says '550.127.05', not '560.35.03'" in execute.outcome_reason
    browser = Client()
    browser.force_login(make_user(Role.OPERATOR))
    page = browser.get(f"/fleet/hosts/{HOSTNAME}/").content.decode()
    assert '<td class="adapter">agent</td>' in page
    assert "Output of its steps" in page
    assert "installing 560.35.03" in page


def test_the_package_installs_by_itself_and_the_agent_refuses_a_bad_config_in_one_line(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    source = tmp_path / "adapters"
    subprocess.run(["cp", "-r", str(ROOT / "adapters"), str(source)], check=True)  # pip writes build files
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--no-deps", "--quiet", str(source)], capture_output=True, text=True
    )
    assert install.returncode == 0, install.stderr[-2000:]
    agent = str(venv / "bin" / "opsplanner-agent")
    helped = subprocess.run([agent, "--help"], capture_output=True, text=True, timeout=60)
    assert helped.returncode == 0
    assert "--config" in helped.stdout
    bad = tmp_path / "bad.toml"
    bad.write_text('[api]\nurl = "ftp://x"\ntoken = "t"\n[agent]\nstate_dir = "s"\nlog_dir = "l"\n')
    refused = subprocess.run([agent, "--config", str(bad)], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.strip() == "opsplanner-agent: api.url must start with http:// or https:// (got 'ftp://x')"
