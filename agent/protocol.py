"""The agent <-> portal wire protocol (JSON over a websocket): envelopes, message types, acks.

Documented for the portal side in docs/agent.md. Every message is an object
{"v": 1, "type": str, "id": str, "sent_at": float, "payload": object}; `ack` answers one message by id.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

PROTOCOL_VERSION = 1
AGENT_MESSAGES = ("hello", "heartbeat", "metrics", "job_status", "event", "logs", "ack")
PORTAL_MESSAGES = ("desired_state", "logs_request", "heartbeat_ack", "ack")
# The sender keeps these until acked, and sends them again after a reconnect (receivers must be idempotent).
RELIABLE = frozenset({"hello", "job_status", "event", "desired_state"})
MAX_LOG_CHUNK_BYTES = 256 * 1024


class ProtocolError(ValueError):
    pass


def message(type_: str, payload: dict[str, Any], *, msg_id: str | None = None) -> dict[str, Any]:
    return {
        "v": PROTOCOL_VERSION,
        "type": type_,
        "id": msg_id or uuid.uuid4().hex,
        "sent_at": time.time(),
        "payload": payload,
    }


def ack(acked_id: str, *, ok: bool = True, error: str | None = None, **extra: Any) -> dict[str, Any]:
    return message("ack", {"ack_id": acked_id, "ok": ok, "error": error, **extra})


def encode(msg: dict[str, Any]) -> str:
    return json.dumps(msg, separators=(",", ":"), allow_nan=False)


def decode(text: str | bytes) -> dict[str, Any]:
    try:
        msg = json.loads(text)
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {exc}") from exc
    if not isinstance(msg, dict):
        raise ProtocolError("a message is a JSON object")
    if not isinstance(msg.get("type"), str) or not isinstance(msg.get("id"), str) or not msg["id"]:
        raise ProtocolError("a message needs a string type and a non-empty string id")
    payload = msg.setdefault("payload", {})
    if not isinstance(payload, dict):
        raise ProtocolError("payload must be an object")
    if msg.get("v", PROTOCOL_VERSION) != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {msg.get('v')!r}")
    return msg
