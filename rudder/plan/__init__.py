"""``python -m rudder.plan``: what a run will cost each rank before an allocation is spent
(docs/cluster.md, "Planning a run"): no MPI."""
