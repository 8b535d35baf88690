"""Grouped-query attention, the piece the GQA families share (GLM-4.5 in models/glm4_moe/, Qwen3-MoE in
models/qwen3_moe/): its model fields and checks (model_config.py), its tensor rules (hf_mapping.py),
sizes (sizes.py), megatron-core config and model (transformer_config.py, model.py), the config.json
fields every such family reads and writes (hf_view.py, hf_config.py) and the ``Family`` assembly
(family.py). A family folder keeps only what is its own: routing, MoE layer rule, MTP naming, refusals."""
