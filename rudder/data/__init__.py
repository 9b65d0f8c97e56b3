"""Graph data behind narrow interfaces: the partition format, feature rows and adjacency read by global ID, and the one door to DGL."""
