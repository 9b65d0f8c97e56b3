"""DGL is imported through rudder.data.dgl_bridge only, and works for what Rudder uses."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import REPO


def test_dgl_imports_and_samples():
    code = (
        "import os, torch\n"
        "real_load, real_exists = torch.classes.load_library, os.path.exists\n"
        "from rudder.data.dgl_bridge import load_dgl\n"
        "dgl = load_dgl()\n"
        "assert torch.classes.load_library == real_load and os.path.exists is real_exists\n"
        "g = dgl.graph((torch.tensor([0, 1, 2, 3]), torch.tensor([1, 2, 3, 0])))\n"
        "sg = dgl.sampling.sample_neighbors(g, torch.tensor([1, 2]), 1)\n"
        "block = dgl.to_block(sg, torch.tensor([1, 2]))\n"
        "conv = dgl.nn.SAGEConv(3, 2, 'mean')\n"
        "out = conv(block, (torch.ones(block.num_src_nodes(), 3), torch.ones(2, 3)))\n"
        "print(dgl.__version__, tuple(out.shape))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2.1.0", "(2,", "2)"]
    assert "deprecat" not in proc.stderr.lower()  # torchdata's banner is silenced


def test_no_module_imports_dgl_directly():
    offenders = []
    pattern = re.compile(r"^\s*(import dgl\b|from dgl\b)", re.M)
    for top in ("rudder", "partitioning", "drivers", "bench", "tests"):
        for root, _, files in os.walk(os.path.join(REPO, top)):
            for name in files:
                path = os.path.join(root, name)
                if name.endswith(".py") and path != os.path.join(REPO, "rudder", "dgl_bridge.py"):
                    with open(path) as f:
                        if pattern.search(f.read()):
                            offenders.append(os.path.relpath(path, REPO))
    assert offenders == []
