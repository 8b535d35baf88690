"""Test helpers: tiny random DeepSeek-V3, GLM-4.5 and Qwen3-MoE exports (main/ + mtp/, inline, plain) and a
perfect draft.

The main model is transformers' ``DeepseekV3ForCausalLM``, ``Glm4MoeForCausalLM`` or ``Qwen3MoeForCausalLM``
(random init, fp32, ``save_pretrained``); the MTP weights are random tensors written with safetensors under
the HF names ``model.layers.{L+i}.*`` (enorm, hnorm, eh_proj, shared_head.*, embed_tokens, decoder layer),
or the family's own MTP names (Qwen3-MoE: ``mtp.*``).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import torch
from safetensors.torch import save_file

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * i)\n",
    "The quick brown fox jumps over the lazy dog.",
    "class Node:\n    def __init__(self, value):\n        self.value = value\n        self.next = None\n",
    "import os\nimport sys\n\nif __name__ == '__main__':\n    sys.exit(main())\n",
    "while x < 100:\n    x = x * 2 + 1\n",
] * 4


def tiny_config(vocab: int = 320, layers: int = 2, rope: str = "yarn", interleave: bool = True,
                q_lora: int | None = 32, init_std: float = 0.08, experts: int = 8, mtp_depth: int = 0):
    from transformers import DeepseekV3Config

    rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
    if rope == "yarn":
        rope_parameters = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                           "original_max_position_embeddings": 128, "beta_fast": 32, "beta_slow": 1,
                           "mscale": 1.0, "mscale_all_dim": 1.0}
    return DeepseekV3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=q_lora,
        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        first_k_dense_replace=1, n_routed_experts=experts, num_experts_per_tok=2, n_group=2, topk_group=1,
        n_shared_experts=1, rope_parameters=rope_parameters, rope_interleave=interleave,
        max_position_embeddings=512, initializer_range=init_std, num_nextn_predict_layers=mtp_depth,
        bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
    )


def tiny_glm_config(vocab: int = 320, layers: int = 2, qk_norm: bool = True, bias: bool = True,
                    partial_rotary_factor: float = 0.5, init_std: float = 0.08, experts: int = 8, mtp_depth: int = 0):
    """A tiny GLM-4.5: GQA (4 query heads in 2 groups, head_dim 16), partial RoPE, 1 dense + MoE layers."""
    from transformers import Glm4MoeConfig

    return Glm4MoeConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        use_qk_norm=qk_norm, attention_bias=bias, first_k_dense_replace=1, n_routed_experts=experts,
        num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1, routed_scaling_factor=1.5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": partial_rotary_factor},
        max_position_embeddings=512, initializer_range=init_std, num_nextn_predict_layers=mtp_depth,
        bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
    )


def tiny_qwen3_config(vocab: int = 320, layers: int = 2, init_std: float = 0.08, experts: int = 8,
                      mtp_depth: int = 0, norm_topk_prob: bool = True):
    """A tiny Qwen3-MoE: GQA (4 query heads in 2 groups, head_dim 16) with q/k norms and full RoPE, softmax
    top-2 routing of 8 experts without shared experts, every layer MoE."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        num_experts=experts, num_experts_per_tok=2, norm_topk_prob=norm_topk_prob, decoder_sparse_step=1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, max_position_embeddings=512,
        initializer_range=init_std, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False,
    )


def tiny_dsa_config(family: str, vocab: int = 320, layers: int = 3, init_std: float = 0.08, mtp_depth: int = 0,
                    index_topk: int = 4):
    """A tiny DSA model: DeepSeek-V3's tiny MLA (q-LoRA) with a lightning indexer of 16 heads of 16 that keeps
    ``index_topk`` keys per query, 1 dense + MoE layers; DeepSeek-V3.2 with YaRN and two routing groups, GLM-5 with
    one group and IndexShare (layers full, shared, full). rms_norm_eps 1e-6: transformers' latent norms take
    1e-6 whatever it says (GLM-5's serving note). 16 indexer heads, not 4: with 4, a key whose every head's ReLU is 0
    (1 in 16) scores exactly 0, and transformers' topk breaks such ties differently in its full and incremental
    forwards (0.05 apart in the logits)."""
    import transformers

    own = (dict(n_group=2, topk_group=1, rope_parameters=tiny_config().rope_parameters)
           if family == "deepseek_v32" else
           dict(n_group=1, topk_group=1, index_topk_freq=2, index_skip_topk_offset=1,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))
    config_class = {"deepseek_v32": "DeepseekV32Config", "glm_moe_dsa": "GlmMoeDsaConfig"}[family]
    return getattr(transformers, config_class)(
        vocab_size=vocab, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16,
        qk_rope_head_dim=8, v_head_dim=16, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=1, routed_scaling_factor=2.5, index_n_heads=16, index_head_dim=16, index_topk=index_topk,
        rms_norm_eps=1e-6, max_position_embeddings=512, initializer_range=init_std,
        num_nextn_predict_layers=mtp_depth, bos_token_id=0, eos_token_id=1, tie_word_embeddings=False, **own)


