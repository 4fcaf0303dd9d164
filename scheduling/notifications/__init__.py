"""Telling people what happened: job starts, ends, failures and preemptions to their owners, lost nodes and GPU
XID errors to admins; by email and Slack-compatible webhooks, after commit, retried with backoff."""
