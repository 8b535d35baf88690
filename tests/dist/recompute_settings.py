"""The recompute settings the multi-process tests try, as config overrides: one table for the
gradient check (test_recompute.py) and the saved-activation check (test_plan_activations.py)."""

SELECTIVE_MODULES = ("mla_up_proj", "core_attn", "layernorm", "mlp", "moe", "shared_experts")


def selective(*modules: str) -> list[str]:
    return ["recompute.granularity=selective", f"recompute.modules=[{','.join(modules)}]"]


RECOMPUTE = {
    "none": [],
    **{module: selective(module) for module in SELECTIVE_MODULES},
    "recipe": selective("mla_up_proj", "mlp"),  # NVIDIA's DeepSeek-V3 H100 recipe
    "all_selective": selective(*SELECTIVE_MODULES),
    "full_uniform": ["recompute.granularity=full", "recompute.method=uniform", "recompute.num_layers=1"],
    "full_block": ["recompute.granularity=full", "recompute.method=block", "recompute.num_layers=2"],
}
