"""A stand-in for Jupyter where this machine has none: the demo's simulated nodes run it for `jupyter` (run_demo's
stand-in script) and the session tests run it as a job. It serves HTTP and WebSocket on the port its agent gave it
(TESSERA_PORT_<NAME>), under the portal's path for it (TESSERA_BASE_URL_<NAME>), refuses every request without the
job's token (`Authorization: token $JUPYTER_TOKEN`) as Jupyter does, and sets a cookie as Jupyter does (which the
portal's proxy drops). Standard library and `websockets` only; run as a script, never imported.

  GET <base>          a page saying who it is
  GET <base>headers   the request's headers, as JSON (what the proxy passed on)
  WS  <base>echo      answers each text frame with "echo: " and the frame
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from websockets.asyncio.server import serve
from websockets.datastructures import Headers
from websockets.http11 import Response

NAME = sys.argv[1] if len(sys.argv) > 1 else "jupyter"
ENV = NAME.upper().replace("-", "_")
PORT = int(os.environ[f"TESSERA_PORT_{ENV}"])
BASE = os.environ[f"TESSERA_BASE_URL_{ENV}"]
TOKEN = os.environ["JUPYTER_TOKEN"]


def _response(status: int, body: bytes, content_type: str) -> Response:
    headers = Headers([("Content-Type", content_type), ("Content-Length", str(len(body)))])
    headers["Set-Cookie"] = "stand-in-notebook=1; Path=/"  # Jupyter sets _xsrf; the proxy passes no cookie on
    return Response(status, "OK" if status == 200 else "Forbidden", headers, body)


async def process_request(connection, request):
    if request.headers.get("Authorization") != f"token {TOKEN}":
        return _response(403, b"Forbidden: no token\n", "text/plain")
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return None
    if request.path.startswith(BASE + "headers"):
        return _response(200, json.dumps(dict(request.headers.raw_items())).encode(), "application/json")
    page = (
        f"<!doctype html><title>stand-in {NAME}</title><h1>Stand-in {NAME} of job "
        f"{os.environ['TESSERA_JOB_ID']}</h1><p id='who'>for {request.headers.get('X-Tessera-User')}</p>"
        "<p>This machine has no Jupyter: this server stands in for it, through the same proxy. "
        f"<code>ws {BASE}echo</code> answers each message.</p>"
    )
    return _response(200, page.encode(), "text/html; charset=utf-8")


async def echo(websocket) -> None:
    async for frame in websocket:
        await websocket.send(f"echo: {frame}")


async def main() -> None:
    async with serve(echo, "0.0.0.0", PORT, process_request=process_request) as server:
        print(f"{NAME} listening on {PORT} under {BASE}", flush=True)
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
