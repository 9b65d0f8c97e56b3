"""Prefetching remote feature rows: buffers behind one protocol, the policies that steer them,
the cache wrapping the feature store, and the minibatch pipeline."""
