"""Which fragments each live page wants pushed, registered by the module that renders the page.

Each app imports its page modules in its `ready()` (as the trains register their approval handlers
there): one registration mechanism, and the consumer finds every page without knowing the apps.

A page names itself in `<body data-live-page=… data-live-params=…>`; live.js tells the consumer on
every (re)connect, the consumer answers with a full resync (group None) and later with the
fragments of each group that changed. A renderer returns HTML whose elements carry
`hx-swap-oob`, re-read from the database for that user, or "" when nothing on the page changed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from opsplanner.permissions import Action, user_can


class LiveRenderer(Protocol):
    def __call__(self, *, user: Any, group: str | None, params: dict[str, str]) -> str: ...


_RENDERERS: dict[str, LiveRenderer] = {}
_ACTIONS: dict[str, Action] = {}


def live_page(name: str, *, action: Action = Action.READ) -> Callable[[LiveRenderer], LiveRenderer]:
    """Register the renderer of page `name`; a socket may watch it only if its user may `action`."""

    def register(renderer: LiveRenderer) -> LiveRenderer:
        _RENDERERS[name] = renderer
        _ACTIONS[name] = action
        return renderer

    return register


def live_renderer(name: str, user: Any) -> LiveRenderer | None:
    """The page's renderer, or None when there is no such page or this user may not watch it
    (the same `user_can` as the page itself)."""
    renderer = _RENDERERS.get(name)
    if renderer is None or not user_can(user, _ACTIONS[name]):
        return None
    return renderer
