"""Websocket routes. Browser streams and the agent route are added by the apps that own them."""

websocket_urlpatterns: list = []
