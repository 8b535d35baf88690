"""What the DeepSeek Sparse Attention families share (DeepSeek-V3.2 in models/deepseek_v32/, GLM-5 in
models/glm_moe_dsa/), over MLA's base (models/mla/): a base, not a family. The lightning indexer's model fields
and checks and which layers run it (model_fields.py), megatron-core 0.19's DSA config and layer specs
(transformer_config.py, model.py), the tensor table with the indexer (attention_table.py), the config.json
fields and per-layer lists (hf_view.py) and the conversion both ways (hf_config.py), the sizes, FLOPs and
sparse attention's cost (size.py), the activation inventory (activations.py) and the refusing decoder layer
(decoder.py). A family folder keeps its defaults, its name and what only it has (GLM-5's IndexShare)."""
