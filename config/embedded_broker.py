"""The embedded default's Celery broker: a kombu transport on its own SQLite file (stdlib only).

Why not kombu's filesystem transport: a reader can open a message file its writer has not finished
writing, and the worker dies on the half-written JSON (an open kombu bug). Here a message is a row:
SQLite's transactions make its insert all-or-nothing, so a reader sees a whole message or none.

Delivery is at least once, like the Redis transport of the production shape: taking a message
marks it taken (with the time), acknowledging it deletes it, rejecting or a clean shutdown puts it
back, and a message taken by a consumer that died (kill -9) is taken again after the visibility
timeout. Tasks carry ids and re-read state, so a second delivery changes nothing.

Not for several machines: the file is local. Fanout (Celery's remote control) is not supported;
the worker runs without it in the embedded default.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from json import dumps, loads
from pathlib import Path
from queue import Empty
from typing import Any

from kombu.transport import TRANSPORT_ALIASES, virtual

ALIAS = "opsqlite"
BUSY_TIMEOUT_S = 30.0
DEFAULT_VISIBILITY_TIMEOUT_S = 600.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS message (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    queue TEXT NOT NULL,
    tag TEXT NOT NULL,
    payload TEXT NOT NULL,
    taken_at REAL
);
CREATE INDEX IF NOT EXISTS message_queue_taken ON message (queue, taken_at, id);
CREATE INDEX IF NOT EXISTS message_tag ON message (tag);
"""


def broker_connect(path: str | Path) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL, waiting on locks."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    connection.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL mode survives a process crash; only a power loss may lose the last commits.
    connection.execute("PRAGMA synchronous=NORMAL")
    connection.executescript(SCHEMA)
    return connection


class QoS(virtual.QoS):
    """Acknowledgement deletes the row; a reject with requeue, or a restore, makes it visible again."""

    channel: Channel
    _quick_ack: Callable[[str], None]  # set by virtual.QoS.__init__; kombu's stubs leave it out

    def ack(self, delivery_tag: str) -> None:
        self.channel.message_delete(delivery_tag)
        super().ack(delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if requeue:
            self.channel.message_release(delivery_tag)
        else:
            self.channel.message_delete(delivery_tag)
        self._quick_ack(delivery_tag)


class Channel(virtual.Channel):
    QoS = QoS
    do_restore = True

    def __init__(self, connection: Any, **kwargs: Any) -> None:
        options = connection.client.transport_options
        self.path = options.get("path") or connection.client.virtual_host
        if not self.path or self.path == "/":
            raise ValueError("the embedded broker needs a file: transport option 'path'")
        self.visibility_timeout = float(options.get("visibility_timeout", DEFAULT_VISIBILITY_TIMEOUT_S))
        self._lock = threading.Lock()
        self._db = broker_connect(self.path)
        super().__init__(connection, **kwargs)

    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        tag = message.get("properties", {}).get("delivery_tag") or ""
        with self._lock:
            self._db.execute(
                "INSERT INTO message (queue, tag, payload) VALUES (?, ?, ?)", (queue, str(tag), dumps(message))
            )

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        # An idle poll only reads; the write lock is taken when there is a message to take, and the
        # take is guarded (taken_at still free), so two consumers never get the same row.
        now = time.time()
        expired = now - self.visibility_timeout
        with self._lock:
            db = self._db
            row = db.execute(
                "SELECT id FROM message WHERE queue = ? AND (taken_at IS NULL OR taken_at < ?) ORDER BY id LIMIT 1",
                (queue, expired),
            ).fetchone()
            if row is None:
                raise Empty()
            db.execute("BEGIN IMMEDIATE")
            try:
                taken = db.execute(
                    "UPDATE message SET taken_at = ? WHERE id = ? AND (taken_at IS NULL OR taken_at < ?)",
                    (now, row[0], expired),
                ).rowcount
                payload = db.execute("SELECT payload FROM message WHERE id = ?", (row[0],)).fetchone()
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        if taken != 1 or payload is None:
            raise Empty()  # another consumer took it first; the next poll looks again
        return loads(payload[0])

    def _restore(self, message: Any) -> None:
        # The row is still there (taken); making it visible again is the restore, not a second copy.
        self.message_release(message.delivery_tag)

    def _size(self, queue: str) -> int:
        with self._lock:
            return self._db.execute("SELECT count(*) FROM message WHERE queue = ?", (queue,)).fetchone()[0]

    def _purge(self, queue: str) -> int:
        with self._lock:
            return self._db.execute("DELETE FROM message WHERE queue = ?", (queue,)).rowcount

    def _delete(self, queue: str, *args: Any, **kwargs: Any) -> None:
        self._purge(queue)

    def message_delete(self, delivery_tag: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM message WHERE tag = ?", (str(delivery_tag),))

    def message_release(self, delivery_tag: str) -> None:
        with self._lock:
            self._db.execute("UPDATE message SET taken_at = NULL WHERE tag = ?", (str(delivery_tag),))

    def close(self) -> None:
        super().close()
        with self._lock:
            self._db.close()


class Transport(virtual.Transport):
    Channel = Channel
    default_port = 0
    driver_type = "sqlite"
    driver_name = "sqlite3"
    connection_errors = (sqlite3.OperationalError,)
    channel_errors = (sqlite3.OperationalError,)
    implements = virtual.Transport.implements.extend(exchange_type=frozenset(["direct", "topic"]))

    def driver_version(self) -> str:
        return sqlite3.sqlite_version


def embedded_broker_register() -> None:
    """Make `opsqlite://` a kombu transport (idempotent)."""
    TRANSPORT_ALIASES.setdefault(ALIAS, f"{__name__}:Transport")
