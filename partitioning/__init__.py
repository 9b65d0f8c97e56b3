"""The Rudder partition tool: ``python -m partitioning --help``."""
