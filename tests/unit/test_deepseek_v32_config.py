"""DeepSeek-V3.2's run config (model.family deepseek_v32): its tiny config loads where megatron-core 0.19's DSA
modules are installed and is refused in one sentence naming 0.19 where they are not (0.16); its indexer
fields are checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_mtp.config import load_config
from megatron_mtp.config.validate import validate
from megatron_mtp.errors import UserError
from megatron_mtp.platform.megatron_core import is_019

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "deepseek_v32_tiny_cpu.yaml")


def test_the_tiny_config_needs_megatron_core_019():
    if is_019():
        cfg = load_config(CONFIG)
        validate(cfg, world_size=1)
        assert type(cfg.model).__name__ == "DeepseekV32ModelConfig"
        assert cfg.model.index_topk < cfg.training.seq_length  # the sparsity matters
    else:
        with pytest.raises(UserError, match=r"needs megatron-core 0\.19.*has megatron-core 0\.16"):
            validate(load_config(CONFIG), world_size=1)


@pytest.mark.skipif(not is_019(), reason="DeepSeek-V3.2 needs megatron-core 0.19's DSA modules")
@pytest.mark.parametrize("override, message", [
    ("model.index_head_dim=8", r"model.index_head_dim \(8\) is below model.qk_pos_emb_head_dim \(16\)"),
    ("model.index_topk=0", r"model.index_topk is 0; it must be positive"),
    ("model.q_lora_rank=null", r"model.q_lora_rank is null; DeepSeek-V3.2's indexer reads the query latent"),
    ("parallel.tensor=2", r"parallel.tensor 1 and parallel.context 1"),
])
def test_indexer_fields_are_checked(override, message):
    with pytest.raises(UserError, match=message):
        validate(load_config(CONFIG, [override]), world_size=2 if override.startswith("parallel") else 1)


def test_the_decoder_refuses_a_dsa_model_in_one_sentence():
    from megatron_mtp.models.family import get_family

    with pytest.raises(UserError, match=r"^the decoder has no DeepSeek Sparse Attention layer yet, so it cannot run "
                                        r"a DeepSeek-V3.2 model; serve the export with transformers"):
        get_family("deepseek_v32").decoder_layer()(None, 0)
