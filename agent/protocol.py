"""The agent <-> portal wire protocol (JSON over a websocket): envelopes, message types, acks.

Documented for the portal side in docs/agent.md. Every message is an object
{"v": 1, "type": str, "id": str, "sent_at": float, "payload": object}; `ack` answers one message by id.
Every frame, either way, is at most MAX_FRAME_BYTES once encoded; bytes (log chunks) travel as base64.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

PROTOCOL_VERSION = 1
AGENT_MESSAGES = ("hello", "heartbeat", "metrics", "job_status", "event", "logs", "ack")
PORTAL_MESSAGES = ("desired_state", "logs_request", "heartbeat_ack", "ack")
# What a portal may say it understands, in its ack of a hello (`features`); an agent uses a feature only once the
# portal it is connected to has said so, so new agents and old portals (and old agents and new portals) mix.
# metrics_batch: a `metrics` message may carry `batch`, a list of samples (each as a `metrics` payload), one frame
# every few seconds instead of one a second.
# heartbeat_samples: a `heartbeat` may carry `samples`, the batch gathered since the last heartbeat (as
# `metrics`'s `batch`): a node sends one frame a heartbeat period instead of two.
FEATURES = ("metrics_batch", "heartbeat_samples")
# The sender keeps these until acked, and sends them again after a reconnect (receivers must be idempotent).
RELIABLE = frozenset({"hello", "job_status", "event", "desired_state"})
# The largest websocket message either side sends or accepts, encoded. daphne drops the connection of a client
# sending more than its --websocket-max-message-size, 1 MiB by default: with this limit a portal served by a
# plain daphne takes every frame an agent sends. The agent's client refuses larger frames from the portal.
MAX_FRAME_BYTES = 1024 * 1024
# A job_status `launch_failed` whose reason starts "image_pull_failed: ": the job's image could not be pulled (the
# runtime's words follow). agent/supervisor.py writes the same word (it imports nothing of the agent).
IMAGE_PULL_FAILED = "image_pull_failed"
# Raw log bytes per `logs` answer at most. Base64 turns 3 bytes into 4, so a full chunk (349,528 characters)
# leaves the rest of a frame for the envelope.
MAX_LOG_CHUNK_BYTES = 256 * 1024


def port_env_name(name: str) -> str:
    """A job's web port `name` (jupyter, my-board) as its environment names it: TESSERA_PORT_<this> carries the
    port its agent gave, TESSERA_BASE_URL_<this> the path the portal serves it under."""
    return name.upper().replace("-", "_")


class ProtocolError(ValueError):
    pass


class FrameTooLarge(ProtocolError):
    """A message whose encoded frame is over MAX_FRAME_BYTES: the receiver would drop the connection."""


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
    """The frame for a message: JSON, ASCII only (so characters are bytes); FrameTooLarge over the limit."""
    text = json.dumps(msg, separators=(",", ":"), allow_nan=False)
    if len(text) > MAX_FRAME_BYTES:
        raise FrameTooLarge(
            f"a {msg.get('type')} message of {len(text)} bytes is over the frame limit of {MAX_FRAME_BYTES} bytes"
        )
    return text


def base64_room(envelope: dict[str, Any]) -> int:
    """How many raw bytes, base64-encoded into one empty string field of `envelope`, keep its frame within
    MAX_FRAME_BYTES (0 when nothing fits). Numbers in the envelope must be as wide as the final ones."""
    try:
        room = MAX_FRAME_BYTES - len(encode(envelope))
    except FrameTooLarge:
        return 0
    return room // 4 * 3


def lines_that_fit(lines: list[str], room_bytes: int) -> list[str]:
    """The last lines whose encoding as JSON list items takes at most room_bytes."""
    kept: list[str] = []
    used = 0
    for line in reversed(lines):
        used += len(json.dumps(line)) + 1  # the comma (or the bracket) that goes with it
        if used > room_bytes:
            break
        kept.append(line)
    kept.reverse()
    return kept


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
