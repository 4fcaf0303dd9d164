"""The portal's side of the node agents' websocket (/ws/agent/), top to bottom (pyproject.toml's contract for
this room keeps the imports going downwards):

- transport.py: the connection (`AgentConsumer`): handshake and token, frames in and out, the close.
- lanes.py: the order a node's frames are handled in: the newest heartbeat at once, everything else on the
  node's own queue in the order sent; start reports batched across nodes.
- handlers.py: what each kind of report does (hello, heartbeat, job_status, event, ack, logs, metrics) and the
  answer it gets; the writes themselves are in scheduling/agents/reports/.
- desired.py: the node's desired state out; log_pulls.py: asking the agent for its jobs' logs; beats.py: the
  heartbeats of every socket of the process, recorded together.
- link.py: the connection as the parts above see it (its node, frames out, its own tasks); layer.py: the
  channel layer (the node's group, browsers' groups); db_threads.py: the database threads it all runs on;
  batches.py: writes of every socket of the process gathered into batches (start reports, heartbeats).

A new kind of report: its writes in a module of scheduling/agents/reports/, its handler in handlers.py (named
in `ReportHandlers.queued`), and its wire format in agent/protocol.py and docs/agent.md.
"""
