"""The ASGI entry point: HTTP through Django, websockets through Channels (routes come later)."""

import os

from django.core.asgi import get_asgi_application

from config.env import settings_or_exit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
# Read by settings: under ASGI each request runs on a new thread, so kept-open connections leak;
# the web server uses a connection pool instead.
os.environ.setdefault("OPSPLANNER_ASGI", "1")
settings_or_exit()  # a configuration mistake is one line, not a traceback
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from console.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
