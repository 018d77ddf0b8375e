"""The SSH transport: the step protocol's commands run on a host over SSH (paramiko).

Keys only (no passwords, no agent, no ~/.ssh lookups) and the host key checked against one
known_hosts file: an unknown or changed key is refused (`HostKeyRejected`), never learned."""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import paramiko

from opsplanner_adapters.running import TAG_VARIABLE, RunningRecord
from opsplanner_adapters.steps import TAIL_BYTES, CommandResult

BOOT_ID_ARGV = ("cat", "/proc/sys/kernel/random/boot_id")
# Every command runs with a tag of its own in its environment (TAG_VARIABLE), which its children
# inherit: the processes of a command are found on the host by it (a timeout kills them all, even
# those that left the process group), and a restarted executor finds a command its death left running.
_TAGGED = "grep -lzx {variable}={tag} /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3"
_KILL_TAGGED = _TAGGED + " | xargs -r kill -KILL 2>/dev/null; true"
_READ_SLICE_S = 0.2
_OUTPUT_GRACE_S = 2.0
log = logging.getLogger("opsplanner.ssh")


class SshError(Exception):
    """A host could not be reached or used over SSH; the message says which host and why."""


class HostKeyRejected(SshError):
    """The host's key is not the one in known_hosts (unknown or changed): nothing was run."""


@dataclass(frozen=True)
class SshHost:
    """Where a host answers SSH and as whom (from the executor's configuration)."""

    name: str
    address: str
    key_file: Path
    port: int = 22
    user: str = "root"

    def where(self) -> str:
        return f"{self.name} ({self.user}@{self.address}:{self.port})"


@dataclass(frozen=True)
class SshOptions:
    """How the transport behaves, the same for every host."""

    known_hosts: Path
    boot_id_argv: tuple[str, ...] = BOOT_ID_ARGV
    connect_timeout_s: float = 10.0
    output_tail_bytes: int = TAIL_BYTES
    reboot_timeout_s: float = 900.0
    reboot_poll_s: float = 3.0


def _load_key(path: Path) -> paramiko.PKey:
    try:
        return paramiko.PKey.from_path(path)
    except FileNotFoundError:
        raise SshError(f"the SSH key file {path} does not exist") from None
    except paramiko.PasswordRequiredException:
        raise SshError(f"the SSH key file {path} is encrypted; give a key without a passphrase") from None
    except (paramiko.SSHException, ValueError, OSError) as error:
        raise SshError(f"the SSH key file {path} cannot be read: {error}") from None


def _tail(buffer: bytearray, chunk: bytes, limit: int) -> None:
    buffer.extend(chunk)
    if len(buffer) > limit:
        del buffer[: len(buffer) - limit]


