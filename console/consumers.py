"""The live websocket: each browser joins the groups of what its user may see and gets HTML
fragments for HTMX out-of-band swaps when those change. The permission check is the same
`user_can` as the API and the pages, asked at connect and for every subscription.

A page says which it is (`{"watch": "gantt", "params": {...}}`, sent by live.js on every open,
so also after a reconnect); the consumer answers with a resync of that page's fragments from the
database, then pushes the fragments of each group that changes (console.live_pages).

A socket outlives the checks of its handshake: the session can end (logout, expiry, a password
change) and the user lose rights while it stays open. So before anything is sent or subscribed,
the consumer reads its session and user again (at most once every REVALIDATE_SECONDS) and closes
the socket when they changed: for good (REFUSED) when the user may no longer read, with "service
restart" (1012, which the page's websocket extension answers by reconnecting) when the rights
changed otherwise, so the new handshake joins the groups the new rights allow.

Announcements are coalesced: the channel layer keeps at most `capacity` messages per channel and
drops the rest, so a socket that rendered one fragment per message fell behind in a burst (many
executors reporting on one pool), its channel filled, and another group's announcement was lost.
Each announcement only notes its group; one push at a time renders every group noted since."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.generic.websocket import WebsocketConsumer
from django.conf import settings
from django.contrib.auth import get_user
from django.contrib.sessions.backends.base import SessionBase
from django.template.loader import render_to_string
from django.utils.module_loading import import_string

from console.live_pages import live_renderer
from fleet.models import Pool
from opsplanner.live import APPROVALS_GROUP, MESSAGE_TYPE, pool_group
from opsplanner.models import Approval, ApprovalState
from opsplanner.permissions import Action, user_actions, user_can

REFUSED = 4403  # a websocket close code in the application range: not allowed
RECONNECT = 1012  # "service restart": the page reconnects, and the new handshake sees the new rights
REVALIDATE_SECONDS = 1.0  # pushes this soon after the last check go out without checking again
log = logging.getLogger(__name__)


class LiveConsumer(WebsocketConsumer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.changed: set[str] = set()  # groups announced and not pushed yet
        self.pushing: asyncio.Future[None] | None = None
        self.gone = False

    async def dispatch(self, message: dict[str, Any]) -> None:
        """On the event loop: an announcement is noted and the loop goes back to the channel at once
        (so the channel never fills); everything else is handled in order, as by SyncConsumer."""
        if message.get("type") == MESSAGE_TYPE:
            self.changed.add(str(message.get("group", "")))
            if self.pushing is None:
                self.pushing = asyncio.ensure_future(self._push_changed())
            return
        if message.get("type") == "websocket.disconnect":
            self.gone, self.changed = True, set()  # nothing more for a closed socket
            if self.pushing is not None:
                await self.pushing  # the push under way ends before the groups are left
        await super().dispatch(message)

    async def _push_changed(self) -> None:
        try:
            while self.changed and not self.gone:
                groups, self.changed = self.changed, set()
                await database_sync_to_async(self._push)(groups)
        finally:
            self.pushing = None

    def _push(self, groups: set[str]) -> None:
        try:
            for group in sorted(groups):
                self.live_changed({"type": MESSAGE_TYPE, "group": group})
        except Exception:  # not lost in a task nobody awaits: the page reconnects and resyncs
            log.exception("live push of %s failed", ", ".join(sorted(groups)))
            self.close(code=RECONNECT)
            self.gone = True

    def connect(self) -> None:
        self.user = self.scope.get("user")
        self.joined: set[str] = set()
        self.page: str | None = None
        self.params: dict[str, str] = {}
        if not user_can(self.user, Action.READ):
            self.close(code=REFUSED)  # before accept: the handshake is refused
            return
        self.rights = user_actions(self.user)
        self.checked_at = time.monotonic()
        self.revoked = False
        self.accept()
        for pool_id in Pool.objects.values_list("id", flat=True):
            self._join(pool_group(pool_id))
        if user_can(self.user, Action.APPROVE):
            self._join(APPROVALS_GROUP)

    def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """{"watch": page, "params": {...}}: resync that page and follow it;
        {"subscribe": "pool", "id": N}: join one more group, if this user may see it."""
        if not self._still_allowed(force=True):
            return
        try:
            message = json.loads(text_data or "")
            if isinstance(message, dict) and "watch" in message:
                self._watch(str(message["watch"]), message.get("params") or {})
                return
            kind, object_id = message["subscribe"], int(message["id"])
        except (ValueError, KeyError, TypeError, AttributeError):
            self.send(text_data=json.dumps({"error": 'send {"watch": page} or {"subscribe": "pool", "id": N}'}))
            return
        if kind == "pool" and user_can(self.user, Action.READ) and Pool.objects.filter(pk=object_id).exists():
            self._join(pool_group(object_id))
            self.send(text_data=json.dumps({"subscribed": pool_group(object_id)}))
        else:
            self.send(text_data=json.dumps({"error": f"no {kind} #{object_id} you may watch"}))

    def disconnect(self, code: int) -> None:
        for group in self.joined:
            async_to_sync(self.channel_layer.group_discard)(group, self.channel_name)

    def live_changed(self, event: dict[str, Any]) -> None:
        group = event["group"]
        if group not in self.joined or not self._still_allowed():
            return
        parts = []
        if group == APPROVALS_GROUP:
            parts.append(self._approvals_badge())
        if self.page is None:
            # A socket that has not said which page it shows gets the overview's pool rows.
            if group.startswith("pool-"):
                parts.append(self._pool_row(int(group.removeprefix("pool-"))))
        else:
            renderer = live_renderer(self.page, self.user)
            if renderer is not None:
                parts.append(renderer(user=self.user, group=group, params=self.params))
        html = "".join(parts)
        if html:
            self.send(text_data=html)

    def _watch(self, page: str, params: object) -> None:
        renderer = live_renderer(page, self.user)
        if renderer is None or not isinstance(params, dict):
            self.send(text_data=json.dumps({"error": f"there is no live page {page!r} you may watch"}))
            return
        self.page = page
        self.params = {str(k): str(v) for k, v in params.items()}
        # The resync: everything the page shows that may have changed while the socket was closed.
        parts = [renderer(user=self.user, group=None, params=self.params)]
        if APPROVALS_GROUP in self.joined:
            parts.append(self._approvals_badge())
        self.send(text_data="".join(parts))

    def _still_allowed(self, *, force: bool = False) -> bool:
        """Read the session and its user again (Django's own checks: the session exists and has not
        expired, the user is active, the password has not changed since the login) and close the
        socket if the user, or what they may do, changed since the handshake."""
        if self.revoked:
            return False
        now = time.monotonic()
        if not force and now - self.checked_at < REVALIDATE_SECONDS:
            return True
        self.checked_at = now
        current = _session_user(self.scope)
        if current.pk == getattr(self.user, "pk", None) and user_actions(current) == self.rights:
            self.user = current
            return True
        self.revoked = True
        self.close(code=RECONNECT if user_can(current, Action.READ) else REFUSED)
        return False

    def _approvals_badge(self) -> str:
        pending = Approval.objects.filter(state=ApprovalState.PENDING).count()
        return render_to_string("opsplanner/htmx/approvals_badge.html", {"pending": pending, "oob": True})

    def _pool_row(self, pool_id: int) -> str:
        from console.views.pages import pool_row_html

        return pool_row_html(pool_id)

    def _join(self, group: str) -> None:
        async_to_sync(self.channel_layer.group_add)(group, self.channel_name)
        self.joined.add(group)


def _session_user(scope: Mapping[str, object]) -> Any:
    """The user the socket's session belongs to now, read afresh from the session store; anonymous
    when the session has ended."""
    session = scope.get("session")
    key = getattr(session, "session_key", None)
    store_class: type[SessionBase] = import_string(f"{settings.SESSION_ENGINE}.SessionStore")
    return get_user(SimpleNamespace(session=store_class(session_key=key)))  # type: ignore[arg-type]
