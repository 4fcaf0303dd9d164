"""Websocket routes. Browser streams and the agent route are added by the apps that own them."""

websocket_urlpatterns: list = []

# Node agents: token-authenticated, no cookies, no Origin check (agents send none); see scheduling/agents/socket/.
from django.urls import path  # noqa: E402

from scheduling.agents.socket.transport import AgentConsumer  # noqa: E402

websocket_urlpatterns.append(path("ws/agent/", AgentConsumer.as_asgi()))

# Browser streams (cluster, queue, one job): session auth, Origin checked; see scheduling/realtime/streams.py.
from scheduling.realtime.streams import websocket_urlpatterns as browser_streams  # noqa: E402

websocket_urlpatterns.extend(browser_streams)

# A job's web port over WebSocket (Jupyter's kernels): session auth and the same Origin checks as the streams; see
# frontend/sessions.py.
from frontend.sessions import websocket_routes as session_routes  # noqa: E402
from scheduling.realtime.streams import browser_origin_checks  # noqa: E402

websocket_urlpatterns.extend(session_routes(browser_origin_checks))
