"""MPI mechanics: the job's layout, arrays read one-sidedly through RMA windows, node-shared memory, and how a job ends."""
