"""Gemma 4 (model.family gemma4) end to end, checked against transformers 5.25's Gemma4ForCausalLM: our
export loads there with our logits (fp32, 1e-4; sliding windows shorter than the sequence, keys reused as
values, the MoE block beside the dense MLP, soft-capped logits), `generate` decodes it with transformers'
logits and drafts with its MTP module as training computes it (speculative and batched greedy equal plain
greedy), a model transformers built imports with its logits and exports back to its own tensors, the same
model wrapped as the multimodal Gemma4ForConditionalGeneration imports to the same checkpoint (its vision
tower left out with a note), and what the format cannot hold is one sentence."""

from __future__ import annotations

import json

import pytest
import torch

from megatron_mtp.convert.from_hf import import_from_hf
from megatron_mtp.convert.to_hf import export_to_hf
from megatron_mtp.errors import UserError
from tests.convert.conftest import megatron_forward
from tests.convert.helpers import hf_tensors, megatron_cli

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.mcore

OVERRIDES = ["training.seq_length=32", "training.micro_batch_size=2", "training.global_batch_size=2",
             "logging.eval_interval=0", "logging.tensorboard=false", "checkpoint.save_interval=0",
             "model.sliding_window=5"]
TEXT = dict(vocab_size=4096, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
            attention_k_eq_v=True, sliding_window=5, final_logit_softcapping=30.0, enable_moe_block=True,
            num_experts=4, top_k_experts=2, moe_intermediate_size=32, hidden_size_per_layer_input=0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                "rope_theta": 1000000.0}})


@pytest.fixture(scope="module")
def gemma_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("gemma_run") / "run"
    megatron_cli("train", "configs/gemma4_tiny_cpu.yaml", "--run-dir", str(run_dir), "--max-steps", "3", *OVERRIDES)
    return run_dir


@pytest.fixture(scope="module")
def gemma_logits(gemma_run, tokens, tmp_path_factory):
    return megatron_forward(gemma_run, tokens, tmp_path_factory.mktemp("gemma_logits") / "out.pt")


@pytest.fixture(scope="module")
def gemma_export(gemma_run, tmp_path_factory):
    return export_to_hf(gemma_run, tmp_path_factory.mktemp("gemma_export") / "fp32", mtp="separate", dtype="fp32")


def _load(path):
    model, info = transformers.Gemma4ForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    return model.eval(), info


def test_export_loads_in_transformers_with_our_logits(gemma_export, gemma_logits, tokens):
    ours, export = gemma_logits, gemma_export
    model, info = _load(export / "main")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    cfg = json.loads((export / "main" / "config.json").read_text())
    assert cfg["architectures"] == ["Gemma4ForCausalLM"] and cfg["model_type"] == "gemma4_text"
    assert (cfg["head_dim"], cfg["global_head_dim"], cfg["num_global_key_value_heads"]) == (32, 64, 2)
    assert cfg["attention_k_eq_v"] is True and cfg["sliding_window"] == 5 and cfg["enable_moe_block"] is True
    names = set(json.loads((export / "main" / "model.safetensors.index.json").read_text())["weight_map"])
    assert "model.layers.1.self_attn.v_proj.weight" not in names and "model.layers.0.self_attn.v_proj.weight" in names
    assert "model.layers.0.experts.gate_up_proj" in names and "lm_head.weight" not in names  # stacked, tied
    with torch.no_grad():
        logits = model(torch.load(tokens)).logits
    assert logits.shape == ours["logits"].shape
    assert (logits - ours["logits"]).abs().max().item() < 1e-4
    assert logits.abs().max().item() < 30.0  # soft-capped
    mtp = set(json.loads((export / "mtp" / "model.safetensors.index.json").read_text())["weight_map"])
    assert {"model.layers.4.eh_proj.weight", "model.layers.4.self_attn.q_proj.weight"} <= mtp


