"""The step protocol on a local transport, with real scripts standing for a host's installer."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from opsplanner_adapters.client import ApiClient, ApiUnreachable, Backoff
from opsplanner_adapters.steps import (
    Abandon,
    ConfigError,
    LocalTransport,
    RebootPending,
    StateStore,
    StepRunner,
    step_config_from,
)

from tests.agent_helpers import FakeHost


def upgrade(version: str = "2.0", *, item_id: int = 7, attempt: int = 1) -> dict[str, Any]:
    params = {"operation": 1, "kind": "upgrade", "component": "gpu_driver", "version": version}
    return {"id": item_id, "kind": "execute", "verify_class": "", "attempt": attempt, "params": params}


def runner_for(host: FakeHost, tmp_path: Path, **steps: Any) -> StepRunner:
    transport = LocalTransport(log_dir=tmp_path / "logs", boot_id_file=str(host.root / "boot_id"), keep_logs=5)
    return StepRunner(transport, StateStore(tmp_path / "state"), step_config_from(host.steps(**steps)))


def test_it_skips_the_install_when_the_check_already_reports_the_target(tmp_path: Path) -> None:
    host = FakeHost.make(tmp_path / "host", version="2.0")
    outcome = runner_for(host, tmp_path).run(upgrade("2.0"))
    assert outcome.ok, outcome.reason
    assert host.installs() == []
    assert [s["name"] for s in outcome.result["steps"]] == ["check:gpu_driver"]
    assert outcome.result["versions"] == {"gpu_driver": "2.0"}


def test_it_installs_then_proves_the_version_with_the_check(tmp_path: Path) -> None:
    host = FakeHost.make(tmp_path / "host")
    outcome = runner_for(host, tmp_path).run(upgrade("2.0"))
    assert outcome.ok, outcome.reason
    assert host.installs() == ["2.0"]
    names = [s["name"] for s in outcome.result["steps"]]
    assert names == ["check:gpu_driver", "install:gpu_driver", "check:gpu_driver"]
    install = outcome.result["steps"][1]
    assert install["exit_code"] == 0
    assert "installing 2.0" in install["output_tail"]
    assert install["attempt"] == 1


def test_it_fails_when_the_install_succeeds_but_the_check_disagrees(tmp_path: Path) -> None:
    host = FakeHost.make(tmp_path / "host", mode="nothing")
    outcome = runner_for(host, tmp_path).run(upgrade("2.0"))
    assert not outcome.ok
    assert "check of gpu_driver says '1.0', not '2.0'" in outcome.reason
    assert outcome.result["versions"] == {"gpu_driver": "1.0"}


def test_it_reboots_on_the_reserved_exit_code_and_then_only_checks(tmp_path: Path) -> None:
    host = FakeHost.make(tmp_path / "host", mode="reboot", reboot_mode="instant")
    outcome = runner_for(host, tmp_path).run(upgrade("2.0"))
    assert outcome.ok, outcome.reason
    assert host.installs() == ["2.0"]
    assert host.read("reboots") == "rebooting"
    names = [s["name"] for s in outcome.result["steps"]]
    assert names == ["check:gpu_driver", "install:gpu_driver", "reboot", "check:gpu_driver"]
    assert outcome.result["steps"][1]["exit_code"] == 194


def test_it_waits_for_a_reboot_that_has_not_happened_and_after_a_restart_only_checks(tmp_path: Path) -> None:
    host = FakeHost.make(tmp_path / "host", mode="reboot", reboot_mode="wait")
    with pytest.raises(RebootPending):
        runner_for(host, tmp_path).run(upgrade("2.0"))
    host.boot()
    outcome = runner_for(host, tmp_path).run(upgrade("2.0"))  # a new process: only the state file is left
    assert outcome.ok, outcome.reason
    assert host.installs() == ["2.0"]
    assert [s["name"] for s in outcome.result["steps"]][-1] == "check:gpu_driver"


def test_it_kills_an_install_that_runs_past_its_timeout(tmp_path: Path) -> None:
    host = FakeHost.make(tmp_path / "host", mode="hang")
    started = time.monotonic()
    outcome = runner_for(host, tmp_path, timeout_s=0.5).run(upgrade("2.0"))
    assert time.monotonic() - started < 10
    assert not outcome.ok
    assert "timed out after" in outcome.reason
    install = outcome.result["steps"][1]
    assert install["timed_out"]
    assert install["exit_code"] is None


def test_it_accepts_the_configured_exit_codes_and_lets_the_check_decide(tmp_path: Path) -> None:
    host = FakeHost.make(tmp_path / "host", mode="code3")
    assert runner_for(host, tmp_path / "allowed", allowed=[0, 3]).run(upgrade("2.0")).ok
    host = FakeHost.make(tmp_path / "host2", mode="code3")
    refused = runner_for(host, tmp_path / "refused").run(upgrade("2.0"))
    assert not refused.ok
    assert "exited 3" in refused.reason


def test_it_keeps_only_a_bounded_tail_of_the_output(tmp_path: Path) -> None:
    host = FakeHost.make(tmp_path / "host", mode="noisy")
    outcome = runner_for(host, tmp_path).run(upgrade("2.0"))
    tail = outcome.result["steps"][1]["output_tail"]
    assert len(tail.encode()) <= 4096
    assert tail.rstrip().endswith("END")


def test_it_reports_a_failed_install_with_its_output_tail(tmp_path: Path) -> None:
    host = FakeHost.make(tmp_path / "host", mode="fail")
    outcome = runner_for(host, tmp_path).run(upgrade("2.0"))
    assert not outcome.ok
    assert "exited 3" in outcome.reason
    assert "checksum mismatch on bank 2" in outcome.reason
    assert "checksum mismatch" in outcome.result["steps"][1]["output_tail"]


def test_it_never_runs_an_install_twice_in_one_attempt_after_a_crash(tmp_path: Path) -> None:
    host = FakeHost.make(tmp_path / "host")
    store = StateStore(tmp_path / "state")
    # What a crash mid-install leaves: the install recorded as started, never finished.
    store.save(
        7,
        {
            "item": upgrade(),
            "attempt": 1,
            "installs": [
                {"component": "gpu_driver", "version": "2.0", "attempt": 1, "boot_id": "b", "exit_code": None}
            ],
            "reboot": None,
            "steps": [],
            "versions": {},
            "outcome": None,
        },
    )
    with pytest.raises(Abandon):
        runner_for(host, tmp_path).run(upgrade("2.0", attempt=1))
    assert host.installs() == []
    outcome = runner_for(host, tmp_path).run(upgrade("2.0", attempt=2))  # claimed again: once more
    assert outcome.ok
    assert host.installs() == ["2.0"]
    installs = json.loads(store.path(7).read_text())["installs"]
    assert [(i["attempt"], i["exit_code"]) for i in installs] == [(1, None), (2, 0)]


def test_it_answers_a_worked_out_outcome_again_without_running_anything(tmp_path: Path) -> None:
    host = FakeHost.make(tmp_path / "host")
    first = runner_for(host, tmp_path).run(upgrade("2.0"))
    again = runner_for(host, tmp_path).run(upgrade("2.0"))  # a crash before the report
    assert again == first
    assert host.installs() == ["2.0"]


def test_it_runs_a_verification_class_and_says_whether_it_passed(tmp_path: Path) -> None:
    host = FakeHost.make(tmp_path / "host")
    item = {"id": 9, "kind": "verify", "verify_class": "health", "attempt": 1, "params": {}}
    assert runner_for(host, tmp_path / "a").run(item).result["passed"] is True
    host.set("unhealthy", "1")
    outcome = runner_for(host, tmp_path / "b").run(item)
    assert outcome.ok
    assert outcome.result["passed"] is False
    assert "ECC errors" in outcome.result["details"]
    steps = host.steps()
    del steps["verify"]["burn_in"]
    transport = LocalTransport(log_dir=tmp_path / "logs", boot_id_file=str(host.root / "boot_id"))
    runner = StepRunner(transport, StateStore(tmp_path / "c"), step_config_from(steps))
    missing = runner.run({**item, "id": 10, "verify_class": "burn_in"})
    assert not missing.ok
    assert "verify.burn_in.command" in missing.reason


def test_it_names_the_bad_key_of_a_step_configuration() -> None:
    with pytest.raises(ConfigError, match=r"components\.gpu\.check must be a non-empty list"):
        step_config_from({"components": {"gpu": {"install": ["x"], "check": "x"}}})
    with pytest.raises(ConfigError, match="unknown verification class"):
        step_config_from({"verify": {"smoke": {"command": ["true"]}}})
    with pytest.raises(ConfigError, match="reboot_exit_code"):
        step_config_from({"reboot_exit_code": 0})


def test_it_keeps_only_the_newest_command_logs(tmp_path: Path) -> None:
    transport = LocalTransport(log_dir=tmp_path / "logs", keep_logs=3)
    for n in range(5):
        assert transport.run(["sh", "-c", f"echo run-{n}"], timeout_s=5).exit_code == 0
    logs = sorted((tmp_path / "logs").glob("*.log"))
    assert len(logs) == 3
    assert "run-4" in logs[-1].read_text()


def test_it_backs_off_exponentially_with_a_cap_and_starts_over_after_a_success() -> None:
    backoff = Backoff(base_s=1, cap_s=8, jitter=0.25)
    delays = [backoff.next_delay() for _ in range(6)]
    assert 0.75 <= delays[0] <= 1.25
    assert 1.5 <= delays[1] <= 2.5
    assert 3 <= delays[2] <= 5
    assert all(d <= 8 for d in delays)
    assert delays[-1] >= 6
    backoff.reset()
    assert backoff.next_delay() <= 1.25


def test_it_says_the_api_is_unreachable_when_nothing_listens() -> None:
    client = ApiClient("http://127.0.0.1:9", "token", "w", timeout_s=2)
    with pytest.raises(ApiUnreachable, match=r"127\.0\.0\.1:9"):
        client.claim(adapter="agent", kinds=["execute"])
