"""Benchmarks: print figures against a baseline measured in the same run; never assert."""
