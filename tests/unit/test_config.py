"""Typed config: YAML + dotted overrides, unknown keys, type errors, and every validation rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_mtp.config import load_config
from megatron_mtp.config.base import describe
from megatron_mtp.config.root import Config
from megatron_mtp.config.validate import validate
from megatron_mtp.config.vocab import check_tokenizer_fits
from megatron_mtp.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def test_yaml_then_overrides_in_order(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  num_layers: 6\ntraining:\n  max_steps: 5\n")
    cfg = load_config(str(path), ["training.max_steps=7", "training.max_steps=9",
                                  "mtp.loss_weight_schedule=[[0, 0.3], [100, 0.1]]"])
    assert cfg.model.num_layers == 6
    assert cfg.training.max_steps == 9
    assert cfg.mtp.loss_weight_schedule == [(0, 0.3), (100, 0.1)]
    assert cfg.model.hidden_size == Config().model.hidden_size  # default kept


@pytest.mark.parametrize("override,message", [
    ("model.num_layer=3", "did you mean 'num_layers'"),
    ("modle.num_layers=3", "did you mean 'model'"),
    ("model.num_layers=abc", "model.num_layers must be an integer"),
    ("training.precision=fp64", "must be one of"),
    ("model.num_layers", "must look like key.path=value"),
    ("model.yarn.factr=2", "did you mean 'factor'"),
])
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(UserError, match=message):
        load_config(None, [override])


def test_unknown_yaml_key_names_closest(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("parallel:\n  tensr: 2\n")
    with pytest.raises(UserError, match=r"unknown config key 'parallel.tensr'; did you mean 'tensor'"):
        load_config(str(path))


def test_bad_yaml_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML at line"):
        load_config(str(path))
    with pytest.raises(UserError, match="does not exist"):
        load_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(UserError, match="is a directory; pass a YAML file"):
        load_config(str(tmp_path))
    path.write_bytes("model:\n  family: deepseek_v3 # caf\u00e9\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"is not UTF-8 text \(byte 34 cannot be decoded\); save it as UTF-8"):
        load_config(str(path))
    path.write_text("# nothing but a comment\n")
    with pytest.raises(UserError, match="is empty; write the sections to change"):
        load_config(str(path))


def test_every_field_has_a_docstring():
    missing = [key for key, _, doc in describe(Config) if not doc]
    assert missing == []


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_configs_load_and_validate(path):
    from megatron_mtp.platform.megatron_core import is_019

    cfg = load_config(str(path))
    if hasattr(cfg.model, "index_topk") and not is_019():  # megatron-core 0.19's DSA modules build the DSA families
        with pytest.raises(UserError, match="needs megatron-core 0.19"):
            validate(cfg, cfg.parallel.world_size)
        return
    validate(cfg, cfg.parallel.world_size)


def test_roundtrip_through_yaml(tmp_path):
    cfg = load_config(str(ROOT / "configs" / "tiny_cpu.yaml"), ["mtp.num_layers=2"])
    path = tmp_path / "resolved.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(str(path)) == cfg


BAD = [
    (["parallel.tensor=2"], 3, "world size 3 is not a multiple of tensor × pipeline = 2×1 = 2"),
    (["parallel.expert=2"], 1, "world size 1 is not a multiple of expert tensor × expert × pipeline = 1×2×1 = 2"),
    (["parallel.tensor=2", "parallel.expert=2", "parallel.expert_tensor=2"], 2, "expert tensor × expert × pipeline"),
    (["parallel.expert_tensor=2", "model.moe_ffn_hidden_size=95"], 2, "moe_ffn_hidden_size=95 is not divisible"),
    (["training.seq_length=5000"], 1, "seq_length=5000 exceeds model.max_position_embeddings=4096"),
    (["optimizer.lr=-1"], 1, "optimizer.lr is -1.0; it must be 0 or more"),
    (["optimizer.adam_beta2=1.0"], 1, "optimizer.adam_beta2 is 1.0; it must be in [0, 1)"),
    (["optimizer.min_lr=1"], 1, "optimizer.min_lr=1.0 exceeds optimizer.lr"),
    (["recompute.granularity=selective", "recompute.modules=[attn]"], 1, "recompute.modules ['attn'] must list"),
    (["recompute.granularity=full", "recompute.num_layers=2"], 1, "recompute.num_layers=1 (or method=block"),
    (["recompute.granularity=full", "recompute.num_layers=9"], 1, "must be between 1 and the decoder layers"),
    (["parallel.overlap_param_gather=true"], 1, "overlap_param_gather needs parallel.distributed_optimizer"),
    (["parallel.moe_a2a_overlap=true"], 1, "moe_a2a_overlap needs training.precision bf16 or fp16"),
    (["parallel.delay_wgrad_compute=true"], 1, "delay_wgrad_compute needs parallel.moe_a2a_overlap"),
    (["optimizer.offload_fraction=0.5", "optimizer.precision_aware=true"], 1, "needs training.precision bf16 or"),
    (["optimizer.offload_fraction=0.5", "training.precision=bf16"], 1, "needs optimizer.precision_aware=true"),
    (["optimizer.offload_fraction=1.5"], 1, "offload_fraction is 1.5; it must be between 0 and 1"),
    (["optimizer.moment_dtype=bf16"], 1, "moment_dtype=bf16 needs optimizer.precision_aware=true"),
    (["optimizer.cpu_optimizer=deepspeed"], 1, "cpu_optimizer=deepspeed needs optimizer.offload_fraction > 0"),
    (["training.fp8_param_gather=true"], 1, "fp8_param_gather needs training.fp8"),
    (["training.grad_reduce_dtype=bf16"], 1, "grad_reduce_dtype=bf16 needs training.precision=bf16"),
    (["training.loss_spike.factor=0.5"], 1, "loss_spike.factor is 0.5"),
    (["parallel.token_dispatcher=flex"], 1, "token_dispatcher=flex needs parallel.tensor × parallel.expert > 1"),
    (["parallel.expert=3"], 3, "model.num_experts=8 is not divisible by parallel.expert=3"),
    (["parallel.pipeline=3"], 3, "model.num_layers=4 cannot be split evenly over parallel.pipeline=3"),
    (["parallel.tensor=2", "parallel.sequence_parallel=false"], 2, "MoE with parallel.tensor > 1 needs sequence"),
    (["parallel.sequence_parallel=true"], 1, "sequence_parallel=true needs parallel.tensor > 1"),
    (["parallel.world_size=4"], 2, "parallel.world_size is 4 but 2 processes were launched"),
    (["training.global_batch_size=6", "training.micro_batch_size=4"], 1, "global_batch_size=6 must be a multiple"),
    (["model.router_topk=9"], 1, "router_topk=9 exceeds model.num_experts=8"),
    (["model.router_num_groups=3"], 1, "num_experts=8 is not divisible by model.router_num_groups=3"),
    (["model.router_group_topk=5"], 1, "router_group_topk must be set and at most"),
    (["model.router_topk=6", "model.router_group_topk=1"], 1, "exceeds the experts reachable"),
    (["model.router_norm_topk_prob=false"], 1, "router_norm_topk_prob=false with sigmoid"),
    (["model.num_attention_heads=3", "parallel.tensor=3", "model.num_experts=6", "model.router_num_groups=3",
      "model.router_group_topk=2", "training.seq_length=130"], 3, "seq_length=130 must be divisible"),
    (["model.num_experts=0", "parallel.expert=2"], 2, "parallel.expert > 1 needs a MoE model"),
    (["parallel.pipeline=2", "parallel.pipeline_layout=[1,2]"], 2, "must be non-negative counts summing"),
    (["parallel.pipeline=2", "parallel.pipeline_layout=[4]"], 2, "has 1 stages but parallel.pipeline is 2"),
    (["mtp.num_layers=-1"], 1, "mtp.num_layers is -1"),
    (["mtp.loss_weight_schedule=[]"], 1, "mtp.loss_weight_schedule is empty"),
    (["training.fp8=delayed"], 1, "training.fp8=delayed needs training.precision=bf16"),
    (["training.max_steps=0"], 1, "training.max_steps is 0"),
    (["model.router_topk=0"], 1, "model.router_topk is 0; a MoE model (model.num_experts=8) needs it to be 1 or more"),
    (["model.moe_ffn_hidden_size=0"], 1, "model.moe_ffn_hidden_size is 0; a MoE model"),
    (["model.num_experts=-4"], 1, "model.num_experts is -4; it must be 0 (a dense model)"),
    (["model.moe_capacity_factor=0"], 1, "model.moe_capacity_factor is 0.0; use a positive factor"),
    (["training.bf16_first_last_layers=[1,1]"], 1, "training.bf16_first_last_layers needs a training.fp8 recipe"),
    (["training.bf16_first_last_layers=[1]"], 1, "training.bf16_first_last_layers is [1]; give [START, END]"),
    (["model.moe_pad_to_capacity=true"], 1, "model.moe_pad_to_capacity=true needs model.moe_capacity_factor"),
    (["model.moe_capacity_factor=1.0", "model.moe_pad_to_capacity=true", "parallel.token_dispatcher=flex",
      "parallel.expert=2"], 2, "does not work with parallel.token_dispatcher=flex on DeepEP"),
    (["training.rampup_batch_size=[4,4]"], 1, "training.rampup_batch_size is [4, 4]; give [START, INCREMENT, SAMPLES]"),
    (["training.rampup_batch_size=[4,5,100]"], 1, "does not reach training.global_batch_size=16"),
    (["training.rampup_batch_size=[4,2,100]", "training.micro_batch_size=4"], 1,
     "passes a global batch of 6, not a multiple of micro_batch_size × data-parallel size = 4"),
    (["checkpoint.save_interval=-1"], 1, "checkpoint.save_interval is -1; it must be 0 (save only at the end) or"),
    (["training.hang_timeout=1e-9"], 1, "training.hang_timeout is 1e-09; it must be 0 (off) or at least 1 second"),
    (["training.hang_timeout=-5"], 1, "training.hang_timeout is -5.0; it must be 0 (off) or at least 1 second"),
]


def test_the_shortest_hang_timeouts_the_tests_use_still_validate():
    for value in ("0", "1", "3"):
        validate(load_config(str(ROOT / "configs" / "tiny_cpu.yaml"), [f"training.hang_timeout={value}"]), 1)


def test_folded_expert_layouts_that_megatron_core_runs_validate():
    # TP2 × ETP1 × EP2 on 2 processes: dense data parallel 1, experts over the tensor ranks
    sizes = validate(load_config(str(ROOT / "configs" / "tiny_cpu.yaml"),
                                 ["parallel.tensor=2", "parallel.expert=2", "parallel.expert_tensor=1"]), 2)
    assert (sizes.dp, sizes.edp) == (1, 1)
    # DeepSeek-V3 recipes: TP2 × PP16 × EP64 with expert TP 1 on 1,024 GPUs (refused before folding)
    cfg = load_config(str(ROOT / "configs" / "deepseek_v3_671b.yaml"),
                      ["parallel.tensor=2", "parallel.expert_tensor=1", "parallel.pipeline=16",
                       "parallel.pipeline_layout=[4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,1]", "parallel.world_size=null",
                       "parallel.moe_a2a_overlap=false", "parallel.delay_wgrad_compute=false",
                       "training.global_batch_size=4096"])
    sizes = validate(cfg, 1024)
    assert (sizes.dp, sizes.edp) == (32, 1)


@pytest.mark.parametrize("overrides,world,message", BAD, ids=[b[2][:40] for b in BAD])
def test_validation_errors_are_one_sentence(overrides, world, message):
    cfg = load_config(str(ROOT / "configs" / "tiny_cpu.yaml"), overrides)
    with pytest.raises(UserError) as info:
        validate(cfg, world)
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def test_tokenizer_larger_than_model_vocab():
    cfg = load_config(str(ROOT / "configs" / "tiny_cpu.yaml"), ["model.vocab_size=100"])
    check_tokenizer_fits(cfg, 128, "tok")  # padded to 128: fits
    with pytest.raises(UserError, match="tokenizer 'tok' has 129 tokens but the model's padded vocabulary is 128"):
        check_tokenizer_fits(cfg, 129, "tok")


def test_data_extra_is_not_a_key():
    with pytest.raises(UserError, match="unknown config key 'data.extra'"):
        load_config(str(ROOT / "configs" / "tiny_cpu.yaml"), ["data.extra={foo: 1}"])


def test_fp8_without_gpu_is_one_clear_error():
    from megatron_mtp.platform.detect import detect

    with pytest.raises(UserError, match="training.fp8=delayed needs a CUDA GPU with Transformer Engine"):
        detect("auto", "auto", fp8="delayed")
    with pytest.raises(UserError, match="no CUDA GPU is visible"):
        detect("cuda", "auto")


def test_help_config_lists_every_key(capsys):
    from megatron_mtp.cli import main

    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    keys = [key for key, _, _ in describe(Config)]
    assert all(f"{key} (" in out for key in keys)
    assert "mtp.loss_weight_schedule" in out and "λ of the last entry" in out


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_configs_are_exportable_to_hf(path):
    from megatron_mtp.models.family import get_family

    cfg = load_config(str(path))
    hf = get_family(cfg.model.family).to_hf_config(cfg.model, cfg.mtp, vocab_size=cfg.model.vocab_size or 4096,
                      num_nextn_predict_layers=cfg.mtp.num_layers).to_dict()
    assert hf["num_nextn_predict_layers"] == cfg.mtp.num_layers


def test_numbers_parse_as_people_write_them(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optimizer:\n  lr: 3e-4\n  min_lr: 1E-5\ntraining:\n  max_steps: 1e3\n")
    cfg = load_config(str(path), ["mtp.loss_weight_schedule=[[0,0.3],[10e12,0.1]]", "optimizer.adam_eps=1e-8",
                                  "training.seq_length=1.28e2"])
    assert (cfg.optimizer.lr, cfg.optimizer.min_lr, cfg.training.max_steps) == (3e-4, 1e-5, 1000)
    assert cfg.mtp.loss_weight_schedule == [(0, 0.3), (10**13, 0.1)] and cfg.training.seq_length == 128
    assert isinstance(cfg.training.max_steps, int) and cfg.optimizer.adam_eps == 1e-8
    with pytest.raises(UserError, match="training.max_steps must be an integer, got 1500.5"):
        load_config(None, ["training.max_steps=1.5005e3"])
    with pytest.raises(UserError, match=r"mtp.loss_weight_schedule\[0\]\[1\] is nan; it must be a finite number"):
        load_config(None, ["mtp.loss_weight_schedule=[[0,.nan]]"])
    with pytest.raises(UserError, match="optimizer.lr is inf; it must be a finite number"):
        load_config(None, ["optimizer.lr=.inf"])


def test_print_config_validates():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "megatron_mtp", "train", "--print-config", "optimizer.lr=-1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == "megatron-mtp train: error: optimizer.lr is -1.0; it must be 0 or more"


def test_a_refusal_every_rank_raises_is_printed_by_rank_0_alone(monkeypatch, capsys, tmp_path):
    """Every rank of a job checks the same config: its refusal is printed once (rank 0), while every rank
    still exits 2; a sentence only one rank can see (its config file missing) is printed by that rank."""
    from megatron_mtp.cli import main

    bad = [("checkpoint.save_interval=-1", "checkpoint.save_interval is -1"),  # validate
           ("training.no_such_field=1", "unknown config key 'training.no_such_field'")]  # load_config
    for rank in ("0", "1"):
        monkeypatch.setenv("RANK", rank)
        for override, needle in bad:
            assert main(["train", str(ROOT / "configs" / "tiny_cpu.yaml"), "--print-config", override]) == 2
            err = capsys.readouterr().err
            assert (err.count(needle) == 1 and err.count("error:") == 1) if rank == "0" else err == "", err
        assert main(["train", str(tmp_path / "missing.yaml"), "--print-config"]) == 2
        assert "missing.yaml" in capsys.readouterr().err
