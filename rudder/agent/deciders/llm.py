"""The ``llm`` decision maker: a small instruct model, in context, decides evict or keep, or with
``--agent-action structured`` how much to refill (``rudder.agent.action``).

The prompt (system: the run's static facts and the rules; user: the latest window and the
last 5 outcomes) comes from editable template files in ``rudder/agent/prompts`` (version:
``PROMPT_VERSION``, logged with every run). The answer is constrained by a GBNF grammar to exactly
``{"decision": "evict"|"keep", "hitrate": D, "comm": D[, "why": TEXT]}`` (D one of up, down,
flat; the reason optional and at most 48 characters) and then parsed and validated; anything else (an exception, an unparseable
answer) becomes the configured fallback decision with its code and reason logged, never an
error. The model runs in-process or behind an OpenAI-compatible server (``llm_backends``).

Where a decision's time goes (llama.cpp's counters, SmolLM2-135M, one thread): the system prompt
is evaluated once, then reused as the cached prefix of every request (llama-cpp-python keeps the
longest common token prefix of consecutive prompts; the chat template puts the system message
first, so it is common to all trainers); each request evaluates its user part and generates its
answer, and on one core a prompt token costs nearly what a generated one does: so both are kept short.

The structured answer is ``{"refill":P[,"window":W],"hr":D,"comm":D,"wait":D[,"why":"TEXT"]}``
(no spaces, short keys: every answer token is a forward pass of its own): P, the budget in percent
of the buffer's capacity (the grammar allows 0..100, and the rows are round(P x capacity / 100):
the grammar cannot know each trainer's capacity, a percentage it can bound exactly), W the
lookahead window, 0..the run's limit, asked only where the buffer looks ahead, then the predicted
directions of hit rate, communication volume (rows) and the trainer's input wait; the reason only
with ``--llm-reason-chars`` N > 0, at most N characters. Its prompts are ``system_action.txt`` and
``user_action.txt``: the user part, the only one evaluated per request (the system prompt is the
same for every trainer, the cached prefix), is the window's figures alone, rounded (digits are a
token each), and the format they come in is explained once in the system prompt.
"""
from __future__ import annotations

import json
import os

from rudder.agent.action import Action, ActionLimits, share_limit, window_limit
from rudder.agent.deciders.base import Decider, TrainerContext, blank_context, register_decider
from rudder.agent.deciders.llm_backends import DecisionCutOff, InProcessModel, ServerModel, probe_server, resolve_model
from rudder.agent.protocol import EVICT, KEEP, Decision

# 2: the trainer's statistics moved to the end of the system prompt, so the rules (the same for
# every trainer) stay in the model's prefix cache between trainers.
# 3: a compact answer, decision first, its reason optional and capped; the trainer's statistics in
# the user message, so the whole system prompt is one cached prefix (docs/results-agent.md).
# 4: the structured answer in short keys without spaces and with the predicted wait direction, its
# reason off by default (--llm-reason-chars); its user part the figures alone, rounded, their format
# explained in the cached system prompt: 80-165 prompt tokens evaluated per request instead of
# 240-260, 19 answer tokens instead of 28. The paper mode's prompts and answer are version 3's,
# unchanged (it reproduces the published system).
# 5: the window's sentence says what a window costs and saves (a longer one fetches fewer rows or as
# many; a shorter one saves the buffer's CPU only) and which to choose: told only "more sees
# further ahead", the default model chose windows 0-3 in most answers (docs/results-agent.md).
PROMPT_VERSION = 5
PROMPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "prompts")
# The answer's words for a predicted direction, and what they mean (rudder.agent.protocol.IMPACTS)
DIRECTIONS = {"up": "increase", "down": "decrease", "flat": "stagnant"}
REASON_CHARS = 48
GRAMMAR = "\n".join([
    "",
    r'root ::= "{\"decision\": " decision ", \"hitrate\": " direction ", \"comm\": " direction why? "}"',
    r'decision ::= "\"evict\"" | "\"keep\""',
    r'direction ::= "\"up\"" | "\"down\"" | "\"flat\""',
    r'why ::= ", \"why\": \"" [a-zA-Z0-9 .,;:!?%()+=-]{0,' + str(REASON_CHARS) + r'} "\""',
    "",
])
# The same format as a JSON schema, for servers that take OpenAI's response_format.
SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["decision", "hitrate", "comm"],
    "properties": {
        "decision": {"type": "string", "enum": ["evict", "keep"]},
        "hitrate": {"type": "string", "enum": list(DIRECTIONS)},
        "comm": {"type": "string", "enum": list(DIRECTIONS)},
        "why": {"type": "string", "maxLength": REASON_CHARS},
    },
}


