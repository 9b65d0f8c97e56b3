"""A tiny random-weight llama GGUF (about 0.5 MB), written with the ``gguf`` package (the test
extra): a real model file that llama-cpp-python loads and runs in milliseconds, to check the llm
decider's whole path without a real model (the tests, bench/agent.py, a cluster's smoke test).
Its answers are random: only the grammar makes them decisions."""
from __future__ import annotations

import numpy as np

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tiny_gguf(path: str, seed: int = 0) -> str:
    import gguf

    rng = np.random.default_rng(seed)
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581"]
    tokens += [chr(c) for c in range(33, 127)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL,
             gguf.TokenType.CONTROL] + [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (len(tokens) - 261)
    vocab, embd, blocks, ff, heads = len(tokens), 64, 2, 128, 4
    w = gguf.GGUFWriter(path, "llama")
    w.add_context_length(2048)
    w.add_embedding_length(embd)
    w.add_block_count(blocks)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_rope_dimension_count(embd // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * vocab)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(4)
    w.add_unk_token_id(0)
    w.add_chat_template(CHATML)

    def tensor(name, *shape, norm=False):
        w.add_tensor(name, np.ones(shape, np.float32) if norm else (rng.standard_normal(shape) * 0.02).astype(np.float32))

    tensor("token_embd.weight", vocab, embd)
    tensor("output_norm.weight", embd, norm=True)
    tensor("output.weight", vocab, embd)
    for b in range(blocks):
        tensor(f"blk.{b}.attn_norm.weight", embd, norm=True)
        for part in ("q", "k", "v", "output"):
            tensor(f"blk.{b}.attn_{part}.weight", embd, embd)
        tensor(f"blk.{b}.ffn_norm.weight", embd, norm=True)
        tensor(f"blk.{b}.ffn_gate.weight", ff, embd)
        tensor(f"blk.{b}.ffn_up.weight", ff, embd)
        tensor(f"blk.{b}.ffn_down.weight", embd, ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
