"""``python -m rudder.analyze``: the analysis tool (``rudder.analysis.cli``)."""
import sys

from rudder.analysis.cli import main

if __name__ == "__main__":
    sys.exit(main())
