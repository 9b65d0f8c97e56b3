import sys

from rudder.plan.cli import main

sys.exit(main())
