"""The evaluations: harnesses that drive the production planners through
scenarios, real traces and NAB, and the scoring each reports.

Only the CLI imports this package; nothing a worker, agent or executor runs
depends on it. Each harness builds its planners from the settings and wiring a
worker reads (``fleetloop.settings``, ``fleetloop.wiring``).
"""
