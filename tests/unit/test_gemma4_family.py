"""The Gemma 4 family's config side: the shipped 26B-A4B config is the release's text model (parameter
counts equal to what transformers counts for it, and to the model card's 25.2B total and 3.8B active),
its layer kinds are transformers', and its own checks are one sentence each."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from megatron_mtp.config import load_config
from megatron_mtp.config.validate import validate
from megatron_mtp.errors import UserError
from megatron_mtp.models.family import get_family

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "gemma4_tiny_cpu.yaml")
BIG = str(ROOT / "configs" / "gemma4_26b_a4b.yaml")
RELEASE_26B = {  # google/gemma-4-26B-A4B's text_config, the fields that shape the model
    "model_type": "gemma4_text", "vocab_size": 262144, "hidden_size": 2816, "intermediate_size": 2112,
    "num_hidden_layers": 30, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
    "global_head_dim": 512, "num_global_key_value_heads": 2, "attention_k_eq_v": True, "sliding_window": 1024,
    "final_logit_softcapping": 30.0, "enable_moe_block": True, "num_experts": 128, "top_k_experts": 8,
    "moe_intermediate_size": 704, "hidden_size_per_layer_input": 0, "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh",
}
ASSISTANT = ["mtp.style=assistant", "checkpoint.load=/a/target", "mtp.assistant.num_layers=2"]
"""An assistant run (mtp.freeze_base defaults to true for it)."""
TRAINING_ONLY = ("make_vocab_size_divisible_by", "aux_loss_type", "aux_loss_coeff", "init_method_std",
                 "router_bias_update_rate", "layer_types")


def test_shipped_config_is_the_release_and_counts_as_transformers_does():
    transformers = pytest.importorskip("transformers")
    import torch

    cfg = load_config(BIG)
    theirs, mtp, vocab = get_family("gemma4").from_hf_config(dict(RELEASE_26B))
    differ = [f.name for f in dataclasses.fields(cfg.model)
              if f.name not in TRAINING_ONLY and getattr(cfg.model, f.name) != getattr(theirs, f.name)]
    assert differ == [], [(k, getattr(cfg.model, k), getattr(theirs, k)) for k in differ]
    assert cfg.model.layer_kinds() == theirs.layer_kinds() and cfg.model.layer_kinds().count("full_attention") == 5
    with torch.device("meta"):
        model = transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**RELEASE_26B))
    total = sum(p.numel() for p in model.parameters())
    per_expert = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n) // 128  # all layers
    counts = get_family("gemma4").parameter_counts(dataclasses.replace(cfg, mtp=dataclasses.replace(
        cfg.mtp, num_layers=0)), vocab)
    assert counts["main"] == total  # 25,233,141,760: the model card's 25.2B
    assert counts["main_active"] == total - 120 * per_expert  # 3.82B: the card's 3.8B
    assert round(total / 1e9, 1) == 25.2 and round(counts["main_active"] / 1e9, 1) == 3.8


RELEASE_31B = {  # google/gemma-4-31B's text_config, the fields that shape the model
    "model_type": "gemma4_text", "vocab_size": 262144, "hidden_size": 5376, "intermediate_size": 21504,
    "num_hidden_layers": 60, "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 256,
    "global_head_dim": 512, "num_global_key_value_heads": 4, "attention_k_eq_v": True, "sliding_window": 1024,
    "final_logit_softcapping": 30.0, "enable_moe_block": False, "hidden_size_per_layer_input": 0,
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "hidden_activation": "gelu_pytorch_tanh",
}


def test_shipped_dense_config_is_the_31b_release_and_its_assistant_counts_as_transformers_does():
    """configs/gemma4_31b.yaml: the dense 31B's text model (30.70B as transformers counts it, the card's 30.7B), and
    the assistant it trains has the tensors transformers builds for its config.json (our export's)."""
    transformers = pytest.importorskip("transformers")
    import torch

    from megatron_mtp.models.gemma4.assistant.hf_config import assistant_hf_config

    cfg = load_config(str(ROOT / "configs" / "gemma4_31b.yaml"))
    theirs, _, vocab = get_family("gemma4").from_hf_config(dict(RELEASE_31B))
    differ = [f.name for f in dataclasses.fields(cfg.model)
              if f.name not in TRAINING_ONLY and getattr(cfg.model, f.name) != getattr(theirs, f.name)]
    assert differ == [], [(k, getattr(cfg.model, k), getattr(theirs, k)) for k in differ]
    with torch.device("meta"):
        model = transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**RELEASE_31B))
        raw = assistant_hf_config(cfg, vocab, "bfloat16")
        assistant = transformers.Gemma4AssistantForCausalLM(transformers.Gemma4AssistantConfig(
            text_config=raw["text_config"], backbone_hidden_size=raw["backbone_hidden_size"]))
    counts = get_family("gemma4").parameter_counts(dataclasses.replace(cfg, mtp=dataclasses.replace(
        cfg.mtp, num_layers=0)), vocab)
    assert counts["main"] == sum(p.numel() for p in model.parameters()) and round(counts["main"] / 1e9, 1) == 30.7
    drafter = get_family("gemma4").style_part("assistant")
    ours = {t.hf[0] if len(t.hf) == 1 else t.hf: t.shape for t in drafter.tensors(cfg, vocab)}
    state = {n: tuple(t.shape) for n, t in assistant.state_dict().items() if n != "lm_head.weight"}
    fused = {k: v for k, v in ours.items() if isinstance(k, tuple)}  # fc1: gate and up, stacked
    assert {k: v for k, v in ours.items() if isinstance(k, str)} == {k: v for k, v in state.items()
                                                                      if k not in {n for f in fused for n in f}}
    assert all(v == (sum(state[n][0] for n in k), *state[k[0]][1:]) for k, v in fused.items())