def test_eval_loss_equals_transformers_loss_and_fp8_is_refused(gemma_run, gemma_export, tmp_path):
    import torch.nn.functional as F
    from tokenizers import Tokenizer

    text = "".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(30))
    (tmp_path / "text.py").write_text(text)
    proc = megatron_cli("eval", str(gemma_run), "--text-file", str(tmp_path / "text.py"), "--json")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    ids = Tokenizer.from_file(str(gemma_export / "main" / "tokenizer.json")).encode(text).ids
    n = len(ids) // 32  # training.seq_length
    windows = torch.tensor(ids[: n * 32]).view(n, 32)
    model, _ = _load(gemma_export / "main")
    with torch.no_grad():
        logits = model(windows).logits
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
    assert result["tokens"] == n * 31 and abs(result["lm_loss"] - loss.item()) < 1e-4
    with pytest.raises(UserError, match="--dtype fp8 is not written for Gemma 4: its release format has no FP8"):
        export_to_hf(gemma_run, tmp_path / "fp8", dtype="fp8")
    assert not (tmp_path / "fp8").exists()


def test_generate_decodes_as_transformers_and_drafts_as_training(gemma_export, gemma_logits, tokens):
    from megatron_mtp.inference.generate import load_generator

    gen = load_generator(gemma_export)
    model, _ = _load(gemma_export / "main")
    ids = list(range(5, 60, 3))  # 19 tokens: windows of 5 slide
    with torch.no_grad():
        reference = model(torch.tensor([ids])).logits[0]
    gen.target.reset_cache()  # incremental: prefill, a step, a rejected chunk rolled back, the rest
    parts = [gen.target.forward(ids[:7])[0], gen.target.forward(ids[7:8])[0]]
    gen.target.forward([3, 4, 5])
    gen.target.truncate_cache(8)
    parts += [gen.target.forward(ids[8:12])[0], gen.target.forward(ids[12:])[0]]
    assert (torch.cat(parts) - reference).abs().max().item() < 1e-4
    # the MTP module: megatron-core's depth-1 logits at every position but the last
    batch = torch.load(tokens)
    gen.target.reset_cache()
    _, hidden = gen.target.forward(batch[0].tolist())
    (module,) = gen.drafter.modules
    module.reset_cache()  # one position at a time, through its own cache
    rows = [module.step(hidden[t:t + 1], [int(batch[0, t + 1])], t)[2] for t in range(batch.shape[1] - 1)]
    assert (torch.stack(rows) - gemma_logits["mtp_logits"][0][0, :-1]).abs().max().item() < 1e-4


def test_speculative_and_batched_greedy_equal_plain(gemma_export):
    from megatron_mtp.inference.generate import load_generator

    gen = load_generator(gemma_export)
    prompt = "def add(a, b):\n    return"
    plain = gen.generate(prompt, max_new_tokens=24, ignore_eos=True)
    for k in (1, 3):
        spec = gen.generate(prompt, max_new_tokens=24, ignore_eos=True, speculative_k=k)
        assert spec.tokens == plain.tokens and len(spec.stats.acceptance_per_position) == k
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 4000, (n,), generator=g).tolist() for n in (1, 4, 9, 17)]
    alone = [gen.generate(p, max_new_tokens=8, ignore_eos=True).tokens for p in prompts]
    for k in (0, 2):
        batch = gen.generate_batch(prompts, batch_size=3, max_new_tokens=8, speculative_k=k, ignore_eos=True)
        assert [r.tokens for r in batch.results] == alone, k


def test_dense_gemma4_the_31b_shape_exports_with_transformers_logits(tokens, tmp_path):
    """Without experts (the dense 31B's shape: every layer its dense MLP alone) the same modules train and export."""
    run = tmp_path / "dense"
    megatron_cli("train", "configs/gemma4_tiny_cpu.yaml", "--run-dir", str(run), "--max-steps", "2", *OVERRIDES,
                 "model.num_experts=0", "mtp.num_layers=0")
    ours = megatron_forward(run, tokens, tmp_path / "out.pt")
    export = export_to_hf(run, tmp_path / "export", mtp="none", dtype="fp32")
    assert json.loads((export / "config.json").read_text())["enable_moe_block"] is False
    model, info = _load(export)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    with torch.no_grad():
        assert (model(torch.load(tokens)).logits - ours["logits"]).abs().max().item() < 1e-4


