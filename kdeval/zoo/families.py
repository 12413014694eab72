"""The decoder families of transformers the engine is proven on, each as a tiny random config: the family table.

One :class:`Family` per row: the name people call it, transformers' ``model_type`` and the keyword arguments of
a config small enough to build and run in well under a second (hidden 64, 4 query heads over 2 KV heads of width
16, MLP 128, 2 layers, a few small experts for MoE). A hybrid family gets the layers it needs to hold both of its
kinds and a window of :data:`WINDOW` tokens, so that a prompt of a few hundred tokens runs past it.

Each family loads as the random model ``random:<key>-tiny`` (kdeval/zoo/random_models.py), so the table is
what the tests build, what ``kdeval models`` lists and what a grid can name. What the engine does with a family
(runs, windowed layers kept whole, refused and why) is never written here: kdeval/zoo/family_status.py
computes it from the engine's own checks.

Pure data: this module imports neither torch nor transformers (grids are validated without them).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: the window (sliding) or attention chunk (Llama 4) of the hybrid families' windowed layers, in tokens
WINDOW = 48
#: every family's context: far longer than :data:`WINDOW`, and no shorter than the original context some families'
#: default RoPE scaling names
CONTEXT = 8192

#: the shape every family starts from (a family's own keywords replace these)
BASE: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, max_position_embeddings=CONTEXT,
)
#: a family's keyword set to this drops that key of :data:`BASE` (the config's own default then applies)
DROP = "<drop>"
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
_LOCAL_MOE = dict(num_local_experts=4, num_experts_per_tok=2)
#: DeepSeek-style routed experts (a dense first layer, one expert group)
_DEEPSEEK_MOE = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=1,
                     n_group=1, topk_group=1)
_SLIDING, _FULL, _LINEAR_T = "sliding_attention", "full_attention", "linear_attention"
#: a gated DeltaNet layer's (Qwen3.5, Qwen3-Next, OLMo Hybrid) heads: 2 key heads over 2 value heads of width 16
_LINEAR = dict(linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
               linear_num_value_heads=2)
#: a Mamba2 mixer's (Granite 4.0-H, Bamba, Falcon-H1): 4 heads of width 16, state 16, scan chunks of one B
_MAMBA2 = dict(mamba_n_heads=4, mamba_d_head=16, mamba_d_state=16, mamba_chunk_size=16, mamba_expand=1)


@dataclass(frozen=True)
class Family:
    """One decoder family: ``name`` as people say it, ``key`` (its random model is ``random:<key>-tiny``),
    transformers' ``model_type`` and the config keywords on top of :data:`BASE` (:data:`DROP`: leave that key of
    :data:`BASE` out)."""

    name: str
    key: str
    model_type: str
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def random_kind(self) -> str:
        """Its name among the random models (``random:`` + this)."""
        return f"{self.key}-tiny"

    def kwargs(self) -> dict[str, Any]:
        """The config's keywords: :data:`BASE` with this family's own on top, ``model_type`` included."""
        out = {**BASE, **self.config, "model_type": self.model_type}
        return {k: v for k, v in out.items() if v != DROP}


FAMILIES: tuple[Family, ...] = (
    # ---- every layer full attention
    # the suite's own models (random:llama-tiny, random:qwen2-tiny): 3 layers, wider; GQA 4:1 and 2:1
    Family("Llama", "llama", "llama", dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                                           num_attention_heads=8, max_position_embeddings=4096)),
    Family("Mistral", "mistral", "mistral", dict(sliding_window=None)),
    Family("Qwen2", "qwen2", "qwen2", dict(hidden_size=128, intermediate_size=256, num_hidden_layers=3, head_dim=DROP,
                                           max_position_embeddings=4096)),
    Family("Qwen3", "qwen3", "qwen3"),
    Family("Qwen3-MoE", "qwen3-moe", "qwen3_moe", _MOE),
    Family("Qwen2-MoE", "qwen2-moe", "qwen2_moe", dict(_MOE, shared_expert_intermediate_size=64)),
    Family("Mixtral", "mixtral", "mixtral", dict(_LOCAL_MOE, sliding_window=None)),
    Family("Phi-3", "phi3", "phi3"),
    Family("Phi", "phi", "phi", dict(head_dim=DROP)),
    Family("Gemma", "gemma", "gemma"),
    Family("OLMo", "olmo", "olmo"),
    Family("OLMo 2", "olmo2", "olmo2"),
    Family("OLMoE", "olmoe", "olmoe", dict(num_experts=4, num_experts_per_tok=2)),
    Family("Granite", "granite", "granite"),
    Family("Granite MoE", "granitemoe", "granitemoe", _LOCAL_MOE),
    Family("Cohere", "cohere", "cohere"),
    Family("StarCoder2", "starcoder2", "starcoder2", dict(sliding_window=None)),
    Family("GPT-NeoX", "gpt-neox", "gpt_neox", dict(head_dim=DROP, num_key_value_heads=DROP)),
    Family("SmolLM3", "smollm3", "smollm3"),
    Family("GLM", "glm", "glm"),
    Family("GLM-4", "glm4", "glm4"),
    Family("Seed-OSS", "seed-oss", "seed_oss"),
    Family("Hunyuan (dense)", "hunyuan", "hunyuan_v1_dense"),
    Family("Arcee", "arcee", "arcee"),
    Family("ERNIE 4.5", "ernie4.5", "ernie4_5"),
    Family("Apertus", "apertus", "apertus", dict(max_position_embeddings=65536)),  # its llama3 RoPE scales 8K
    Family("Helium", "helium", "helium"),
    Family("Nemotron", "nemotron", "nemotron"),
    Family("StableLM", "stablelm", "stablelm", dict(head_dim=DROP)),
    Family("Falcon", "falcon", "falcon", dict(head_dim=DROP, num_key_value_heads=DROP, new_decoder_architecture=True,
                                              num_kv_heads=2)),
    Family("MiniMax-M2", "minimax-m2", "minimax_m2", _LOCAL_MOE),
    Family("GLM-4-MoE", "glm4-moe", "glm4_moe", _DEEPSEEK_MOE),
    Family("Hunyuan-MoE", "hunyuan-moe", "hunyuan_v1_moe", dict(num_experts=4, moe_topk=2)),
    Family("ERNIE 4.5 MoE", "ernie4.5-moe", "ernie4_5_moe", dict(moe_num_experts=4, moe_k=2, moe_intermediate_size=32)),
    Family("dots.llm1", "dots1", "dots1", dict(_DEEPSEEK_MOE, n_shared_experts=1, sliding_window=None)),
    # ---- hybrids: sliding-window (or chunked) layers beside full ones
    Family("Gemma 2", "gemma2", "gemma2", dict(sliding_window=WINDOW, query_pre_attn_scalar=16)),
    Family("Gemma 3", "gemma3", "gemma3_text", dict(sliding_window=WINDOW, query_pre_attn_scalar=16,
                                                     num_hidden_layers=3, layer_types=[_SLIDING, _SLIDING, _FULL])),
    Family("Cohere 2", "cohere2", "cohere2", dict(sliding_window=WINDOW, num_hidden_layers=3,
                                                  layer_types=[_SLIDING, _SLIDING, _FULL])),
    Family("EXAONE 4", "exaone4", "exaone4", dict(sliding_window=WINDOW, num_hidden_layers=3,
                                                  layer_types=[_SLIDING, _SLIDING, _FULL])),
    Family("OLMo 3", "olmo3", "olmo3", dict(sliding_window=WINDOW, num_hidden_layers=3,
                                            layer_types=[_SLIDING, _SLIDING, _FULL])),
    Family("GPT-OSS", "gpt-oss", "gpt_oss", dict(_LOCAL_MOE, sliding_window=WINDOW,
                                                 max_position_embeddings=131072)),  # its YaRN scales 4K by 32
    Family("Mistral (sliding window)", "mistral-sliding", "mistral", dict(sliding_window=WINDOW)),
    Family("Ministral", "ministral", "ministral", dict(sliding_window=WINDOW, layer_types=[_SLIDING, _FULL])),
    Family("Qwen2 (sliding window)", "qwen2-sliding", "qwen2", dict(use_sliding_window=True, sliding_window=WINDOW,
                                                                        max_window_layers=1)),
    Family("Llama 4 (chunked attention)", "llama4", "llama4_text", dict(
        attention_chunk_size=WINDOW, intermediate_size_mlp=128, num_local_experts=2, num_experts_per_tok=1,
        layer_types=["chunked_attention", _FULL], no_rope_layers=[1, 0])),
    # ---- recurrent hybrids: linear-attention, Mamba or short-conv layers (their states kept whole) beside
    # full-attention ones; the states' own sizes are as small as each layer allows
    Family("Qwen3.5", "qwen3.5", "qwen3_5_text", dict(_LINEAR, num_hidden_layers=3,
                                                      layer_types=[_LINEAR_T, _LINEAR_T, _FULL])),
    Family("Qwen3.5 MoE", "qwen3.5-moe", "qwen3_5_moe_text", dict(
        **_LINEAR, **_MOE, shared_expert_intermediate_size=32, num_hidden_layers=2, layer_types=[_LINEAR_T, _FULL])),
    Family("Qwen3-Next", "qwen3-next", "qwen3_next", dict(
        **_LINEAR, **_MOE, shared_expert_intermediate_size=32, num_hidden_layers=2, layer_types=[_LINEAR_T, _FULL])),
    Family("OLMo Hybrid", "olmo-hybrid", "olmo_hybrid", dict(_LINEAR, num_hidden_layers=2,
                                                             layer_types=[_LINEAR_T, _FULL])),
    Family("LFM2", "lfm2", "lfm2", dict(head_dim=DROP, num_hidden_layers=2, layer_types=["conv", _FULL])),
    Family("Granite 4.0-H", "granite4-h", "granitemoehybrid", dict(
        **_MAMBA2, **_LOCAL_MOE, shared_intermediate_size=64, head_dim=DROP, num_hidden_layers=2,
        layer_types=["mamba", "attention"])),
    Family("Bamba", "bamba", "bamba", dict(_MAMBA2, head_dim=DROP, num_hidden_layers=2, attn_layer_indices=[1])),
    Family("Nemotron-H", "nemotron-h", "nemotron_h", dict(
        mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=16, n_groups=1, chunk_size=16, use_mamba_kernels=False,
        num_hidden_layers=3, layers_block_type=["mamba", "mlp", "attention"])),
    Family("Jamba", "jamba", "jamba", dict(
        num_hidden_layers=2, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
        num_experts=4, num_experts_per_tok=2, mamba_d_state=8, use_mamba_kernels=False, head_dim=DROP)),
    Family("MiniMax-Text-01", "minimax-text-01", "minimax", dict(
        **_LOCAL_MOE, num_hidden_layers=2, layer_types=["linear_attention", _FULL], block_size=16)),
    # ---- attention and a Mamba block side by side in one layer (the attention evicted, the state kept)
    Family("Falcon-H1", "falcon-h1", "falcon_h1", dict(_MAMBA2, mamba_d_ssm=64)),
    Family("Zamba2", "zamba2", "zamba2", dict(
        n_mamba_heads=4, mamba_d_state=16, chunk_size=16, use_mamba_kernels=False, head_dim=DROP, num_hidden_layers=2,
        layers_block_type=["mamba", "hybrid"])),
    # ---- the last layers read an earlier layer's keys and values (KV sharing)
    Family("Gemma 4", "gemma4", "gemma4_text", dict(
        sliding_window=WINDOW, num_hidden_layers=4, layer_types=[_SLIDING, _FULL, _SLIDING, _FULL],
        num_kv_shared_layers=2, hidden_size_per_layer_input=16)),
    Family("Gemma 3n", "gemma3n", "gemma3n_text", dict(
        sliding_window=WINDOW, num_hidden_layers=4, layer_types=[_SLIDING, _FULL, _SLIDING, _FULL],
        num_kv_shared_layers=2, hidden_size_per_layer_input=16, intermediate_size=[128] * 4,
        activation_sparsity_pattern=[0.0] * 4, laurel_rank=8)),
    # ---- multi-head latent attention
    Family("DeepSeek-V3", "deepseek-v3", "deepseek_v3", dict(
        kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, n_group=1, topk_group=1, first_k_dense_replace=1,
        head_dim=DROP, num_key_value_heads=4)),
    # LongCat-Flash: two attention sublayers per decoder layer (num_layers=1 holds num_hidden_layers=2 caches);
    # head_dim is its rotary width
    Family("LongCat-Flash", "longcat-flash", "longcat_flash", dict(
        kv_lora_rank=32, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, head_dim=8,
        n_routed_experts=4, moe_topk=2, zero_expert_num=2, expert_ffn_hidden_size=32, ffn_hidden_size=128,
        num_key_value_heads=4, num_layers=1)),
    # Kimi Linear: KDA (linear-attention) layers beside MLA full-attention ones
    Family("Kimi Linear", "kimi-linear", "kimi_linear", dict(
        num_hidden_layers=2, layer_types=[_LINEAR_T, _FULL], linear_head_dim=16, linear_num_heads=4, kv_lora_rank=32,
        q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, num_local_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, head_dim=DROP, num_key_value_heads=4,
        first_k_dense_replace=1)),
    # ---- sparse attention: an indexer key per token beside the K/V (or the MLA latent)
    Family("DeepSeek-V3.2", "deepseek-v3.2", "deepseek_v32", dict(num_hidden_layers=2)),
    Family("GLM-5", "glm5", "glm_moe_dsa", dict(num_hidden_layers=2)),
    Family("Qwen4-Exp", "qwen4-exp", "qwen4_exp_text", dict(num_hidden_layers=4)),
    Family("DeepSeek-V2", "deepseek-v2", "deepseek_v2", dict(
        kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, n_group=1, topk_group=1, first_k_dense_replace=1,
        head_dim=DROP, num_key_value_heads=4)),
)

_BY_KEY = {f.key: f for f in FAMILIES}


def family(key: str) -> Family:
    """The family ``key`` (``KeyError`` naming the known keys otherwise)."""
    if key not in _BY_KEY:
        raise KeyError(f"family: unknown '{key}'; expected one of {sorted(_BY_KEY)}")
    return _BY_KEY[key]
