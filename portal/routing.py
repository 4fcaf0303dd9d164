"""Websocket routes. Browser streams and the agent route are added by the apps that own them."""

websocket_urlpatterns: list = []

# Node agents: token-authenticated, no cookies, no Origin check (agents send none); see scheduling/agents/socket/.
from django.urls import path  # noqa: E402

from scheduling.agents.socket.transport import AgentConsumer  # noqa: E402

websocket_urlpatterns.append(path("ws/agent/", AgentConsumer.as_asgi()))

# Browser streams (cluster, queue, one job): session auth, Origin checked; see scheduling/realtime/streams.py.
from scheduling.realtime.streams import websocket_urlpatterns as browser_streams  # noqa: E402

websocket_urlpatterns.extend(browser_streams)
