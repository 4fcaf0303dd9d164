"""ASGI entry point: HTTP through Django (sessions' proxy aside), websockets through Channels routes."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from frontend.sessions import http_app  # noqa: E402
from portal.heap import startup_heap_freeze  # noqa: E402
from portal.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # A job's web port (/jobs/<id>/open/<name>/) is proxied before Django's stack; the rest is Django's.
        "http": http_app(django_asgi_app),
        "websocket": URLRouter(websocket_urlpatterns),
    }
)

startup_heap_freeze()  # portal/heap.py: full collections skip what startup built
