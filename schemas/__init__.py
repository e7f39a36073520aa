"""fleetloop contracts: event and command types, the topic registry and the codec.

This package imports nothing else of ours and no framework (Kafka, faust,
river, Prometheus, ClickHouse); it is the vocabulary every component speaks.
"""
