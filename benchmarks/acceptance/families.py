"""The transformers families the acceptance scripts build: each as (config class, model class, fields).

``FAMILIES``: small widths (hidden 512), the structure of the published family. ``PUBLISHED``: the
widths of a published checkpoint (its config.json on the Hugging Face hub, named beside each).
sequence_models.py and predict_models.py both import them from here.
"""

# name -> (config class, model class, fields): small widths (2 layers, hidden 512, vocab 32000), the
# structure of the published family; three with experts (run with transformers' grouped_mm experts).
FAMILIES = {
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", dict(
        hidden_size=512, intermediate_size=2048, num_attention_heads=8, num_key_value_heads=2)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(
        hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=8)),
    "cohere": ("CohereConfig", "CohereForCausalLM", dict(
        hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=2)),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", dict(
        hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=8)),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(
        hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=2, pad_token_id=0)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=2, head_dim=64)),
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(
        hidden_size=512, intermediate_size=1536, num_attention_heads=8, num_key_value_heads=2)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        hidden_size=512, intermediate_size=1536, moe_intermediate_size=256, shared_expert_intermediate_size=512,
        num_experts=16, num_experts_per_tok=4, num_attention_heads=8, num_key_value_heads=2, decoder_sparse_step=1,
        mlp_only_layers=[])),
    "ernie4_5_moe": ("Ernie4_5_MoeConfig", "Ernie4_5_MoeForCausalLM", dict(
        hidden_size=512, intermediate_size=1536, moe_intermediate_size=256, moe_num_experts=16, moe_k=4,
        moe_num_shared_experts=1, moe_layer_start_index=0, num_attention_heads=8, num_key_value_heads=2)),
    "flex_olmo": ("FlexOlmoConfig", "FlexOlmoForCausalLM", dict(
        hidden_size=512, intermediate_size=512, num_experts=8, num_experts_per_tok=2, num_attention_heads=8,
        num_key_value_heads=8, pad_token_id=0)),
}
COMMON = dict(num_hidden_layers=2, vocab_size=32000)
# --widths published: twelve families at the widths of a published checkpoint (its config.json on the
# Hugging Face hub, named beside each), cut to 2 layers; five with experts. Attention: SDPA, except
# where a family keeps a feature SDPA drops (Gemma-2's soft-capped attention logits, GPT-OSS's sinks).
PUBLISHED = {
    # meta-llama/Llama-3.1-8B
    "llama3_8b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=128256, rope_theta=500000.0)),
    # mistralai/Mistral-7B-v0.3
    "mistral_7b": ("MistralConfig", "MistralForCausalLM", dict(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=32768, sliding_window=None)),
    # Qwen/Qwen2.5-7B: biases on q, k, v
    "qwen2_7b": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
        vocab_size=152064)),
    # microsoft/Phi-3-mini-4k-instruct: fused qkv_proj and gate_up_proj
    "phi3_mini": ("Phi3Config", "Phi3ForCausalLM", dict(
        hidden_size=3072, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=32,
        vocab_size=32064, pad_token_id=0)),
    # THUDM/glm-4-9b-chat-hf: rotary over half of each head, 2 KV heads
    "glm4_9b": ("GlmConfig", "GlmForCausalLM", dict(
        hidden_size=4096, intermediate_size=13696, num_attention_heads=32, num_key_value_heads=2, head_dim=128,
        partial_rotary_factor=0.5, attention_bias=True, vocab_size=151552, pad_token_id=0)),
    # bigcode/starcoder2-7b: LayerNorm with biases, a GELU MLP
    "starcoder2_7b": ("Starcoder2Config", "Starcoder2ForCausalLM", dict(
        hidden_size=4608, intermediate_size=18432, num_attention_heads=36, num_key_value_heads=4,
        vocab_size=49152, use_bias=True)),
    # google/gemma-2-9b: soft-capped logits (eager attention keeps the attention cap)
    "gemma2_9b": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        hidden_size=3584, intermediate_size=14336, num_attention_heads=16, num_key_value_heads=8, head_dim=256,
        vocab_size=256000, query_pre_attn_scalar=256, final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
        sliding_window=4096, pad_token_id=0)),
    # mistralai/Mixtral-8x7B-v0.1: 8 experts, top 2
    "mixtral_8x7b": ("MixtralConfig", "MixtralForCausalLM", dict(
        hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
        num_local_experts=8, num_experts_per_tok=2, vocab_size=32000)),
    # Qwen/Qwen3-30B-A3B: 128 experts of 768, top 8
    "qwen3_30b_a3b": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8, vocab_size=151936,
        decoder_sparse_step=1, mlp_only_layers=[])),
    # allenai/OLMoE-1B-7B-0924: 64 experts of 1024, top 8, q/k norms
    "olmoe_1b_7b": ("OlmoeConfig", "OlmoeForCausalLM", dict(
        hidden_size=2048, intermediate_size=1024, num_attention_heads=16, num_key_value_heads=16,
        num_experts=64, num_experts_per_tok=8, vocab_size=50304, pad_token_id=1)),
    # microsoft/Phi-3.5-MoE-instruct: 16 experts of 6400, top 2
    "phimoe": ("PhimoeConfig", "PhimoeForCausalLM", dict(
        hidden_size=4096, intermediate_size=6400, num_attention_heads=32, num_key_value_heads=8,
        num_local_experts=16, num_experts_per_tok=2, vocab_size=32064, pad_token_id=0)),
    # google/gemma-7b: GeGLU, head_dim 256, a 256000-token vocabulary (an LM head of 1.6 TFLOP at 1024 tokens)
    "gemma_7b": ("GemmaConfig", "GemmaForCausalLM", dict(
        hidden_size=3072, intermediate_size=24576, num_attention_heads=16, num_key_value_heads=16, head_dim=256,
        vocab_size=256000, pad_token_id=0)),
    # tiiuae/falcon-7b: LayerNorm, one key/value head, attention and MLP side by side
    "falcon_7b": ("FalconConfig", "FalconForCausalLM", dict(
        hidden_size=4544, num_attention_heads=71, vocab_size=65024, multi_query=True, parallel_attn=True,
        new_decoder_architecture=False, bias=False, alibi=False)),
    # microsoft/phi-2: LayerNorm with biases, rotary over 40% of each head, a GELU MLP
    "phi2": ("PhiConfig", "PhiForCausalLM", dict(
        hidden_size=2560, intermediate_size=10240, num_attention_heads=32, num_key_value_heads=32,
        vocab_size=51200, partial_rotary_factor=0.4)),
    # stabilityai/stablelm-2-1_6b: LayerNorm, biases on q, k, v, rotary over a quarter of each head
    "stablelm2_1_6b": ("StableLmConfig", "StableLmForCausalLM", dict(
        hidden_size=2048, intermediate_size=5632, num_attention_heads=32, num_key_value_heads=32,
        vocab_size=100352, partial_rotary_factor=0.25, use_qkv_bias=True)),
    # openai/gpt-oss-20b: attention sinks (eager attention), 32 experts with biases, top 4, bf16 (no MXFP4)
    "gpt_oss_20b": ("GptOssConfig", "GptOssForCausalLM", dict(
        hidden_size=2880, intermediate_size=2880, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
        num_local_experts=32, num_experts_per_tok=4, vocab_size=201088, sliding_window=128,
        layer_types=["sliding_attention", "full_attention"], pad_token_id=0)),
}
MOE = ("qwen2_moe", "ernie4_5_moe", "flex_olmo", "mixtral_8x7b", "qwen3_30b_a3b", "olmoe_1b_7b", "phimoe",
       "gpt_oss_20b")