def _transformers_assistant(target_dir, out):
    """A random transformers-built Gemma4AssistantForCausalLM for the target in ``target_dir`` (its head widths
    and window per layer kind, a width of its own), saved to ``out``."""
    text = json.loads((target_dir / "config.json").read_text())
    for key in ("architectures", "torch_dtype", "num_nextn_predict_layers", "bos_token_id", "eos_token_id"):
        text.pop(key, None)
    text.update(num_hidden_layers=2, hidden_size=48, intermediate_size=64, num_attention_heads=2,
                layer_types=["sliding_attention", "full_attention"], enable_moe_block=False, num_experts=None,
                top_k_experts=None, moe_intermediate_size=None, num_kv_shared_layers=2, vocab_size_per_layer_input=0)
    torch.manual_seed(5)
    backbone = json.loads((target_dir / "config.json").read_text())["hidden_size"]
    model = transformers.Gemma4AssistantForCausalLM(transformers.Gemma4AssistantConfig(
        text_config=text, backbone_hidden_size=backbone)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    model.generation_config.num_assistant_tokens = 3
    model.save_pretrained(out)
    return model


def test_assistant_drafts_as_transformers_and_decodes_losslessly(gemma_export, tmp_path):
    from megatron_mtp.inference.generate import load_generator
    from megatron_mtp.inference.target import embed

    reference = _transformers_assistant(gemma_export / "main", tmp_path / "assistant")
    gen = load_generator(gemma_export, assistant=tmp_path / "assistant")
    target, _ = _load(gemma_export / "main")
    ids = list(range(5, 45, 2))  # 20 tokens: the sliding layers' windows (5) are shorter
    n = len(ids)
    with torch.no_grad():  # transformers' drafting: the target's last hidden state and stored keys/values
        out = target(torch.tensor([ids[:-1]]), output_hidden_states=True, return_shared_kv_states=True)
        hidden, token, want = out.hidden_states[-1][:, -1:], torch.tensor([[ids[-1]]]), []
        for _ in range(3):
            step = reference(inputs_embeds=torch.cat([target.model.embed_tokens(token), hidden], -1),
                             position_ids=torch.tensor([[n - 1]]), shared_kv_states=out.shared_kv_states)
            want.append(step.logits[0, -1])
            token, hidden = step.logits.argmax(-1), step.last_hidden_state
    drafter = gen.drafter
    gen.target.reset_cache()
    drafter.reset()
    drafter.observe_rows([0], [gen.target.forward(ids[:-1])[1]], [0])
    kv, hidden, token = drafter._kv(0, n - 1), drafter._hidden[0].read(n - 2, n - 1), ids[-1]
    for j in range(3):
        logits, hidden = drafter.assistant.step(embed(gen.target.model.embed_tokens, torch.tensor([token]),
                                                      gen.target.config), hidden, n - 1, kv)
        assert (logits - want[j]).abs().max().item() < 1e-4, j
        token = int(logits.argmax())
    # decoding with it is lossless, and is transformers' assisted greedy decoding
    prompt = ids[:9]
    plain = gen.generate(prompt, max_new_tokens=16, ignore_eos=True)
    spec = gen.generate(prompt, max_new_tokens=16, ignore_eos=True, speculative_k=3)
    assert spec.tokens == plain.tokens and spec.stats.rounds > 0
    with torch.no_grad():
        assisted = target.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                                   assistant_model=reference)
    assert assisted[0, len(prompt):].tolist() == spec.tokens
    with pytest.raises(UserError, match="is not a Gemma 4 assistant"):
        load_generator(gemma_export, assistant=gemma_export / "main")


