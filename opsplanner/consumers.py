"""The live websocket: each browser joins the groups of what its user may see and gets HTML
fragments for HTMX out-of-band swaps when those change. The permission check is the same
`user_can` as the API and the pages, asked at connect and for every subscription."""

from __future__ import annotations

import json
from typing import Any

from asgiref.sync import async_to_sync
from channels.generic.websocket import WebsocketConsumer
from django.template.loader import render_to_string

from fleet.models import Pool
from fleet.selectors.capacity import pool_capacity
from opsplanner.live import APPROVALS_GROUP, pool_group
from opsplanner.models import Approval, ApprovalState
from opsplanner.permissions import Action, user_can

REFUSED = 4403  # a websocket close code in the application range: not allowed


class LiveConsumer(WebsocketConsumer):
    def connect(self) -> None:
        self.user = self.scope.get("user")
        self.joined: set[str] = set()
        if not user_can(self.user, Action.READ):
            self.close(code=REFUSED)  # before accept: the handshake is refused
            return
        self.accept()
        for pool_id in Pool.objects.values_list("id", flat=True):
            self._join(pool_group(pool_id))
        if user_can(self.user, Action.APPROVE):
            self._join(APPROVALS_GROUP)

    def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """{"subscribe": "pool", "id": N}: join one more group, if this user may see it."""
        try:
            message = json.loads(text_data or "")
            kind, object_id = message["subscribe"], int(message["id"])
        except (ValueError, KeyError, TypeError):
            self.send(text_data=json.dumps({"error": 'send {"subscribe": "pool", "id": N}'}))
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
        if group not in self.joined:
            return
        if group == APPROVALS_GROUP:
            pending = Approval.objects.filter(state=ApprovalState.PENDING).count()
            html = render_to_string("opsplanner/htmx/approvals_badge.html", {"pending": pending, "oob": True})
        else:
            pool = Pool.objects.filter(pk=int(group.removeprefix("pool-"))).first()
            if pool is None:
                return
            html = render_to_string("opsplanner/htmx/pool_row.html", {"capacity": pool_capacity(pool), "oob": True})
        self.send(text_data=html)

    def _join(self, group: str) -> None:
        async_to_sync(self.channel_layer.group_add)(group, self.channel_name)
        self.joined.add(group)
