"""Checkpoint keys use Transformer Engine's spelling on every platform, and match the HF mapping table."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _sharded_keys() -> list[str]:
    code = textwrap.dedent(f"""
        import json
        from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
        from megatron.core.dist_checkpointing.dict_utils import nested_values
        from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group
        from megatron_mtp.config import load_config
        from megatron_mtp.platform import setup
        from megatron_mtp.training.distributed import init_distributed, destroy
        from megatron_mtp.models.deepseek_v3.transformer_config import build_transformer_config
        from megatron_mtp.models.deepseek_v3.model import build_model
        cfg = load_config("{ROOT / 'configs' / 'tiny_cpu.yaml'}", ["model.vocab_size=256", "mtp.num_layers=2"])
        plat = setup("cpu"); init_distributed(cfg, plat)
        model = build_model(cfg, build_transformer_config(cfg, plat), plat, 256, True, True)
        sd = model.sharded_state_dict(metadata=ensure_metadata_has_dp_cp_group({{}}))
        kinds = (ShardedTensor, ShardedTensorFactory)
        print(json.dumps(sorted({{v.key for v in nested_values(sd) if isinstance(v, kinds)}})))
        destroy()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_keys_use_te_spelling_and_match_the_mapping_table():
    from megatron_mtp.config import load_config
    from megatron_mtp.models.deepseek_v3.hf_mapping import param_table

    keys = set(_sharded_keys())
    assert not any("q_layernorm" in k or "kv_layernorm" in k for k in keys)
    assert "decoder.layers.0.mlp.linear_fc1.layer_norm_weight" in keys  # dense layer (first_k_dense=1)
    assert "decoder.layers.1.pre_mlp_layernorm.weight" in keys  # MoE layers keep a separate norm
    assert "mtp.layers.1.transformer_layer.self_attention.linear_q_up_proj.layer_norm_weight" in keys

    m = load_config(str(ROOT / "configs" / "tiny_cpu.yaml")).model
    table = {p.mcore for p in param_table(m, 2, spec="te", mtp_copies=False)}
    assert table <= keys, sorted(table - keys)
    # every model tensor is claimed by the table (nothing would be dropped on export)
    assert {k for k in keys if not k.endswith("_extra_state")} <= table | {
        k for k in keys if k.startswith("mtp.") and "embedding" in k}, sorted(keys - table)
