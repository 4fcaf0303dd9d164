"""GPU inventory, jobs and their slices, the scheduling engine (engine/) and the trace simulator (sim/)."""
