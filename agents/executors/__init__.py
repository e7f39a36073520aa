"""Executors: turn commands into actions and account for every one of them."""
