"""The scheduling app's REST API: jobs, the queue, the cluster and usage."""
