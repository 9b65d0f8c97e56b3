"""The run directory's files, without MPI: the per-rank HDF5 logs (schema, writer, reader), the
figures computed from them, and checkpoint files."""
