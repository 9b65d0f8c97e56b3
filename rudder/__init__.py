"""Rudder: MPI-native distributed GNN training with LLM-steered prefetching of remote features."""

__version__ = "0.1.0"
