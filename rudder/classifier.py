"""``python -m rudder.classifier``: training the classifier baselines (``rudder.agent.classifier_training``)."""
import sys

from rudder.agent.classifier_training import main

if __name__ == "__main__":
    sys.exit(main())
