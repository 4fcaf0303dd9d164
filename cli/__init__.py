"""`tessera`, the command line: a client of the portal's REST API and the simulator's entry point. It imports
neither Django nor Celery (an import-linter contract keeps it so), so it starts at once."""
