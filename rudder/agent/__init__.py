"""The agent rank: its protocol with the trainers, the decision service and server, and the decision makers (deciders/)."""