FAMILIES = {"deepseek_v3": (tiny_config, "DeepseekV3ForCausalLM"), "glm4_moe": (tiny_glm_config, "Glm4MoeForCausalLM"),
            "qwen3_moe": (tiny_qwen3_config, "Qwen3MoeForCausalLM"),
            "deepseek_v32": (partial(tiny_dsa_config, "deepseek_v32"), "DeepseekV32ForCausalLM"),
            "glm_moe_dsa": (partial(tiny_dsa_config, "glm_moe_dsa"), "GlmMoeDsaForCausalLM")}
"""family -> (tiny config builder, transformers model class name)."""


def hf_model_class(family: str):
    import transformers

    return getattr(transformers, FAMILIES[family][1])


def train_tokenizer(vocab: int, out_file: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(out_file))


def mtp_tensors(
    main_state: dict[str, torch.Tensor], config, depth: int, seed: int, std: float
) -> dict[str, torch.Tensor]:
    """Random MTP weights named ``model.layers.{L+i}.*`` (embed/head copied from the main model)."""
    gen = torch.Generator().manual_seed(seed)
    h, layers = config.hidden_size, config.num_hidden_layers
    template_layer = layers - 1  # an MoE layer of the main model gives the decoder-layer shapes
    out: dict[str, torch.Tensor] = {}
    for i in range(depth):
        p = f"model.layers.{layers + i}."
        for name, tensor in main_state.items():
            prefix = f"model.layers.{template_layer}."
            if name.startswith(prefix):
                rest = name[len(prefix):]
                if rest.endswith("norm.weight"):
                    out[p + rest] = 1.0 + 0.1 * torch.randn(tensor.shape, generator=gen)
                elif rest.endswith("e_score_correction_bias"):
                    out[p + rest] = torch.zeros(tensor.shape)
                else:
                    out[p + rest] = std * torch.randn(tensor.shape, generator=gen)
        out[p + "enorm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=gen)
        out[p + "hnorm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=gen)
        out[p + "eh_proj.weight"] = std * torch.randn(h, 2 * h, generator=gen)
        out[p + "shared_head.norm.weight"] = 1.0 + 0.1 * torch.randn(h, generator=gen)
        out[p + "shared_head.head.weight"] = main_state["lm_head.weight"].clone()
        out[p + "embed_tokens.weight"] = main_state["model.embed_tokens.weight"].clone()
    return {k: v.contiguous() for k, v in out.items()}


def _family_names(mtp: dict[str, torch.Tensor], family: str, num_layers: int) -> dict[str, torch.Tensor]:
    """The MTP tensors under the family's export names (Qwen3-MoE: SGLang's ``mtp.*``; the copies of the
    embedding and head are not written, the decoder shares the main model's)."""
    from megatron_mtp.models.family import get_family

    rename = get_family(family).table.mtp_names
    return {rename(k, num_layers): v for k, v in mtp.items() if rename(k, num_layers) is not None}


def _write_index(directory: Path, files: dict[str, list[str]]) -> None:
    weight_map = {name: file for file, names in files.items() for name in names}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _randomize_norms_and_biases(model, seed: int) -> None:
    """transformers initialises norms to 1 and biases to 0; random values make the tests see them."""
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn(param.shape, generator=gen))
            elif name.endswith(".bias"):
                param.copy_(0.2 * torch.randn(param.shape, generator=gen))


_OUTPUT_PROJECTIONS = ("o_proj.weight", "down_proj.weight", "experts.down_proj")


def _near_bigram_mtp(mtp: dict[str, torch.Tensor], main_state: dict[str, torch.Tensor], hidden: int,
                     scale: float) -> None:
    """The MTP side of ``near_bigram`` (make_tiny_export): each module keeps its random weights, output
    projections shrunk by ``scale`` like the main model's, but reads mainly the embedding of the token it
    is given (eh_proj ~ [I, 0], enorm 1, shared_head.norm = model.norm): it predicts roughly that token's
    bigram successor, which the target, mostly a bigram map itself, often but not always agrees with."""
    for name in list(mtp):
        if name.endswith(_OUTPUT_PROJECTIONS):
            mtp[name] = mtp[name] * scale
    for name in [n for n in mtp if n.endswith("eh_proj.weight")]:
        mtp[name] = mtp[name] + torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1)
        prefix = name[: -len("eh_proj.weight")]
        mtp[prefix + "enorm.weight"] = torch.ones(hidden)
        mtp[prefix + "shared_head.norm.weight"] = main_state["model.norm.weight"].clone()


