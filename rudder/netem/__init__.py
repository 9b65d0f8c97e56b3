"""A shaped network on one machine (python -m rudder.netem): any command run inside private network
namespaces whose links are rate-limited, with optional competing traffic and link faults. An offline
tool beside sim and analysis; the run path never imports it (docs/network.md)."""