EAGER = ("gemma2_9b", "gpt_oss_20b")
LAYERNORM = ("starcoder2", "cohere", "stablelm", "starcoder2_7b", "falcon_7b", "phi2", "stablelm2_1_6b")
# The acceptance's families (issue 68): at least 4 with experts, 3 with LayerNorm, 2 no test builds.
ACCEPTANCE = ("llama3_8b", "qwen2_7b", "glm4_9b", "gemma_7b", "starcoder2_7b", "falcon_7b", "phi2", "stablelm2_1_6b",
              "mixtral_8x7b", "qwen3_30b_a3b", "olmoe_1b_7b", "phimoe")
# The what-if's model: multi-head attention (the memory-efficient kernel takes no grouped heads), a
# width where a long prompt's attention is a large part of the step.
WHAT_IF = ("LlamaConfig", "LlamaForCausalLM", dict(
    hidden_size=1024, intermediate_size=2048, num_attention_heads=16, num_key_value_heads=16, head_dim=64,
    num_hidden_layers=2, vocab_size=32000, max_position_embeddings=16384))
# Issue 74's families no test or table of ours had named before (published widths, each with its checkpoint).
PUBLISHED.update({
    # EleutherAI/pythia-6.9b: LayerNorm with biases, a GELU MLP beside the attention, rotary over a quarter
    "pythia_6_9b": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        hidden_size=4096, intermediate_size=16384, num_attention_heads=32, rotary_pct=0.25, vocab_size=50432,
        use_parallel_residual=True, hidden_act="gelu", max_position_embeddings=2048)),
    # nvidia/Minitron-8B-Base (Nemotron): LayerNorm1P, a squared-ReLU MLP, 48 heads of 128, 8 KV heads
    "minitron_8b": ("NemotronConfig", "NemotronForCausalLM", dict(
        hidden_size=4096, intermediate_size=16384, num_attention_heads=48, num_key_value_heads=8, head_dim=128,
        partial_rotary_factor=0.5, vocab_size=256000, max_position_embeddings=4096)),
    # deepseek-ai/DeepSeek-V2-Lite: multi-head latent attention, 64 experts of 1408, top 6, 2 shared; layer 0 dense
    "deepseek_v2_lite": ("DeepseekV2Config", "DeepseekV2ForCausalLM", dict(
        hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408, num_attention_heads=16,
        num_key_value_heads=16, n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6,
        first_k_dense_replace=1, kv_lora_rank=512, q_lora_rank=None, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, vocab_size=102400, n_group=1, topk_group=1, topk_method="greedy", norm_topk_prob=False)),
    # ibm-granite/granite-3.0-3b-a800m-base: 40 experts of 512, top 8, scaled embeddings and logits
    "granitemoe_3b": ("GraniteMoeConfig", "GraniteMoeForCausalLM", dict(
        hidden_size=1536, intermediate_size=512, num_attention_heads=24, num_key_value_heads=8,
        num_local_experts=40, num_experts_per_tok=8, vocab_size=49155, embedding_multiplier=12.0,
        logits_scaling=6.0, residual_multiplier=0.22, attention_multiplier=0.015625, tie_word_embeddings=True)),
})
MOE += ("deepseek_v2_lite", "granitemoe_3b")
# Issue 75's families no test or table of ours had named before (published widths, each with its checkpoint).
PUBLISHED.update({
    # arcee-ai/AFM-4.5B: a squared-ReLU MLP without a gate, 20 heads of 128, 4 KV heads
    "afm_4_5b": ("ArceeConfig", "ArceeForCausalLM", dict(
        hidden_size=2560, intermediate_size=18432, num_attention_heads=20, num_key_value_heads=4, head_dim=128,
        vocab_size=128004, hidden_act="relu2", bos_token_id=0, eos_token_id=1)),
    # allenai/Olmo-3-1025-7B: three sliding-window (4096) layers to one full, q/k norms
    "olmo3_7b": ("Olmo3Config", "Olmo3ForCausalLM", dict(
        hidden_size=4096, intermediate_size=11008, num_attention_heads=32, num_key_value_heads=32,
        vocab_size=100278, sliding_window=4096, pad_token_id=0)),
    # zai-org/GLM-4.5-Air: 128 experts of 1408, top 8, a shared one, layer 0 dense, 96 heads, half-rotary
    "glm4_5_air": ("Glm4MoeConfig", "Glm4MoeForCausalLM", dict(
        hidden_size=4096, intermediate_size=10944, moe_intermediate_size=1408, num_attention_heads=96,
        num_key_value_heads=8, head_dim=128, n_routed_experts=128, n_shared_experts=1, num_experts_per_tok=8,
        first_k_dense_replace=1, partial_rotary_factor=0.5, attention_bias=True, vocab_size=151552,
        norm_topk_prob=True, n_group=1, topk_group=1, pad_token_id=0)),
})
MOE += ("glm4_5_air",)
