"""Neighbour sampling with DGL's semantics over the partitioned graph, and the minibatch schedule."""