def _random_transformers_model(seed: int = 0):
    torch.manual_seed(seed)
    model = transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**TEXT)).eval()
    with torch.no_grad():  # weights transformers initialises to constants get values of their own
        for name, param in model.named_parameters():
            if "norm" in name or "scale" in name:
                param.add_(torch.randn_like(param) * 0.1)
        for layer in model.model.layers:
            layer.layer_scalar.fill_(0.9)
    return model


def test_transformers_built_model_imports_with_its_logits(tokens, tmp_path, capfd):
    model = _random_transformers_model()
    with torch.no_grad():
        reference = model(torch.load(tokens)).logits
    model.save_pretrained(tmp_path / "hf")
    ckpt = import_from_hf(tmp_path / "hf", tmp_path / "ckpt")
    ours = megatron_forward(ckpt, tokens, tmp_path / "out.pt")
    assert (ours["logits"] - reference).abs().max().item() < 1e-4
    a, b = hf_tensors(export_to_hf(ckpt, tmp_path / "back", mtp="none", dtype="fp32")), hf_tensors(tmp_path / "hf")
    assert a.keys() == b.keys() - {"lm_head.weight"} and all(torch.equal(a[k], b[k].float()) for k in a)
    # the same text model inside the multimodal class a user downloads: the towers are left out with a note
    mm = transformers.Gemma4ForConditionalGeneration(transformers.Gemma4Config(
        text_config=TEXT, vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=2, head_dim=16)))
    mm.model.language_model.load_state_dict(model.model.state_dict())
    mm.save_pretrained(tmp_path / "mm")
    capfd.readouterr()
    ckpt_mm = import_from_hf(tmp_path / "mm", tmp_path / "ckpt_mm")
    assert "is a multimodal Gemma 4 checkpoint; its text model is imported" in capfd.readouterr().err
    c = hf_tensors(export_to_hf(ckpt_mm, tmp_path / "back_mm", mtp="none", dtype="fp32"))
    assert c.keys() == a.keys() and all(torch.equal(c[k], a[k]) for k in a)
    # and back among its towers: the multimodal model again, bitwise, with the same text logits
    again = export_to_hf(ckpt_mm, tmp_path / "mm_again", mtp="none", dtype="fp32", multimodal_from=tmp_path / "mm")
    d, e = hf_tensors(again), hf_tensors(tmp_path / "mm")
    assert d.keys() == e.keys() and all(torch.equal(d[k], e[k]) for k in e)
    loaded = transformers.Gemma4ForConditionalGeneration.from_pretrained(again, dtype=torch.float32).eval()
    with torch.no_grad():
        assert (loaded(torch.load(tokens)).logits - reference).abs().max().item() < 1e-4
    with pytest.raises(UserError, match="holds a text model .* not a multimodal one"):
        export_to_hf(ckpt_mm, tmp_path / "text_src", mtp="none", multimodal_from=tmp_path / "hf")
    assert not (tmp_path / "text_src").exists()


def test_what_the_format_cannot_hold_is_one_sentence():
    from megatron_mtp.models.family import get_family

    family = get_family("gemma4")
    base = {"architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text", **TEXT}
    model, _, _ = family.from_hf_config(base)
    assert (model.global_head_dim, model.global_query_groups, model.layer_kinds()[1]) == (32, 1, "full_attention")
    for change, sentence in (({"hidden_size_per_layer_input": 256}, "per-layer embeddings"),
                             ({"num_kv_shared_layers": 2}, "key/value sharing inside the model"),
                             ({"use_bidirectional_attention": "all"}, "only causal attention"),
                             ({"hidden_activation": "silu"}, "only GELU-tanh"),
                             ({"rope_parameters": {"sliding_attention": {"rope_type": "yarn"}}}, "is not Gemma 4's"),
                             ({"layer_types": ["global"] * 4}, "layer_types must list"),
                             ({"altup_coef": 1}, "field 'altup_coef' is not understood")):
        with pytest.raises(UserError, match=sentence):
            family.from_hf_config({**base, **change}, "config.json")
