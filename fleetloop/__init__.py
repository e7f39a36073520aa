"""fleetloop wiring: settings, the CLI, and the local development broker."""

__version__ = "0.1.0"
