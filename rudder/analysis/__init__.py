"""Offline analysis of run logs (python -m rudder.analyze): no MPI here."""