def test_layer_kinds_are_transformers():
    transformers = pytest.importorskip("transformers")
    for layers in (1, 4, 6, 7, 12, 30):
        cfg = load_config(TINY, [f"model.num_layers={layers}", "model.layer_types=null"])
        assert cfg.model.layer_kinds() == transformers.Gemma4TextConfig(num_hidden_layers=layers).layer_types


@pytest.mark.parametrize(("overrides", "sentence"), [
    (["model.layer_types=[sliding_attention,full_attention]"], "lists 2 layers but model.num_layers is 4"),
    (["model.layer_types=[full_attention,full_attention,full_attention,sliding_attention]"],
     "ends with sliding_attention; Gemma 4's last layer is full_attention"),
    (["model.layer_types=[global,full_attention,full_attention,full_attention]"], "holds 'global'"),
    (["model.global_query_groups=3"], "model.global_query_groups=3 must be positive and divide"),
    (["parallel.tensor=4", "parallel.world_size=4"], "query_groups=2 is not divisible by parallel.tensor=4"),
    (["model.num_shared_experts=1"], "model.num_shared_experts is 1, but a Gemma 4 model needs 0"),
    (["model.router_score_function=sigmoid"], "needs 'softmax'"),
    (["model.global_partial_rotary_factor=0"], "must be in (0, 1]"),
    (["data.reset_position_ids=true"], "data.reset_position_ids is not built for model.family=gemma4"),
    (["kernels.chunked_output_loss=true"], "does not soft-cap logits"),
    # megatron-core's overlapped MoE schedule would run its own callables, not Gemma 4's layer
    (["parallel.moe_a2a_overlap=true", "mtp.num_layers=0", "training.precision=bf16", "parallel.expert=2",
      "parallel.world_size=2"], "parallel.moe_a2a_overlap does not work with model.family=gemma4"),
    # the sliding layers' context parallelism (Transformer Engine's all-to-all) splits the heads
    (["parallel.context=4", "parallel.world_size=4", "mtp.num_layers=0", "training.seq_length=128"],
     "a tensor-parallel rank holds 4 query and 2 key/value heads"),
    # a separate drafter (mtp.style assistant)
    (["mtp.style=assistant"], "mtp.freeze_base trains only the MTP modules of an existing model and needs a model "
                              "to start from"),
    ([*ASSISTANT, "mtp.freeze_base=false"], "mtp.freeze_base=false does not work with mtp.style=assistant"),
    ([*ASSISTANT, "mtp.assistant.layer_types=[full_attention,sliding_attention]"],
     "mtp.assistant.layer_types ends with sliding_attention; an assistant's last layer is full_attention"),
    ([*ASSISTANT, "model.tie_embeddings=false", "parallel.pipeline=2", "parallel.world_size=2"],
     "an assistant with parallel.pipeline > 1 needs model.tie_embeddings=true"),
    ([*ASSISTANT, "mtp.assistant.layer_types=[full_attention]"], "lists 1 layers but mtp.assistant.num_layers"),
    ([*ASSISTANT, "mtp.assistant.step_weights=[1.0,0.5]"], "must hold mtp.num_layers=1 weights"),
    ([*ASSISTANT, "mtp.assistant.num_attention_heads=3"], "must be a multiple of the target's sliding_attention"),
    ([*ASSISTANT, "model.layer_types=[full_attention,full_attention,full_attention,full_attention]"],
     "the target (model.layer_types) has none"),
    ([*ASSISTANT, "parallel.pipeline=2", "parallel.virtual_pipeline=2", "parallel.world_size=2"],
     "reads the keys and values of decoder layer 2, which the pipeline places away from the last stage"),
    ([*ASSISTANT, "parallel.context=2", "parallel.world_size=2"], "does not work with mtp.style=assistant"),
])
def test_gemma4_checks_are_one_sentence(overrides, sentence):
    from megatron_mtp.errors import is_one_sentence
    from megatron_mtp.platform import Platform
    from megatron_mtp.platform.features import resolve_features

    with pytest.raises(UserError, match=sentence.replace("(", r"\(").replace(")", r"\)")) as caught:
        cfg = load_config(TINY, overrides)
        validate(cfg)
        resolve_features(cfg, Platform(device="cpu", backend="gloo", use_te=False))
    assert is_one_sentence(str(caught.value)), str(caught.value)


