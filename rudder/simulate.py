"""``python -m rudder.simulate``: the trace-driven simulator (``rudder.sim.cli``)."""
import sys

from rudder.sim.cli import main

if __name__ == "__main__":
    sys.exit(main())
