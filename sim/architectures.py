"""Layer tables of the preset models, computed from their public Hugging Face configs.

A layer is a unit of persistence (LAYERCHECK.md): the token embedding, each
transformer block, the final norm, and the output head unless it is tied to
the embedding. A layer's checkpoint state is 14 bytes per parameter (bf16
weights 2 + fp32 master 4 + two fp32 Adam moments 8).
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Architecture", "ARCHITECTURES", "BYTES_PER_PARAM"]

BYTES_PER_PARAM = 14


@dataclass(frozen=True, kw_only=True)
class Architecture:
    """The config fields that decide parameter counts (names as in the HF config)."""

    hf_id: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    attention_bias: bool
    """Qwen2 has biases on q, k and v; Llama has none."""

    def block_params(self) -> int:
        h = self.hidden_size
        head_dim = h // self.num_attention_heads
        q, kv = self.num_attention_heads * head_dim, self.num_key_value_heads * head_dim
        attention = h * q + 2 * h * kv + q * h
        if self.attention_bias:
            attention += q + 2 * kv
        mlp = 3 * h * self.intermediate_size  # gate, up, down
        return attention + mlp + 2 * h         # + input and post-attention RMSNorm

    def layers(self) -> list[dict]:
        """Manifest layer rows in model order: name, kind, params, bytes."""
        h, v = self.hidden_size, self.vocab_size
        rows = [("embed_tokens", "embedding", v * h)]
        rows += [(f"layers.{i}", "block", self.block_params()) for i in range(self.num_hidden_layers)]
        rows.append(("norm", "norm", h))
        if not self.tie_word_embeddings:
            rows.append(("lm_head", "head", v * h))
        return [{"name": n, "kind": k, "params": p, "bytes": p * BYTES_PER_PARAM} for n, k, p in rows]

    def total_params(self) -> int:
        return sum(layer["params"] for layer in self.layers())


ARCHITECTURES: dict[str, Architecture] = {
    # https://huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json
    "qwen2.5-7b": Architecture(hf_id="Qwen/Qwen2.5-7B", hidden_size=3584, intermediate_size=18944,
                               num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                               vocab_size=152064, tie_word_embeddings=False, attention_bias=True),
    # https://huggingface.co/Qwen/Qwen2.5-3B/blob/main/config.json
    "qwen2.5-3b": Architecture(hf_id="Qwen/Qwen2.5-3B", hidden_size=2048, intermediate_size=11008,
                               num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                               vocab_size=151936, tie_word_embeddings=True, attention_bias=True),
    # https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json
    "llama-3.2-1b": Architecture(hf_id="meta-llama/Llama-3.2-1B", hidden_size=2048,
                                 intermediate_size=8192, num_hidden_layers=16,
                                 num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                 tie_word_embeddings=True, attention_bias=False),
}
