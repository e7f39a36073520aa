"""The SRE read side: named questions, the report, its charts and the dashboards.

Pure functions of a query function (``sql -> sre.results.QueryResult``): no
ClickHouse driver, no Kafka, no faust. The CLI (``fleetloop ask``/``report``)
and the worker (the live ``/dashboards`` page) give them a query function.
"""
