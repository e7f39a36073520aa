"""Online models: pure learners and detectors (river where it fits), no framework.

They learn and score per key, score before learning, keep per-device state
small (about 2 KiB at most) and run heavier models per cohort. ``streams/``
adapts them to Kafka; ``fleetloop eval`` scores them.
"""