def action_format(window: int, reason_chars: int = 0, share: bool = False) -> tuple[str, dict]:
    """(GBNF grammar, JSON schema) of the structured answer; ``window``: the largest window (0: not
    asked); ``reason_chars``: the longest reason (0: none asked); ``share``: a claim on a split node
    buffer asked, in percent (``SHARE_SCALE``)."""
    windows = " | ".join(f'"{w}"' for w in range(window + 1))
    grammar = "\n".join([
        "",
        r'root ::= "{\"refill\":" percent' + (r' ",\"window\":" window' if window else "")
        + (r' ",\"share\":" percent' if share else "")
        + r' ",\"hr\":" direction ",\"comm\":" direction ",\"wait\":" direction' + (" why?" if reason_chars else "")
        + r' "}"',
        r'percent ::= "100" | [1-9] [0-9] | [0-9]',
        *([f"window ::= {windows}"] if window else []),
        r'direction ::= "\"up\"" | "\"down\"" | "\"flat\""',
        *([r'why ::= ",\"why\":\"" [a-zA-Z0-9 .,;:!?%()+=-]{0,' + str(reason_chars) + r'} "\""'] if reason_chars
          else []),
        "",
    ])
    direction = SCHEMA["properties"]["hitrate"]
    properties = {"refill": {"type": "integer", "minimum": 0, "maximum": 100},
                  **({"window": {"type": "integer", "minimum": 0, "maximum": window}} if window else {}),
                  **({"share": {"type": "integer", "minimum": 0, "maximum": 100}} if share else {}),
                  "hr": direction, "comm": direction, "wait": direction,
                  **({"why": {"type": "string", "maxLength": reason_chars}} if reason_chars else {})}
    schema = {"type": "object", "additionalProperties": False, "properties": properties,
              "required": ["refill", *(["window"] if window else []), *(["share"] if share else []), "hr", "comm",
                           "wait"]}
    return grammar, schema


def parse_action(text: str, limits: ActionLimits, reason_chars: int = 0) -> Decision:
    """The structured JSON answer as a Decision with its action; raises ValueError when it is not
    one. A budget beyond 100% or a window beyond the limit parses: validating it is the service's
    ("out_of_range")."""
    d = json.loads(text)
    if not isinstance(d, dict):
        raise ValueError(f"not a JSON object: {text[:200]!r}")
    keys = ({"refill", "hr", "comm", "wait"} | ({"window"} if limits.window else set())
            | ({"share"} if limits.share else set()) | ({"why"} if reason_chars else set()))
    why, percent, window = d.get("why", ""), d.get("refill"), d.get("window", limits.window)
    share = d.get("share", 100)
    if (set(d) - keys or not all(isinstance(v, int) and not isinstance(v, bool) for v in (percent, window, share))
            or any(d[k] not in DIRECTIONS for k in ("hr", "comm", "wait")) or not isinstance(why, str)
            or len(why) > reason_chars):
        raise ValueError(f"unexpected values in {text[:200]!r}")
    action = Action.budget(round(percent * limits.refill / 100), window, round(share * limits.share / 100))
    return Decision(EVICT if action.evict else KEEP, DIRECTIONS[d["hr"]], DIRECTIONS[d["comm"]], why, raw=text,
                    action=action, wait_impact=DIRECTIONS[d["wait"]])


def history_lines(ctx: TrainerContext) -> str:
    if not ctx.history:
        return "No past evictions."
    lines = []
    for h in ctx.history:
        hr, comm = h["hitrate_delta"], h["comm_delta"]
        change = f"HR {hr:+.1f} percent points, comm_volume {comm:+.1f}"
        lines.append({"triggered": f"You decided eviction: {h['evicted']} nodes evicted. Since then: {change}.",
                      "skipped": "You decided eviction, but it was skipped: no eviction candidates found.",
                      "decision_no_evict": f"You decided no eviction. Since then: {change}.",
                      "not_applied": "Your decision came too late or out of range and was not applied."}[h["status"]])
    return "\n".join(lines)


def refill_lines(ctx: TrainerContext) -> str:
    """The structured prompt's history: one short line per outcome (``user_action.txt``'s format,
    explained in ``system_action.txt``)."""
    if not ctx.history:
        return "no refills yet"
    lines = []
    for h in ctx.history:
        change = f"HR {h['hitrate_delta']:+.1f} comm {h['comm_delta']:+.1f} wait {1e3 * h.get('wait_delta', 0.0):+.1f} ms"
        lines.append({"triggered": f"refill {h['evicted']}: {change}", "skipped": "no cold slots",
                      "decision_no_evict": f"refill 0: {change}", "not_applied": "not applied"}[h["status"]])
    return "\n".join(lines)


