"""The trace-driven simulator (python -m rudder.simulate): the run path's code with counted instead of moved rows."""
