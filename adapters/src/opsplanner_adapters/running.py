"""The command a transport runs, recorded until it ends, so that a command left running by a crash of
this process is waited for (the agent's LocalTransport in steps.py, the SSH transport in ssh.py)."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

# Every command runs with a tag of its own in its environment, which its children inherit: the
# processes of a command that outlived a crash of the adapter are found by it (see `LocalTransport`
# and the SSH transport).
TAG_VARIABLE = "OPSPLANNER_STEP"
_LEFTOVER_POLL_S = 1.0


# -- a command that outlives a crash of this process ---------------------------------------------------
class RunningRecord:
    """The command a transport runs, recorded in `path` (on this machine) from before it starts until
    it ends. Commands run in sessions of their own (the agent's) or on another host (SSH), so they
    outlive a crash of this process; after a restart the next command first waits for such a
    leftover to end, and kills it once its own timeout has passed: a step never runs beside an older
    one. Each command carries its tag in its environment (TAG_VARIABLE), which its children inherit:
    the transport finds the leftover's processes by it."""

    def __init__(self, path: Path | None) -> None:
        self.path = path

    def remember(self, argv: list[str], *, timeout_s: float) -> str:
        """A new tag for the command about to start, recorded before it starts: no gap."""
        tag = uuid.uuid4().hex
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"tag": tag, "argv": argv, "ends_by": time.time() + timeout_s}))
            os.replace(tmp, self.path)
        return tag

    def forget(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    def wait_for_leftover(
        self,
        *,
        running: Callable[[str], bool],
        kill: Callable[[str], object],
        waiting: Callable[[list[str]], None] = lambda argv: None,
    ) -> None:
        """Wait while `running(tag)` says the recorded command still runs (`waiting` is told once),
        `kill(tag)` once its timeout has passed; then forget it."""
        if self.path is None or not self.path.exists():
            return
        try:
            record = json.loads(self.path.read_text())
            tag, ends_by, argv = str(record["tag"]), float(record["ends_by"]), list(record["argv"])
        except (OSError, ValueError, KeyError, TypeError):
            self.forget()  # unreadable: written by hand
            return
        told = False
        while tag.isalnum() and running(tag):  # a tag not ours (not alnum) names nothing to wait for
            if time.time() >= ends_by:
                kill(tag)
                break
            if not told:
                waiting(argv)
                told = True
            time.sleep(_LEFTOVER_POLL_S)
        self.forget()