class SshTransport:
    """One host's commands over one SSH connection, opened on first use and again after a drop."""

    def __init__(
        self,
        host: SshHost,
        options: SshOptions,
        *,
        running_file: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`running_file` (on this machine) records the command running on the host until it ends:
        after a crash of this process, the next command waits for that one to end first."""
        self.host = host
        self.options = options
        self.running = RunningRecord(running_file)
        self._clock = clock
        self._client: paramiko.SSHClient | None = None

    # -- connection --------------------------------------------------------------------------------
    def connect(self) -> None:
        """Open the connection (checking the host key) if it is not open; raise SshError if not possible."""
        if self._client is not None and self._alive(self._client):
            return
        self.close()
        self._client = self._open()

    def _open(self) -> paramiko.SSHClient:
        key = _load_key(self.host.key_file)
        client = paramiko.SSHClient()
        try:
            client.get_host_keys().load(str(self.options.known_hosts))
        except (OSError, paramiko.SSHException) as error:
            raise SshError(f"the known_hosts file {self.options.known_hosts} cannot be read: {error}") from None
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                self.host.address,
                port=self.host.port,
                username=self.host.user,
                pkey=key,
                allow_agent=False,
                look_for_keys=False,
                timeout=self.options.connect_timeout_s,
                banner_timeout=self.options.connect_timeout_s,
                auth_timeout=self.options.connect_timeout_s,
            )
        except paramiko.BadHostKeyException as error:
            client.close()
            raise HostKeyRejected(
                f"the host key of {self.host.where()} does not match {self.options.known_hosts} "
                f"(it offered {error.key.get_name()} {error.key.fingerprint}); refusing to connect"
            ) from None
        except paramiko.SSHException as error:
            client.close()
            if "not found in known_hosts" in str(error):
                raise HostKeyRejected(
                    f"{self.host.where()} is not in {self.options.known_hosts}; refusing an unknown host key"
                ) from None
            raise SshError(f"cannot log in to {self.host.where()}: {error}") from None
        except (OSError, EOFError) as error:
            client.close()
            raise SshError(f"cannot reach {self.host.where()}: {error}") from None
        return client

    @staticmethod
    def _alive(client: paramiko.SSHClient) -> bool:
        transport = client.get_transport()
        return transport is not None and transport.is_active()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- the Transport protocol --------------------------------------------------------------------
    def run(self, argv: list[str], *, timeout_s: float) -> CommandResult:
        """Run argv on the host; the result carries the last output_tail_bytes of stdout and stderr
        together. Past timeout_s the command and its children are killed: exit code None, timed_out true."""
        if not argv:
            raise ValueError("an empty command")
        self.connect()
        assert self._client is not None
        self.running.wait_for_leftover(
            running=lambda tag: bool(self._exec_quiet(_TAGGED.format(variable=TAG_VARIABLE, tag=tag)).strip()),
            kill=lambda tag: self._exec_quiet(_KILL_TAGGED.format(variable=TAG_VARIABLE, tag=tag)),
            waiting=lambda argv: log.warning(
                "%s still runs %s from before a restart; waiting for it", self.host.name, argv
            ),
        )
        started = self._clock()
        tag = self.running.remember(argv, timeout_s=timeout_s)
        try:
            channel = self._client.get_transport().open_session(timeout=self.options.connect_timeout_s)  # type: ignore[union-attr]
            channel.set_combine_stderr(True)
            # `sh -c 'exec "$@"'` hands the argv over word for word: no shell reads the arguments.
            channel.exec_command(shlex.join(["env", f"{TAG_VARIABLE}={tag}", "sh", "-c", 'exec "$@"', "sh", *argv]))
            channel.shutdown_write()  # the command reads an empty stdin
            exit_code, output, timed_out = self._collect(channel, started + timeout_s)
            if timed_out:
                self._exec_quiet(_KILL_TAGGED.format(variable=TAG_VARIABLE, tag=tag))
        except (paramiko.SSHException, OSError, EOFError) as error:
            self.close()  # the command may still run on the host: its record stays
            raise SshError(f"lost the connection to {self.host.where()} while running {argv[0]}: {error}") from None
        self.running.forget()
        tail = output.decode("utf-8", errors="replace")
        return CommandResult(
            exit_code=exit_code, output_tail=tail, duration_s=self._clock() - started, timed_out=timed_out
        )

    def _collect(self, channel: paramiko.Channel, deadline: float) -> tuple[int | None, bytearray, bool]:
        """Read until the output ends and the command exits, or the deadline passes:
        (exit code, output tail, timed out). sshd may send the exit status before the last of the
        output, so the output is read to its end (or a short grace after the exit, for a child left
        holding it open)."""
        limit = self.options.output_tail_bytes
        output = bytearray()
        channel.settimeout(_READ_SLICE_S)
        exited_at: float | None = None
        while True:
            now = self._clock()
            if now >= deadline:
                channel.close()
                return None, output, True
            if channel.exit_status_ready():
                exited_at = exited_at or now
                if now - exited_at > _OUTPUT_GRACE_S:
                    break
            try:
                chunk = channel.recv(32768)
            except TimeoutError:
                continue
            if not chunk:  # end of the output
                if channel.exit_status_ready() or channel.closed:
                    break
                time.sleep(0.01)  # the exit status is on its way
                continue
            _tail(output, chunk, limit)
        # paramiko marks a channel closed without an exit status as "ready" with -1 (never a real status).
        status = channel.recv_exit_status() if channel.exit_status_ready() else -1
        if status == -1:
            raise EOFError("the connection closed before the command's exit status")
        return status, output, False

    def _exec_quiet(self, command: str) -> str:
        """A short helper command's output, run without a tag or a record."""
        assert self._client is not None
        try:
            _, stdout, _ = self._client.exec_command(command, timeout=self.options.connect_timeout_s)
            output = stdout.read().decode(errors="replace")
            stdout.channel.recv_exit_status()
            return output
        except (paramiko.SSHException, OSError, EOFError) as error:
            self.close()
            raise SshError(f"lost the connection to {self.host.where()}: {error}") from None

    def boot_id(self) -> str:
        """The host's boot id (changes at every boot), read with the configured command."""
        argv = list(self.options.boot_id_argv)
        result = self.run(argv, timeout_s=self.options.connect_timeout_s)
        value = result.output_tail.strip()
        if result.exit_code != 0 or not value:
            raise SshError(
                f"cannot read the boot id of {self.host.where()} with {shlex.join(argv)}: "
                f"exit {result.exit_code}, output {value[-200:]!r}"
            )
        return value

    def reboot(self, argv: list[str]) -> None:
        """Run the reboot command (its connection may drop: that is the reboot), then wait until
        the host answers with a new boot id. Raises SshError if the command fails or no new boot comes."""
        before = self.boot_id()
        try:
            result = self.run(argv, timeout_s=max(self.options.connect_timeout_s, 60.0))
        except SshError:
            result = None  # the host went down under us: what a reboot does
        finally:
            self.running.forget()  # the reboot ends every process; none is left to wait for
            self.close()
        if result is not None and result.exit_code != 0 and not result.timed_out:
            raise SshError(
                f"the reboot command {shlex.join(argv)} on {self.host.where()} exited {result.exit_code}: "
                f"{result.output_tail.strip()[-300:]}"
            )
        self._wait_for_new_boot(before)

    def _wait_for_new_boot(self, before: str) -> None:
        deadline = self._clock() + self.options.reboot_timeout_s
        last_error = "it still reports the old boot id"
        while self._clock() < deadline:
            try:
                if self.boot_id() != before:
                    return
                last_error = "it still reports the old boot id"
            except HostKeyRejected:
                raise
            except SshError as error:
                last_error = str(error)
                self.close()
            time.sleep(self.options.reboot_poll_s)
        raise SshError(
            f"{self.host.where()} did not come back with a new boot id within "
            f"{self.options.reboot_timeout_s:.0f}s ({last_error})"
        )
