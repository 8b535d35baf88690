"""A model transformers builds and saves without MTP weights (num_nextn_predict_layers 0) is imported,
gets an MTP module trained on its frozen main weights, and exports a model whose transformers
generate(use_mtp=True) equals its plain greedy generate."""

from __future__ import annotations

import pytest
import torch

from megatron_mtp.config import load_config
from megatron_mtp.convert.from_hf import import_from_hf
from megatron_mtp.convert.to_hf import export_to_hf
from megatron_mtp.models.deepseek_v3.hf_config import to_hf_config
from tests.convert.helpers import REPO, hf_tensors, megatron_cli

transformers = pytest.importorskip("transformers")

MODEL = ["model.num_layers=2", "model.router_group_topk=1", "data.default_corpus_vocab_size=1024"]
TRAIN = ["training.seq_length=32", "training.micro_batch_size=2", "training.global_batch_size=2",
         "logging.eval_interval=0", "logging.tensorboard=false", "checkpoint.save_interval=0"]


def test_transformers_model_without_mtp_gets_a_draft_that_transformers_uses(tmp_path, monkeypatch):
    from transformers.generation.candidate_generator import MTPCandidateGenerator

    seen = {"generators": [], "drafted": 0}
    original_init, original_candidates = MTPCandidateGenerator.__init__, MTPCandidateGenerator.get_candidates

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        seen["generators"].append(self)

    def candidates(self, input_ids, *args, **kwargs):
        out = original_candidates(self, input_ids, *args, **kwargs)
        seen["drafted"] += out[0].shape[1] - input_ids.shape[1]
        return out

    monkeypatch.setattr(MTPCandidateGenerator, "__init__", init)
    monkeypatch.setattr(MTPCandidateGenerator, "get_candidates", candidates)
    cfg = load_config(str(REPO / "configs" / "tiny_cpu.yaml"), MODEL)
    hf = to_hf_config(cfg.model, cfg.mtp, vocab_size=1024, num_nextn_predict_layers=0).to_dict()
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**hf))
    model.save_pretrained(tmp_path / "hf")
    base = import_from_hf(tmp_path / "hf", tmp_path / "base")
    run = tmp_path / "run"
    megatron_cli("train", "configs/tiny_cpu.yaml", "--run-dir", str(run), "--max-steps", "3", *MODEL, *TRAIN,
                 f"checkpoint.load={base}", "checkpoint.load_optimizer=false", "mtp.num_layers=1",
                 "mtp.freeze_base=true", "mtp.targets=self")
    out = export_to_hf(run, tmp_path / "export", mtp="separate", dtype="fp32")
    main = transformers.DeepseekV3ForCausalLM.from_pretrained(out / "main", dtype=torch.float32,
                                                              attn_implementation="eager").eval()
    for name, tensor in model.state_dict().items():  # the main weights are the ones transformers saved
        assert torch.equal(main.state_dict()[name], tensor), name
    ids = torch.randint(0, 1000, (1, 8), generator=torch.Generator().manual_seed(1))
    kwargs = dict(max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
    plain = main.generate(ids, **kwargs)
    main.config.num_mtp_layers = 1  # what OUT/SERVING.md tells a transformers user for the separate layout
    main.config.name_or_path = str(out / "mtp")
    main._keys_to_ignore_on_load_unexpected = [r"model\.layers\.2\."]
    drafted = main.generate(ids, use_mtp=True, **kwargs)
    assert torch.equal(drafted, plain)
    # transformers drafted with the trained module, read from the export
    assert len(seen["generators"]) == 1 and seen["drafted"] > 0
    loaded = {n: t for n, t in seen["generators"][0].mtp_model.state_dict().items() if n.endswith("eh_proj.weight")}
    assert len(loaded) == 1
    exported = hf_tensors(out / "mtp")["model.layers.2.eh_proj.weight"]
    assert torch.equal(next(iter(loaded.values())), exported)
