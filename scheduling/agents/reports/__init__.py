"""What node agents report, turned into writes: one module per kind of report.

`hello` (the inventory), `heartbeats`, `job_status` (starts, in batches across nodes, and ends; a gang member's
end in `gang_members`), `node_events` and `log_chunks` (the answers to the portal's log requests); `nodes` keeps
the node's own record (acked, disconnected, its newest error) and `outcome` the answer every report gets.

Each function is idempotent: agents resend unacknowledged reports after a reconnect. A report about a placement
the database no longer gives to this node (an older attempt, a job requeued after the node was lost) is refused
and changes nothing. The agents' socket (scheduling/agents/socket/) calls these on its database threads; nothing
here knows about the socket.
"""