def make_tiny_export(root: Path, layout: str = "separate", mtp_depth: int = 1, seed: int = 0,
                     mtp_std: float = 0.08, family: str = "deepseek_v3", near_bigram: float | None = None,
                     **config_kwargs) -> Path:
    """Write a tiny export of ``family`` (FAMILIES); layout is 'separate' (main/ + mtp/), 'inline' or 'plain'.
    ``near_bigram``: shrink every layer's output projections by this factor, so the next token depends mostly
    on the current one, and give the MTP modules the matching shape (_near_bigram_mtp): drafts are then
    partly accepted, as on a trained model; None: fully random weights (acceptance near 0).
    Returns root."""
    torch.manual_seed(seed)
    config = FAMILIES[family][0](mtp_depth=0, **config_kwargs)
    model = hf_model_class(family)(config).eval()
    if family in ("glm4_moe", "qwen3_moe", "deepseek_v32", "glm_moe_dsa"):
        _randomize_norms_and_biases(model, seed)
    if near_bigram is not None:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.startswith("model.layers.") and name.endswith(_OUTPUT_PROJECTIONS):
                    param.mul_(near_bigram)
    main_dir = root / "main" if layout == "separate" else root
    main_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(main_dir)
    train_tokenizer(config.vocab_size, main_dir / "tokenizer.json")
    if layout == "plain":
        return root
    from safetensors.torch import load_file

    main_state: dict[str, torch.Tensor] = {}
    for file in main_dir.glob("*.safetensors"):
        main_state.update(load_file(str(file)))
    extra = mtp_tensors(main_state, config, mtp_depth, seed + 1, mtp_std)
    if near_bigram is not None:
        _near_bigram_mtp(extra, main_state, config.hidden_size, near_bigram)
    extra = _family_names(extra, family, config.num_hidden_layers)
    if layout == "separate":
        mtp_dir = root / "mtp"
        mtp_dir.mkdir(parents=True, exist_ok=True)
        save_file(extra, str(mtp_dir / "model.safetensors"))
        _write_index(mtp_dir, {"model.safetensors": sorted(extra)})
        mtp_config = json.loads((main_dir / "config.json").read_text())
        mtp_config["num_nextn_predict_layers"] = mtp_depth
        (mtp_dir / "config.json").write_text(json.dumps(mtp_config, indent=2))
    else:  # inline: the official layout, MTP layers beside the main ones
        save_file(extra, str(main_dir / "model-mtp.safetensors"))
        cfg = json.loads((main_dir / "config.json").read_text())
        cfg["num_nextn_predict_layers"] = mtp_depth
        (main_dir / "config.json").write_text(json.dumps(cfg, indent=2))
        index_file = main_dir / "model.safetensors.index.json"
        if index_file.exists():
            index = json.loads(index_file.read_text())
            index["weight_map"].update({k: "model-mtp.safetensors" for k in extra})
            index_file.write_text(json.dumps(index))
        else:  # two shards and their index (transformers reads a lone model.safetensors before any index)
            (main_dir / "model.safetensors").rename(main_dir / "model-main.safetensors")
            _write_index(main_dir, {"model-main.safetensors": sorted(main_state),
                                    "model-mtp.safetensors": sorted(extra)})
    return root


class TargetAsDraft:
    """A perfect draft (the ``draft.Drafter`` protocol): a second copy of the target, with a cache slot per
    sequence, drafts by running the target itself."""

    def __init__(self, target) -> None:
        import copy

        self.model = copy.deepcopy(target)

    def shape(self, logits):
        """The draft logits made from the target's (here: the target's own)."""
        return logits

    def reset(self, slots: int = 1) -> None:
        self.model.reset_cache(slots)

    def clear_slot(self, slot: int) -> None:
        self.model.truncate_cache(0, slot)

    def observe_rows(self, slots, hiddens, starts) -> None:
        pass

    def propose_rows(self, slots, seqs, ks, picks):
        feeds = []
        for slot, seq in zip(slots, seqs):
            self.model.truncate_cache(min(self.model.slot_length(slot), len(seq) - 1), slot)
            feeds.append(seq[self.model.slot_length(slot):])
        drafts = [[] for _ in slots]
        dists = [[] for _ in slots]
        for j in range(1, max(ks, default=0) + 1):
            live = [i for i, k in enumerate(ks) if k >= j]
            logits, _ = self.model.forward_rows([slots[i] for i in live], [feeds[i] for i in live], last_only=True)
            for r, i in enumerate(live):
                token, dist = picks[i](self.shape(logits[r]))
                drafts[i].append(token)
                dists[i].append(dist)
                feeds[i] = [token]
        return drafts, dists

    def rollback_rows(self, slots, committed) -> None:
        for slot, n in zip(slots, committed):
            self.model.truncate_cache(min(self.model.slot_length(slot), n - 1), slot)


class NoisyTargetDraft(TargetAsDraft):
    """A good-but-imperfect draft: the target's logits, flattened and shifted by a fixed random bias,
    so q overlaps p without equalling it (many acceptances AND many rejections)."""

    def __init__(self, target, seed: int = 0, scale: float = 0.8, noise: float = 0.3) -> None:
        super().__init__(target)
        gen = torch.Generator().manual_seed(seed)
        self.bias = noise * torch.randn(target.config.vocab_size, generator=gen)
        self.scale = scale

    def shape(self, logits):
        return logits * self.scale + self.bias
