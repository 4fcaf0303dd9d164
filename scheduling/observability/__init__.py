"""What Tessera tells a monitoring system: Prometheus metrics (scheduler, GPUs, agents, API)."""
