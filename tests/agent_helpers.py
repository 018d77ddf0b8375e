"""A fake host for the step protocol: real shell scripts in a directory that stand for a component's
installer and its version check, a reboot command and the boot id, with counters the tests read."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.processes import ROOT

INSTALL = """#!/bin/sh
d=$(dirname "$0")
echo "$1" >> "$d/installs"
echo "$$" >> "$d/install.pids"
echo "installing $1"
case "$(cat "$d/mode" 2>/dev/null)" in
  reboot) echo "$1" > "$d/pending"; echo "needs a reboot"; exit 194;;
  fail) echo "flash failed: checksum mismatch on bank 2" >&2; exit 3;;
  code3) echo "$1" > "$d/version"; exit 3;;
  nothing) exit 0;;
  hang) sleep 30;;
  noisy) head -c 20000 /dev/zero | tr '\\0' x; echo; echo END; echo "$1" > "$d/version";;
  *) echo "$1" > "$d/version";;
esac
"""
CHECK = """#!/bin/sh
cat "$(dirname "$0")/version"
"""
# "instant": the reboot happens before the command returns (as over SSH); "wait": it only leaves a
# marker, and the test boots the host (`FakeHost.boot`) while the agent waits to be killed.
REBOOT = """#!/bin/sh
d=$(dirname "$0")
echo rebooting >> "$d/reboots"
if [ "$(cat "$d/reboot_mode" 2>/dev/null)" = instant ]; then
  [ -f "$d/pending" ] && mv "$d/pending" "$d/version"
  echo "boot-$(date +%s%N)" > "$d/boot_id"
fi
"""
HEALTH = """#!/bin/sh
d=$(dirname "$0")
if [ -f "$d/unhealthy" ]; then echo "GPU 3: ECC errors above threshold"; exit 1; fi
echo healthy
"""


@dataclass
class FakeHost:
    root: Path

    @classmethod
    def make(cls, root: Path, *, version: str = "1.0", mode: str = "", reboot_mode: str = "instant") -> FakeHost:
        root.mkdir(parents=True, exist_ok=True)
        for name, text in {"install": INSTALL, "check": CHECK, "reboot": REBOOT, "health": HEALTH}.items():
            script = root / f"{name}.sh"
            script.write_text(text)
            script.chmod(0o755)
        host = cls(root)
        (root / "version").write_text(version + "\n")
        (root / "boot_id").write_text(f"boot-{uuid.uuid4()}\n")
        host.set("mode", mode)
        host.set("reboot_mode", reboot_mode)
        return host

    def set(self, name: str, value: str) -> None:
        (self.root / name).write_text(value)

    def read(self, name: str) -> str:
        path = self.root / name
        return path.read_text().strip() if path.exists() else ""

    def installs(self) -> list[str]:
        return self.read("installs").split()

    def boot(self) -> None:
        """What the host does when it comes back: the pending firmware is live, a new boot id."""
        pending = self.root / "pending"
        if pending.exists():
            pending.replace(self.root / "version")
        (self.root / "boot_id").write_text(f"boot-{uuid.uuid4()}\n")

    def steps(
        self, *, timeout_s: float = 30, allowed: list[int] | None = None, component: str = "gpu_driver"
    ) -> dict[str, Any]:
        """The `[steps]` table for this host (a dict, as TOML would give it)."""
        return {
            "reboot": [str(self.root / "reboot.sh")],
            "reboot_exit_code": 194,
            "components": {
                component: {
                    "install": [str(self.root / "install.sh"), "{version}"],
                    "check": [str(self.root / "check.sh")],
                    "allowed_exit_codes": allowed or [0],
                    "timeout_s": timeout_s,
                }
            },
            "verify": {
                name: {"command": [str(self.root / "health.sh")], "timeout_s": 10}
                for name in ("health", "burn_in", "collective")
            },
        }


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(value)


def toml_document(tables: dict[str, dict[str, Any]]) -> str:
    """A small TOML writer (tomllib only reads): nested dicts become [a.b.c] tables."""
    lines: list[str] = []

    def table(name: str, body: dict[str, Any]) -> None:
        plain = {k: v for k, v in body.items() if not isinstance(v, dict)}
        lines.append(f"[{name}]")
        lines.extend(f"{key} = {toml_value(value)}" for key, value in plain.items())
        for key, value in body.items():
            if isinstance(value, dict):
                table(f"{name}.{key}", value)

    for name, body in tables.items():
        table(name, body)
    return "\n".join(lines) + "\n"


def agent_config(
    path: Path,
    *,
    url: str,
    token: str,
    hostname: str,
    host: FakeHost,
    component: str = "gpu_driver",
    lease_seconds: int = 30,
    heartbeat: float = 1,
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        toml_document(
            {
                "api": {"url": url, "token": token, "timeout_s": 10},
                "agent": {
                    "hostname": hostname,
                    "state_dir": str(path.parent / "state"),
                    "log_dir": str(path.parent / "logs"),
                    "keep_logs": 50,
                    "lease_seconds": lease_seconds,
                    "heartbeat_seconds": heartbeat,
                    "wait_seconds": 1,
                    "boot_id_file": str(host.root / "boot_id"),
                },
                "steps": host.steps(component=component),
            }
        )
    )
    return path


def start_agent(config: Path, log: Path) -> subprocess.Popen[bytes]:
    """The agent as its own process, importing the package from the tree (as pytest does)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "adapters" / "src"))
    with log.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "opsplanner_adapters.agent", "--config", str(config)],
            cwd=config.parent,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
