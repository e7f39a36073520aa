"""The faust deployable: thin processors, the ClickHouse sink, the worker's web surface."""
