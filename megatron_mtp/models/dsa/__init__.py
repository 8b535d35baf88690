"""What the DeepSeek Sparse Attention families share (DeepSeek-V3.2 in models/deepseek_v32/, GLM-5 in
models/glm_moe_dsa/), over MLA's base (models/mla/): a base, not a family. The lightning indexer's model fields
and checks and which layers run it (model_config.py), megatron-core 0.19's DSA config and layer specs
(transformer_config.py, model.py), the tensor table with the indexer (hf_mapping.py), the config.json
fields and per-layer lists (hf_view.py) and the conversion both ways (hf_config.py), the sizes, FLOPs and
sparse attention's cost (sizes.py), the activation inventory (activations.py) and the refusing decoder layer
(decoder.py). A family folder keeps its defaults, its name and what only it has (GLM-5's IndexShare)."""

NEXTN_ARCHITECTURE = "DeepseekV3ForCausalLMNextN"
"""SGLang's one NextN class for DSA drafts (python/sglang/srt/configs/model_config.py maps DeepseekV32ForCausalLM and
GlmMoeDsaForCausalLM to it); it has no DeepseekV32ForCausalLMNextN or GlmMoeDsaForCausalLMNextN."""


def serving_notes(model_type: str) -> tuple[str, ...]:
    """What SERVING.md says of vLLM's and SGLang's DSA loaders (read from their source: convert/README.md,
    "Serving DeepSeek Sparse Attention")."""
    return (
        "As their main-branch source reads, vLLM and SGLang load the lightning indexer as "
        "`self_attn.indexer.{wq_b,wk,k_norm,weights_proj}` (k_norm a LayerNorm with its bias; vLLM fuses wk and "
        "weights_proj into one unquantised projection, SGLang keeps weights_proj in bf16, so an FP8 export keeps it "
        "bf16) and give the MTP layer an indexer of its own, which the export writes. Their indexer kernels take an "
        "index_head_dim of 128 only (FP8 keys, one scale per 128 values).",
        f"vLLM serves model_type {model_type} as `deepseek_mtp` for `--speculative-config` method `mtp`; SGLang "
        "loads the draft as DeepseekV3ForCausalLMNextN for `--speculative-algorithm NEXTN` (the commands below).",
    )
