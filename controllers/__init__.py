"""Pure decision logic: plain synchronous Python, values and ``now`` in, decisions out.

Nothing here imports Kafka, faust, river, Prometheus or ClickHouse (a test
enforces it). The controllers themselves arrive with their issues (grey
failure isolation, warming, capacity, power); this package holds the rule.
"""
