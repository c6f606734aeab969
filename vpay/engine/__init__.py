"""The job engine: jobs and their fenced writes, lanes, fairness, wake-ups,
vacuum and reaping. Domain-free: it imports only ``vpay.base``, and the lanes
of the layers above are registered with it (``lanes.register_lane``), so it
could be lifted out as a library (docs/architecture.md, "Layers")."""
