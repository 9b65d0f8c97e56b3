"""The two shaped networks, each made only of private namespaces (rudder.netem.namespaces).

* ``shared``: one namespace; its loopback is the one link every rank shares (tbf/htb on ``lo``),
  an aggregate bandwidth. Every emulated node has address 127.0.0.1.
* ``per-node``: a switch namespace holding a bridge, and one namespace per emulated node with a
  veth pair into the bridge. Both ends are shaped, so each node's NIC has the rate in each direction,
  as on a switched fabric: node k's ``eth0`` (what it sends) and the bridge port ``port<k>`` (what
  it receives). Node k has 10.211.0.<k+1>/24, an address that exists only inside these namespaces
  (there is no link to the host's namespace, so no packet can leave them).

The job is started in ``job_ns``: the shared namespace, or node 0's."""
from __future__ import annotations

from dataclasses import dataclass

from rudder.netem.namespaces import Netns
from rudder.netem.shaping import LinkEnd, Shaper, install

SUBNET = "10.211.0"
TOPOLOGIES = ("shared", "per-node")


@dataclass
class Network:
    topology: str
    shaper: Shaper
    namespaces: list[Netns]
    node_ns: list[Netns]  # node k's namespace (one and the same for the shared link)
    addresses: list[str]  # node k's address, inside node_ns[k]
    links: list[LinkEnd]

    @property
    def job_ns(self) -> Netns:
        return self.node_ns[0]

    def node_links(self, node: int) -> list[LinkEnd]:
        """The shaped ends of node ``node``'s link (the shared link: the one link there is)."""
        return [link for link in self.links if link.node in (None, node)]

    def close(self) -> None:
        for ns in self.namespaces:
            ns.close()


def build(topology: str, nodes: int, shaper: Shaper, mtu: int) -> Network:
    namespaces: list[Netns] = []
    try:
        return (_shared if topology == "shared" else _per_node)(nodes, shaper, mtu, namespaces)
    except BaseException:
        for ns in namespaces:
            ns.close()
        raise


def _shared(nodes: int, shaper: Shaper, mtu: int, namespaces: list[Netns]) -> Network:
    ns = Netns("shared")
    namespaces.append(ns)
    ns.run("ip", "link", "set", "lo", "up")
    link = LinkEnd(None, "lo", ns, "lo")
    install(link, shaper)
    return Network("shared", shaper, namespaces, [ns] * nodes, ["127.0.0.1"] * nodes, [link])


def _per_node(nodes: int, shaper: Shaper, mtu: int, namespaces: list[Netns]) -> Network:
    switch = Netns("switch")
    namespaces.append(switch)
    switch.run("ip", "link", "add", "br0", "type", "bridge")  # no STP: ports forward at once
    switch.run("ip", "link", "set", "br0", "up")
    node_ns, addresses, links = [], [], []
    for k in range(nodes):
        ns = Netns(f"node{k}")
        namespaces.append(ns)
        port = f"port{k}"
        switch.run("ip", "link", "add", port, "mtu", str(mtu), "type", "veth", "peer", "name", "eth0",
                   "mtu", str(mtu), "netns", ns.path)
        switch.run("ip", "link", "set", port, "master", "br0", "up")
        address = f"{SUBNET}.{k + 1}"
        ns.run("ip", "link", "set", "lo", "up")
        ns.run("ip", "addr", "add", f"{address}/24", "dev", "eth0")
        ns.run("ip", "link", "set", "eth0", "up")
        node_ns.append(ns)
        addresses.append(address)
        links += [LinkEnd(k, "node", ns, "eth0"), LinkEnd(k, "switch", switch, port)]
    for link in links:
        install(link, shaper)
    return Network("per-node", shaper, namespaces, node_ns, addresses, links)