def conversation(system: str, user: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


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
    why = d.get("why", "")
    if (not isinstance(d, dict) or set(d) - {"decision", "hitrate", "comm", "why"} or d["decision"] not in ("evict", "keep")
            or d["hitrate"] not in DIRECTIONS or d["comm"] not in DIRECTIONS or not isinstance(why, str)
            or len(why) > REASON_CHARS):
        raise ValueError(f"unexpected values in {text[:200]!r}")
    return Decision(EVICT if d["decision"] == "evict" else KEEP, DIRECTIONS[d["hitrate"]], DIRECTIONS[d["comm"]], why,
                    raw=text)


@register_decider("llm")
class LLM(Decider):
    prompt_version = PROMPT_VERSION
    def __init__(self, cfg, threads: int = 1):
        super().__init__(cfg)
        seed = cfg.training.seed
        self.structured, self.window = cfg.agent.action == "structured", window_limit(cfg)
        self.reason_chars = cfg.llm.reason_chars
        self.share = share_limit(cfg) > 0
        grammar, schema = (action_format(self.window, self.reason_chars, self.share) if self.structured
                           else (GRAMMAR, SCHEMA))
        self.model = (ServerModel(cfg.llm, seed, grammar, schema) if cfg.llm.url
                      else InProcessModel(cfg.llm, seed, threads, grammar))
        names = ("system_action.txt", "user_action.txt") if self.structured else ("system.txt", "user.txt")
        with open(os.path.join(PROMPTS, names[0])) as f:
            self.system = f.read()
        if self.structured and self.window:
            self.system += (f'Also choose "window", after the refill: how many upcoming minibatches (0 to {self.window}) '
                            f'the cache ranks its rows by. A longer window keeps the rows needed soonest, so it fetches '
                            f'fewer rows or as many; a shorter one only saves the cache some CPU, which is worth it only '
                            f'when the trainer hardly waits. Choose {self.window} unless the wait is near 0%.\n')
        if self.structured and self.share:
            self.system += ('Also choose "share", after those: how much of the node\'s shared cache this trainer '
                            'claims, 0 to 100 against the other trainers\' claims; more misses, a larger claim.\n')
        if self.structured and self.reason_chars:
            self.system += (f'Then, last, a very short reason: "why":"at most {self.reason_chars} characters".\n')
        with open(os.path.join(PROMPTS, names[1])) as f:
            self.user = f.read()
        self.fallback = EVICT if cfg.llm.fallback == "evict" else KEEP
        self.warm_up = self.decide(blank_context())  # as the reference does: the first answer is the slow one

    @classmethod
    def check_inputs(cls, cfg, is_agent: bool) -> None:
        """The model file on every rank; a server only from the agent ranks, which will use it
        (it may serve its own node only)."""
        if not cfg.llm.url:
            resolve_model(cfg.llm.model)
        elif is_agent:
            probe_server(cfg.llm.url)

    def prompt(self, ctx: TrainerContext) -> tuple[str, str]:
        """(system, user): the system prompt is the same for every request (one cached prefix)."""
        facts = {k: int(v) for k, v in ctx.facts.items()}
        latest = {k: (int(v) if k in ("epoch", "step", "counter", "remaining") else v) for k, v in ctx.latest.items()}
        latest["bandwidth_mb"] = latest.get("bandwidth", 0.0) / 1e6
        if self.structured:
            latest["wait_percent"], latest["refill_ms"] = 100 * latest["wait_share"], 1e3 * latest["refill_seconds"]
            return self.system, self.user.format(**facts, **latest, history=refill_lines(ctx))
        return self.system, self.user.format(**facts, **latest, history=history_lines(ctx))

    def decide(self, ctx: TrainerContext) -> Decision:
        system, user = self.prompt(ctx)
        try:
            answer = self.model.complete(conversation(system, user), ctx.abandoned)
        except Exception as e:  # a failed call, a timeout: the fallback, logged
            answer = e
        return self._decision(answer, ctx, system, user)

    def decide_all(self, contexts: list[TrainerContext]) -> list[Decision]:
        """A pass's decisions in one batched model call where the backend has one (in-process:
        ``BatchedDecoder``); a failure of the call falls back for each trainer, with its reason."""
        if len(contexts) < 2 or not hasattr(self.model, "complete_all"):
            return super().decide_all(contexts)
        prompts = [self.prompt(ctx) for ctx in contexts]
        try:
            answers = self.model.complete_all([conversation(*p) for p in prompts], [c.abandoned for c in contexts])
        except Exception as e:
            answers = [e] * len(contexts)
        return [self._decision(a, ctx, *p) for a, ctx, p in zip(answers, contexts, prompts, strict=True)]

    def _decision(self, answer: str | Exception, ctx: TrainerContext, system: str, user: str) -> Decision:
        """The model's answer (or what stopped it) as a validated Decision, the fallback if it is none."""
        text = "" if isinstance(answer, Exception) else answer
        try:
            if isinstance(answer, Exception):
                raise answer
            d = (parse_action(text, ActionLimits.of(ctx.facts), self.reason_chars) if self.structured
                 else parse_answer(text))
        except Exception as e:  # a bad answer, a failed call, a timeout: the fallback, logged
            d = Decision(self.fallback, raw=text).fell_back(fallback_code(e), f"{type(e).__name__}: {str(e)[:200]}")
        d.prompt = system + "\n\n" + user
        return d

    def close(self) -> None:
        self.model.close()
