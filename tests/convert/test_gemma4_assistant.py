"""Gemma 4's assistant drafter (mtp.style assistant) against transformers 5.25: a random
Gemma4AssistantForCausalLM built by transformers for a trained tiny target imports beside it (`from-hf
--mtp-dir`), and our training forward's K draft steps at every position equal transformers' drafting with the
same target state (its stored keys/values and last hidden state, the teacher-forced tokens, the fixed draft
position); refreshed on the frozen target (mtp.targets self), its acceptance rises from the imported one's
while the target's weights stay bitwise as loaded; the refreshed assistant exports as a directory transformers
loads unmodified, and `target.generate(assistant_model=...)` gives our decoder's greedy tokens and its tokens
per round; what an assistant export cannot be is one sentence."""

from __future__ import annotations

import json

import pytest
import torch

from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader
from megatron_mtp.convert.from_hf import import_from_hf
from megatron_mtp.convert.to_hf import export_to_hf
from megatron_mtp.errors import UserError
from tests.convert.conftest import megatron_forward
from tests.convert.helpers import megatron_cli

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.mcore

SHAPE = dict(seq=64, window=16, vocab=1024)
RUN = ("training.seq_length=64", "training.micro_batch_size=4", "training.global_batch_size=4",
       "model.sliding_window=16", "data.default_corpus_vocab_size=1024", "logging.eval_interval=0",
       "logging.tensorboard=false", "schedule.warmup_steps=0")
K = 3
ASSISTANT = ("mtp.style=assistant", f"mtp.num_layers={K}", "mtp.freeze_base=true", "mtp.assistant.hidden_size=64",
             "mtp.assistant.num_layers=2", "mtp.assistant.num_attention_heads=4", "mtp.assistant.ffn_hidden_size=128",
             "mtp.assistant.layer_types=[sliding_attention,full_attention]")


def _latest(run):
    return run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """A tiny Gemma 4 trained without MTP for 30 steps (it predicts the corpus' frequent tokens), exported."""
    root = tmp_path_factory.mktemp("assistant_target")
    megatron_cli("train", "configs/gemma4_tiny_cpu.yaml", "--run-dir", str(root / "run"), "--max-steps", "30", *RUN,
                 "mtp.num_layers=0", "logging.log_interval=10", "checkpoint.save_interval=30")
    return export_to_hf(root / "run", root / "hf", mtp="none", dtype="fp32")


def _transformers_assistant(target_dir, out, hidden_size: int = 64):
    """A random transformers-built Gemma4AssistantForCausalLM for ``target_dir`` (its norms perturbed), drafting
    K tokens, saved to ``out``."""
    text = json.loads((target_dir / "config.json").read_text())
    for key in ("architectures", "torch_dtype", "num_nextn_predict_layers", "bos_token_id", "eos_token_id"):
        text.pop(key, None)
    text.update(num_hidden_layers=2, hidden_size=hidden_size, intermediate_size=128, num_attention_heads=4,
                layer_types=["sliding_attention", "full_attention"], enable_moe_block=False, num_experts=None,
                top_k_experts=None, moe_intermediate_size=None, num_kv_shared_layers=2, vocab_size_per_layer_input=0)
    torch.manual_seed(7)
    model = transformers.Gemma4AssistantForCausalLM(transformers.Gemma4AssistantConfig(
        text_config=text, backbone_hidden_size=json.loads((target_dir / "config.json").read_text())["hidden_size"]))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
        for layer in model.model.layers:
            layer.layer_scalar.fill_(0.9)
    model.generation_config.num_assistant_tokens = K
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def imported(target, tmp_path_factory):
    root = tmp_path_factory.mktemp("assistant_import")
    source = _transformers_assistant(target, root / "assistant")
    return import_from_hf(target, root / "ckpt", mtp_dir=source), source


def _draft_logits(target_model, assistant, tokens, anchors):
    """transformers' drafting at each anchor t: K steps from the target's hidden state at t and its stored
    keys/values of positions 0..t, step k reading token t+k, every step at position t+1 -> {(b, t, k): logits}."""
    out, got = target_model(tokens, output_hidden_states=True, return_shared_kv_states=True), {}
    for b in range(tokens.shape[0]):
        for t in anchors:
            kv = {kind: (keys[b:b + 1, :, :t + 1], values[b:b + 1, :, :t + 1])
                  for kind, (keys, values) in out.shared_kv_states.items()}
            hidden = out.hidden_states[-1][b:b + 1, t:t + 1]
            for k in range(K):
                if t + 1 + k >= tokens.shape[1]:
                    break
                embedding = target_model.model.embed_tokens(tokens[b:b + 1, t + 1 + k:t + 2 + k])
                step = assistant(inputs_embeds=torch.cat([embedding, hidden], -1),
                                 position_ids=torch.tensor([[t + 1]]), shared_kv_states=kv)
                got[(b, t, k)] = step.logits[0, -1]
                hidden = step.last_hidden_state
    return got


