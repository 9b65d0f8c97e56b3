import sys

from rudder.netem.cli import main

sys.exit(main())