def test_plan_refuses_the_overlapped_moe_schedule_for_gemma4(capsys):
    """megatron-core's overlapped schedule would drive the layer through its own callables (Gemma 4's feed-forward
    taken for a dense MLP, its layer_scalar skipped): plan refuses it as train and submit do, in validation."""
    from megatron_mtp.cli import main

    argv = ["plan", BIG, "parallel.moe_a2a_overlap=true", "mtp.num_layers=0", "parallel.pipeline=1", "--nodes", "1",
            "--gpus-per-node", "8", "--gpu", "h200"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "parallel.moe_a2a_overlap does not work with model.family=gemma4" in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not get_family("gemma4").supports_a2a_overlap and get_family("qwen3_moe").supports_a2a_overlap


def test_an_assistant_trains_on_a_frozen_target_without_saying_so():
    """mtp.freeze_base defaults to true for an assistant (and stays false for the other styles)."""
    cfg = load_config(TINY, ASSISTANT)
    validate(cfg)
    assert cfg.mtp.freeze_base is True and load_config(TINY).mtp.freeze_base is False
    assert load_config(TINY, ["mtp.style=parallel"]).mtp.freeze_base is False


def test_decode_cost_counts_what_sliding_layers_keep():
    """plan --speculative's KV reads and attention FLOPs per token: the 26B-A4B's 25 sliding layers keep 1,024
    tokens (8 key and 8 value heads of 256), its 5 full layers every token (2 heads of 512, keys that are values)."""
    family, cfg = get_family("gemma4"), load_config(BIG)
    assert family.kv_cache_elements_per_token(cfg, 1024) == (25 * 4096 + 5 * 1024) / 30
    assert family.kv_cache_elements_per_token(cfg, 65536) == round((25 * 4096 / 64 + 5 * 1024) / 30)
    short, long = (family.decode_attention_flops(cfg, c) for c in (1024, 65536))
    assert short == (25 * 4 * 16 * 256 * 1024 + 5 * 4 * 16 * 512 * 1024) / 30
    assert long == (25 * 4 * 16 * 256 * 1024 + 5 * 4 * 16 * 512 * 65536) / 30


def test_balanced_kmeans_partitions_the_table_into_equal_clusters_of_similar_rows():
    """An assistant's centroid partition (models/gemma4/assistant/centroids.py): every token once, every cluster
    the same size, the same partition from the same table, and rows of a cluster more alike than at random."""
    import torch

    from megatron_mtp.models.gemma4.assistant.centroids import balanced_kmeans, cluster_of

    table = torch.randn(1024, 32, generator=torch.Generator().manual_seed(0))
    ordering = balanced_kmeans(table, 16)
    assert sorted(ordering.tolist()) == list(range(1024)) and torch.equal(ordering, balanced_kmeans(table, 16))
    clusters = cluster_of(ordering, 64)
    assert torch.bincount(clusters).tolist() == [64] * 16
    assert torch.equal(clusters[ordering[64:128]], torch.ones(64, dtype=torch.long))  # run c of the ordering is c
    rows = torch.nn.functional.normalize(table, dim=1)

    def coherence(assign):
        return sum((rows[assign == c] @ rows[assign == c].t()).mean().item() for c in range(16)) / 16

    assert coherence(clusters) > 3 * coherence(torch.randperm(1024, generator=torch.Generator().manual_seed(1)) // 64)
