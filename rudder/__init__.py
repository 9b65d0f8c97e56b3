"""Rudder's layers, bottom up (docs/architecture.md): comm, logs, data, sampling, agent, prefetch,
train, then the offline tools sim, analysis and netem. A layer imports only the layers below it."""

__version__ = "0.1.0"
