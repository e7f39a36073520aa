"""Planning: events in, decisions and signed commands out, for every controller.

Faust-free and IO-free: the stream processors in ``streams/`` feed these
planners and publish what comes out, and every evaluation drives the same
planners built from the same settings. May import controllers, models and
schemas; never a framework, ClickHouse or ``agents``.
"""
