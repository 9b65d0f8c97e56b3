"""The grid side of the hindsight oracle: a grid's ``[oracle]`` table, checked, and the sweep of
fixed settings it spans (fixed's replacement period x refill budget x buffer scope, lookahead's
window x buffer scope), each a run of its own beside the grid's policies, its label showing the
setting (the report side: ``bench/evaluation/oracle.py``; docs/evaluation.md, "The hindsight oracle")."""
from __future__ import annotations

import dataclasses

SWEEP = "sweep-"  # the label prefix of a sweep run (kept apart from the grid's own fixed runs: no traces collected)
AXES = {"delta": "[oracle] delta must be a list of periods in minibatches (integers >= 1)",
        "refill": "[oracle] refill must be a list of fractions of the buffer's capacity in (0, 1]",
        "scope": "[oracle] scope must be a list of \"halo\" and \"remote\"",
        "lookahead": "[oracle] lookahead must be a list of windows in minibatches (integers >= 1)"}
STATICS = ("static", "static-vip")  # --buffer-init degree and vip
TARGETS = ("over_oracle", "over_static", "steady_over_oracle")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One fixed setting of the sweep: ``fixed`` every ``delta`` minibatches, each replacement at
    most ``refill`` of the capacity, or ``lookahead`` with a ``window``; either in ``scope``."""
    policy: str  # fixed | lookahead
    scope: str
    delta: int = 0
    refill: float = 1.0
    window: int = 0

    @property
    def name(self) -> str:
        """What the run's label and directory show of the setting."""
        if self.policy == "fixed":
            return f"{SWEEP}fixed-d{self.delta}-b{self.refill:g}-{self.scope}"
        return f"{SWEEP}lookahead-w{self.window}-{self.scope}"

    def label(self, fraction) -> str:
        return f"{self.name}-f{fraction}"

    def flags(self, fraction) -> list[str]:
        flags = ["--policy", self.policy, "--buffer-fraction", str(fraction), "--buffer-scope", self.scope]
        if self.policy == "fixed":
            return flags + ["--delta", str(self.delta), "--refill-budget", str(self.refill)]
        return flags + ["--lookahead", str(self.window), "--trace"]  # --trace: as the grid's lookahead runs


def check_sweep(grid: dict) -> str | None:
    """What is wrong with ``[oracle]`` (each axis a non-empty list; delta and refill span the fixed
    runs, lookahead the window runs, scope both) or ``[targets.oracle]``, in one line; None: nothing."""
    table = grid.get("oracle")
    if table is None:
        return "[targets.oracle] needs an [oracle] table to check" if "oracle" in grid.get("targets", {}) else None
    extra = set(table) - set(AXES)
    if extra:
        return f"[oracle] unknown key {sorted(extra)[0]!r} ({', '.join(AXES)})"
    valid = {"delta": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
             "refill": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v <= 1,
             "scope": lambda v: v in ("halo", "remote"),
             "lookahead": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1}
    for key, values in table.items():
        if not isinstance(values, list) or not values or not all(valid[key](v) for v in values):
            return AXES[key]
    if not ("delta" in table or "lookahead" in table):
        return "[oracle] needs delta or lookahead (the settings to sweep)"
    want = grid.get("targets", {}).get("oracle", {})
    bad = [k for k, v in want.items() if k not in TARGETS or not isinstance(v, (int, float)) or isinstance(v, bool)]
    return f"[targets.oracle] {bad[0]!r} must be one of {', '.join(TARGETS)}, a number" if bad else None


def settings(grid: dict) -> list[Setting]:
    """The sweep of ``[oracle]`` (none without it): every delta x refill x scope as a fixed run,
    every lookahead window x scope as a lookahead run."""
    table = grid.get("oracle")
    if not table:
        return []
    scopes = table.get("scope", ["halo"])
    fixed = [Setting("fixed", s, delta=d, refill=float(b)) for d in table.get("delta", []) for b in table.get("refill", [1.0])
             for s in scopes]
    return fixed + [Setting("lookahead", s, window=w) for w in table.get("lookahead", []) for s in scopes]