def test_training_forward_drafts_as_transformers(target, imported, tmp_path):
    ckpt, source = imported
    tokens = torch.randint(3, SHAPE["vocab"], (2, SHAPE["seq"]), generator=torch.Generator().manual_seed(3))
    torch.save(tokens, tmp_path / "tokens.pt")
    ours = megatron_forward(ckpt, tmp_path / "tokens.pt", tmp_path / "out.pt")
    assert len(ours["mtp_logits"]) == K
    target_model = transformers.Gemma4ForCausalLM.from_pretrained(target, dtype=torch.float32,
                                                                  attn_implementation="eager").eval()
    assistant = transformers.Gemma4AssistantForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    # every anchor near the start, and ones whose sliding window (16 + 1 keys) no longer reaches position 0
    anchors = [0, 1, 2, 7, 15, 16, 17, 30, 44, 59, 60, 61, 62]
    with torch.no_grad():
        want = _draft_logits(target_model, assistant, tokens, anchors)
    assert len(want) == 2 * (len(anchors) * K - 3)
    worst = max((ours["mtp_logits"][k][b, t] - logits).abs().max().item() for (b, t, k), logits in want.items())
    assert worst < 1e-4, worst


def test_refreshed_assistant_accepts_more_exports_and_decodes_as_transformers(target, imported, tmp_path):
    from megatron_mtp.inference.generate import load_generator

    ckpt, _ = imported
    run = tmp_path / "refresh"
    megatron_cli("train", "configs/gemma4_tiny_cpu.yaml", "--run-dir", str(run), "--max-steps", "24", *RUN,
                 *ASSISTANT, f"checkpoint.load={ckpt}", "mtp.targets=self", "logging.log_interval=1",
                 "checkpoint.save_interval=24", "optimizer.lr=1e-2", "schedule.decay_style=constant")
    rows = [json.loads(line) for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    accepted = [min(r[f"train/mtp_acceptance_{k}"] for k in range(1, K + 1)) for r in rows
                if "train/mtp_acceptance_1" in r]
    # step 1 measures the imported assistant. The target mostly predicts a few of the corpus' most frequent tokens,
    # nearly tied, so the assistant's argmax moves between them step to step: the second half's mean is compared
    # (0.81 on megatron-core 0.16, 0.75 on 0.19)
    later = sum(accepted[12:]) / len(accepted[12:])
    assert len(accepted) == 24 and later > accepted[0] + 0.3, accepted
    with TorchDistReader(ckpt) as src, TorchDistReader(_latest(run)) as out:
        weights = [k for k in src.keys() if k.startswith(("embedding.", "decoder."))]
        assert weights and all(torch.equal(src.read(k), out.read(k)) for k in weights)

    export = export_to_hf(run, tmp_path / "hf", dtype="fp32", serve_for="vllm")  # separate, vLLM's rules
    assert json.loads((export / "mtp" / "generation_config.json").read_text())["num_assistant_tokens"] == K
    target_model, info = transformers.Gemma4ForCausalLM.from_pretrained(
        export / "main", dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assistant, ainfo = transformers.Gemma4AssistantForCausalLM.from_pretrained(
        export / "mtp", dtype=torch.float32, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    assert not any(ainfo[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    serving = (export / "SERVING.md").read_text()
    mtp_dir = export.absolute() / "mtp"
    assert f'{{"method": "mtp", "model": "{mtp_dir}", "num_speculative_tokens": {K}}}' in serving  # vLLM
    assert f"--speculative-draft-model-path {mtp_dir}" in serving and "--hf-overrides" not in serving  # SGLang
    assert f"--speculative-num-steps {K}" in serving and "assistant_model=assistant" in serving

    gen = load_generator(export)  # finds the assistant in mtp/
    prompt, new = list(range(5, 25)), 32
    plain = gen.generate(prompt, max_new_tokens=new, ignore_eos=True)
    spec = gen.generate(prompt, max_new_tokens=new, ignore_eos=True, speculative_k=K)
    assert spec.tokens == plain.tokens
    ours, theirs, assisted = _tokens_per_round(gen, target_model, assistant, prompt, new)
    assert assisted == spec.tokens and abs(ours / theirs - 1) < 0.03 and ours > 1.2, (ours, theirs)


def _tokens_per_round(gen, target_model, assistant, prompt, new):
    """(our tokens per verification round, transformers', transformers' greedy tokens) with the assistant. A round
    of transformers' is a target forward over the last token and the drafts; its forwards of one token (a step
    with nothing left to draft, at the end) and the pre-fill commit one token each outside any round, as ours do."""
    spec = gen.generate(prompt, max_new_tokens=new, ignore_eos=True, speculative_k=K)
    widths = []
    hook = target_model.register_forward_pre_hook(
        lambda _, args, kwargs: widths.append((kwargs.get("input_ids") if args == () else args[0]).shape[1]),
        with_kwargs=True)
    with torch.no_grad():
        assisted = target_model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False,
                                         assistant_model=assistant.eval())
    hook.remove()
    rounds = [w for w in widths[1:] if w > 1]
    theirs = (new - 1 - (len(widths) - 1 - len(rounds))) / len(rounds)
    return spec.stats.round_tokens / spec.stats.rounds, theirs, assisted[0, len(prompt):].tolist()


def test_centroid_output_clusters_the_target_table_exports_and_decodes_as_transformers(target, tmp_path):
    """mtp.assistant.num_centroids: a new assistant's clusters are the balanced k-means partition of the target's
    embedding table (16 of 64 tokens here), trained beside the table; the export is transformers'
    use_ordered_embeddings (its masked output drafts from the 4 best clusters), our greedy decoding equals
    transformers' with it in tokens and tokens per round, and it imports back bitwise, clusters included."""
    from megatron_mtp.inference.generate import load_generator
    from megatron_mtp.models.gemma4.assistant.centroids import balanced_kmeans

    ckpt = import_from_hf(target, tmp_path / "target_ckpt")
    run = tmp_path / "run"
    megatron_cli("train", "configs/gemma4_tiny_cpu.yaml", "--run-dir", str(run), "--max-steps", "6", *RUN,
                 *ASSISTANT, "mtp.assistant.num_centroids=16", "mtp.assistant.centroid_top_k=4",
                 f"checkpoint.load={ckpt}", "logging.log_interval=1", "checkpoint.save_interval=6")
    with TorchDistReader(_latest(run)) as out, TorchDistReader(ckpt) as src:
        ordering = out.read("mtp_assistant.token_ordering")
        assert torch.equal(ordering, balanced_kmeans(src.read("embedding.word_embeddings.weight"), 16))
    export = export_to_hf(run, tmp_path / "hf", dtype="fp32")
    config = json.loads((export / "mtp" / "config.json").read_text())
    assert (config["use_ordered_embeddings"], config["num_centroids"], config["centroid_intermediate_top_k"]) == (
        True, 16, 4)
    target_model = transformers.Gemma4ForCausalLM.from_pretrained(export / "main", dtype=torch.float32,
                                                                  attn_implementation="eager").eval()
    assistant, info = transformers.Gemma4AssistantForCausalLM.from_pretrained(
        export / "mtp", dtype=torch.float32, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    assert torch.equal(assistant.masked_embedding.token_ordering, ordering)
    gen = load_generator(export)
    prompt, new = [17, 300, 41, 9, 12, 77, 500, 3, 8, 99], 32
    ours, theirs, assisted = _tokens_per_round(gen, target_model, assistant, prompt, new)
    assert assisted == gen.generate(prompt, max_new_tokens=new, ignore_eos=True).tokens
    assert abs(ours / theirs - 1) < 0.03, (ours, theirs)
    back = import_from_hf(export / "main", tmp_path / "back", mtp_dir=export / "mtp")
    with TorchDistReader(_latest(run)) as out, TorchDistReader(back) as again:
        keys = [k for k in out.keys() if k.startswith("mtp_assistant.")]
        assert "mtp_assistant.centroids.weight" in keys and all(torch.equal(out.read(k), again.read(k)) for k in keys)


def test_what_an_assistant_export_cannot_be_is_one_sentence(target, imported, tmp_path):
    ckpt, _ = imported
    with pytest.raises(UserError, match="a model of its own"):
        export_to_hf(ckpt, tmp_path / "inline", mtp="inline")
    assert not (tmp_path / "inline").exists()
    other = _transformers_assistant(target, tmp_path / "other", hidden_size=32)
    cfg = json.loads((other / "config.json").read_text())
    cfg["backbone_hidden_size"] = 96
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="drafts for a model of hidden size 96"):
        import_from_hf(target, tmp_path / "bad", mtp_dir=other)
    assert not (tmp_path / "bad").exists()
