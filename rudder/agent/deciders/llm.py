"""The ``llm`` decision maker: a small instruct model, in context, decides evict or keep.

The prompt (system: the run's static facts and the rules; user: the latest window and the
last 5 outcomes) comes from editable template files in ``rudder/agent/prompts`` (version:
``PROMPT_VERSION``, logged with every run). The answer is constrained by a GBNF grammar to exactly
``{"decision": "evict"|"keep", "explanation": TEXT, "expected_impact": {"hitrate": D,
"comm_volume": D}}`` and then parsed and validated; anything else (an exception, an unparseable
answer) becomes the configured fallback decision with its code and reason logged, never an
error. The model runs in-process or behind an OpenAI-compatible server (``llm_backends``).
"""
from __future__ import annotations

import json
import os

from rudder.agent.deciders.base import Decider, TrainerContext, register_decider
from rudder.agent.deciders.llm_backends import DecisionCutOff, InProcessModel, ServerModel, probe_server, resolve_model
from rudder.agent.protocol import EVICT, HELLO_FIELDS, IMPACTS, KEEP, WINDOW_METRICS, Decision

# 2: the trainer's statistics moved to the end of the system prompt, so the rules (the same for
# every trainer) stay in the model's prefix cache between trainers (SmolLM2-135M, 1 thread: mean
# latency 3.1 -> 2.7 s here; the answer's own ~70 tokens are most of the rest).
PROMPT_VERSION = 2
PROMPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "prompts")
GRAMMAR = "\n".join([
    "",
    r'root ::= "{" ws "\"decision\":" ws decision "," ws "\"explanation\":" ws text "," ws '
    r'"\"expected_impact\":" ws "{" ws "\"hitrate\":" ws impact "," ws "\"comm_volume\":" ws impact ws "}" ws "}"',
    r'decision ::= "\"evict\"" | "\"keep\""',
    r'impact ::= "\"increase\"" | "\"decrease\"" | "\"stagnant\""',
    r'text ::= "\"" [a-zA-Z0-9 .,;:!?%()+=-]{0,120} "\""',
    r'ws ::= " "?',
    "",
])
# The same format as a JSON schema, for servers that take OpenAI's response_format.
SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["decision", "explanation", "expected_impact"],
    "properties": {
        "decision": {"type": "string", "enum": ["evict", "keep"]},
        "explanation": {"type": "string", "maxLength": 120},
        "expected_impact": {"type": "object", "additionalProperties": False, "required": ["hitrate", "comm_volume"],
                            "properties": {"hitrate": {"type": "string", "enum": list(IMPACTS)},
                                           "comm_volume": {"type": "string", "enum": list(IMPACTS)}}},
    },
}


def history_lines(ctx: TrainerContext) -> str:
    if not ctx.history:
        return "No past evictions."
    lines = []
    for h in ctx.history:
        hr, comm = h["hitrate_delta"], h["comm_delta"]
        change = f"HR {hr:+.1f} percent points, comm_volume {comm:+.1f}"
        lines.append({"triggered": f"You decided eviction: {h['evicted']} nodes evicted. Since then: {change}.",
                      "skipped": "You decided eviction, but it was skipped: no eviction candidates found.",
                      "decision_no_evict": f"You decided no eviction. Since then: {change}."}[h["status"]])
    return "\n".join(lines)


def fallback_code(e: Exception) -> str:
    """Why a decision fell back (rudder.logs.schema.FALLBACKS), from what went wrong."""
    if isinstance(e, DecisionCutOff):
        return e.code
    if isinstance(e, ConnectionError):
        return "unavailable"
    if isinstance(e, (ValueError, KeyError, TypeError)):  # json.JSONDecodeError is a ValueError
        return "invalid_answer"
    return "error"


def parse_answer(text: str) -> Decision:
    """The model's JSON answer as a Decision; raises ValueError when it is not one."""
    d = json.loads(text)
    impact = d["expected_impact"]
    if (d["decision"] not in ("evict", "keep") or impact["hitrate"] not in IMPACTS or impact["comm_volume"] not in IMPACTS
            or not isinstance(d["explanation"], str)):
        raise ValueError(f"unexpected values in {text[:200]!r}")
    return Decision(EVICT if d["decision"] == "evict" else KEEP, impact["hitrate"], impact["comm_volume"],
                    str(d["explanation"]), raw=text)


@register_decider("llm")
class LLM(Decider):
    prompt_version = PROMPT_VERSION
    def __init__(self, cfg, threads: int = 1):
        super().__init__(cfg)
        seed = cfg.training.seed
        self.model = (ServerModel(cfg.llm, seed, GRAMMAR, SCHEMA) if cfg.llm.url
                      else InProcessModel(cfg.llm, seed, threads, GRAMMAR))
        with open(os.path.join(PROMPTS, "system.txt")) as f:
            self.system = f.read()
        with open(os.path.join(PROMPTS, "user.txt")) as f:
            self.user = f.read()
        self.fallback = EVICT if cfg.llm.fallback == "evict" else KEEP
        self.warm_up = self.decide(TrainerContext(  # as the reference does: the first answer is the slow one
            dict.fromkeys(HELLO_FIELDS[1:], 0), {**dict.fromkeys(("counter", "epoch", "step", "remaining"), 0),
                                                 **dict.fromkeys(WINDOW_METRICS, 0.0)}))

    @classmethod
    def check_inputs(cls, cfg, is_agent: bool) -> None:
        """The model file on every rank; a server only from the agent ranks, which will use it
        (it may serve its own node only)."""
        if not cfg.llm.url:
            resolve_model(cfg.llm.model)
        elif is_agent:
            probe_server(cfg.llm.url)

    def prompt(self, ctx: TrainerContext) -> tuple[str, str]:
        facts = {k: int(v) for k, v in ctx.facts.items()}
        latest = {k: (int(v) if k in ("epoch", "step", "counter", "remaining") else v) for k, v in ctx.latest.items()}
        return self.system.format(**facts), self.user.format(**latest, history=history_lines(ctx))

    def decide(self, ctx: TrainerContext) -> Decision:
        system, user = self.prompt(ctx)
        text = ""
        try:
            text = self.model.complete([{"role": "system", "content": system}, {"role": "user", "content": user}],
                                       ctx.abandoned)
            d = parse_answer(text)
        except Exception as e:  # a bad answer, a failed call, a timeout: the fallback, logged
            d = Decision(self.fallback, raw=text).fell_back(fallback_code(e), f"{type(e).__name__}: {str(e)[:200]}")
        d.prompt = system + "\n\n" + user
        return d

    def close(self) -> None:
        self.model.close()
