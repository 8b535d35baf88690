"""GPU-only controls: `auto` is off on CPU, an explicit request there is one sentence, and on a GPU
with Transformer Engine they map onto megatron-core's own fields (checked without a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from megatron_mtp.config import load_config
from megatron_mtp.errors import UserError
from megatron_mtp.platform.detect import Platform
from megatron_mtp.platform.features import resolve_features
from megatron_mtp.platform.job_env import gpu_job_env

ROOT = Path(__file__).resolve().parents[2]
CPU = Platform(device="cpu", backend="gloo", use_te=False)
GPU_TE = Platform(device="cuda", backend="nccl", use_te=True)
GPU_NO_TE = Platform(device="cuda", backend="nccl", use_te=False)


def _cfg(*overrides):
    return load_config(str(ROOT / "configs" / "tiny_cpu.yaml"), list(overrides))


def test_auto_is_off_on_cpu_and_on_with_transformer_engine():
    cpu = resolve_features(_cfg(), CPU)
    assert not any([cpu.grouped_gemm, cpu.permute_fusion, cpu.router_fusion, cpu.rope_fusion,
                    cpu.gradient_accumulation_fusion, cpu.fp8_padding, cpu.tp_comm_overlap])
    assert cpu.cross_entropy_fusion is None and not cpu.async_save
    gpu = resolve_features(_cfg("model.yarn.factor=4.0", "parallel.tp_comm_overlap=auto", "parallel.tensor=2"),
                           GPU_TE)
    assert all([gpu.grouped_gemm, gpu.permute_fusion, gpu.router_fusion, gpu.rope_fusion,
                gpu.gradient_accumulation_fusion, gpu.tp_comm_overlap])
    assert gpu.cross_entropy_fusion == "te" and gpu.async_save
    assert resolve_features(_cfg(), GPU_NO_TE).cross_entropy_fusion is None


def test_async_save_is_off_by_default_on_cpu_but_can_be_asked_for():
    # a background writer works on CPU (tests/dist run it); only `auto` leaves it off there
    assert resolve_features(_cfg("checkpoint.async_save=true"), CPU).async_save
    assert not resolve_features(_cfg("checkpoint.async_save=false"), GPU_TE).async_save


@pytest.mark.parametrize("overrides, field", [
    (["kernels.grouped_gemm=true"], "kernels.grouped_gemm=true needs Transformer Engine's grouped GEMM on a GPU"),
    (["kernels.permute_fusion=true"], "kernels.permute_fusion=true needs"),
    (["kernels.router_fusion=true"], "kernels.router_fusion=true needs"),
    (["kernels.rope_fusion=true"], "kernels.rope_fusion=true needs"),
    (["kernels.gradient_accumulation_fusion=true"], "kernels.gradient_accumulation_fusion=true needs"),
    (["kernels.cross_entropy_fusion=te"], "kernels.cross_entropy_fusion=true needs Transformer Engine's fused"),
    (["parallel.tensor=2", "parallel.tp_comm_overlap=true"], "parallel.tp_comm_overlap=true needs"),
    (["parallel.expert=2", "parallel.token_dispatcher=flex"], "token_dispatcher=flex with flex_backend=deepep needs"),
    (["training.precision=bf16", "optimizer.precision_aware=true"],
     "optimizer.precision_aware=true needs Transformer Engine's FusedAdam on a GPU"),
    (["recompute.granularity=selective", "recompute.modules=[moe_act]"], "recompute.modules moe_act needs"),
    (["kernels.cuda_graph=local"], "kernels.cuda_graph=local needs CUDA graphs on a GPU"),
    (["parallel.shared_expert_overlap=true"], "parallel.shared_expert_overlap=true needs CUDA streams on a GPU"),
])
def test_gpu_only_controls_on_cpu_are_one_sentence(overrides, field):
    with pytest.raises(UserError, match=field.replace("(", r"\(")) as info:
        resolve_features(_cfg(*overrides), CPU)
    assert "\n" not in str(info.value) and "on CPU" in str(info.value)


def test_gpu_only_controls_without_transformer_engine_name_the_extra():
    with pytest.raises(UserError, match=r"install the 'gpu' extra"):
        resolve_features(_cfg("kernels.grouped_gemm=true"), GPU_NO_TE)


def test_deepspeed_cpu_optimizer_without_deepspeed(monkeypatch):
    from megatron_mtp.platform import features

    monkeypatch.setattr(features, "has_module", lambda name: name != "deepspeed")
    cfg = _cfg("training.precision=bf16", "optimizer.precision_aware=true", "optimizer.offload_fraction=0.5",
               "optimizer.cpu_optimizer=deepspeed")
    with pytest.raises(UserError, match=r"install the 'deepspeed' extra"):
        features.resolve_features(cfg, CPU)


def test_gpu_mapping_onto_transformer_config():
    from megatron_mtp.models.deepseek_v3.transformer_config import transformer_config_kwargs

    cfg = load_config(str(ROOT / "configs" / "deepseek_v3_671b.yaml"))
    kwargs = transformer_config_kwargs(cfg, GPU_TE, resolve_features(cfg, GPU_TE))
    expected = dict(
        tensor_model_parallel_size=2, expert_tensor_parallel_size=1, pipeline_model_parallel_size=8,
        pipeline_model_parallel_layout="Et|(tt|)*30mL", overlap_p2p_comm=True, batch_p2p_comm=False,
        recompute_granularity="selective", recompute_modules=["mla_up_proj", "mlp"], moe_grouped_gemm=True,
        moe_permute_fusion=True, moe_router_fusion=True, moe_router_dtype="fp32", cross_entropy_loss_fusion=True,
        cross_entropy_fusion_impl="te", apply_rope_fusion=True, gradient_accumulation_fusion=True,
        overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True, fp8="e4m3", fp8_recipe="blockwise",
        fp8_param=True, moe_router_padding_for_quantization=True, params_dtype=torch.bfloat16,
        use_cpu_initialization=False, sequence_parallel=True, deallocate_pipeline_outputs=True,
    )
    assert {k: kwargs.get(k) for k in expected} == expected
    # gloo's asynchronous sends would read a freed output: the CPU platform keeps pipeline outputs
    on_cpu = _cfg("parallel.pipeline=2")
    assert transformer_config_kwargs(on_cpu, CPU, resolve_features(on_cpu, CPU))["deallocate_pipeline_outputs"] is False
    full = transformer_config_kwargs(_cfg("recompute.granularity=full", "recompute.method=block",
                                          "recompute.num_layers=2"), CPU, resolve_features(_cfg(), CPU))
    assert (full["recompute_granularity"], full["recompute_method"], full["recompute_num_layers"]) == ("full", "block",
                                                                                                        2)
    assert "recompute_granularity" not in transformer_config_kwargs(_cfg(), CPU, resolve_features(_cfg(), CPU))


def test_data_parallel_and_optimizer_mapping():
    from megatron_mtp.training.components import ddp_config, optimizer_config_kwargs

    cfg = load_config(str(ROOT / "configs" / "deepseek_v3_671b.yaml"), ["training.grad_reduce_dtype=bf16",
                                                                         "parallel.bucket_size=1000000"])
    ddp = ddp_config(cfg, resolve_features(cfg, GPU_TE))
    assert (ddp.overlap_grad_reduce, ddp.overlap_param_gather, ddp.align_param_gather, ddp.bucket_size,
            ddp.use_distributed_optimizer, ddp.fp8_param_gather, ddp.grad_reduce_in_fp32) == (
        True, True, True, 1000000, True, True, False)
    opt = optimizer_config_kwargs(cfg)
    assert opt["use_precision_aware_optimizer"] and opt["exp_avg_dtype"] is torch.bfloat16
    assert opt["exp_avg_sq_dtype"] is torch.bfloat16 and opt["main_grads_dtype"] is torch.bfloat16
    offload = optimizer_config_kwargs(_cfg("training.precision=bf16", "optimizer.precision_aware=true",
                                           "optimizer.offload_fraction=0.25", "optimizer.offload_overlap=true"))
    assert (offload["optimizer_cpu_offload"], offload["optimizer_offload_fraction"],
            offload["overlap_cpu_optimizer_d2h_h2d"]) == (True, 0.25, True)


def test_job_environment_follows_the_config():
    env = {name: value for name, value, why in gpu_job_env(_cfg())}
    assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True" and env["NCCL_NVLS_ENABLE"] == "0"
    recipe = load_config(str(ROOT / "configs" / "deepseek_v3_671b.yaml"))
    assert dict((n, v) for n, v, _ in gpu_job_env(recipe))["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"


def test_chunked_output_loss_resolves_where_it_saves_memory():
    """auto: on when a micro-batch holds more tokens than a chunk and no fused cross entropy runs; an
    explicit true takes the fused cross entropy's place; a bad chunk or two replacements are one sentence."""
    assert resolve_features(_cfg(), CPU).output_loss_chunk is None  # 8 × 128 tokens: one chunk holds them
    long = ("training.seq_length=4096", "training.micro_batch_size=1")
    assert resolve_features(_cfg(*long), CPU).output_loss_chunk == 2048
    assert resolve_features(_cfg(*long, "kernels.output_loss_chunk=512"), GPU_NO_TE).output_loss_chunk == 512
    assert resolve_features(_cfg(*long), GPU_TE).output_loss_chunk is None  # the fused kernel is there
    asked = resolve_features(_cfg("kernels.chunked_output_loss=true", "kernels.output_loss_chunk=100"), GPU_TE)
    assert (asked.output_loss_chunk, asked.cross_entropy_fusion) == (100, None)
    assert resolve_features(_cfg(*long, "kernels.chunked_output_loss=false"), CPU).output_loss_chunk is None
    unfused = _cfg(*long, "kernels.cross_entropy_fusion=off")  # YAML reads a bare off as false
    assert unfused.kernels.cross_entropy_fusion == "off" and resolve_features(unfused, GPU_TE).output_loss_chunk
    from megatron_mtp.models.deepseek_v3.transformer_config import transformer_config_kwargs

    assert transformer_config_kwargs(_cfg(), GPU_TE, asked)["cross_entropy_loss_fusion"] is False
    for overrides, words in [(["kernels.output_loss_chunk=0"], "kernels.output_loss_chunk is 0"),
                             (["kernels.chunked_output_loss=true", "kernels.cross_entropy_fusion=native"],
                              "both replace the output layer's cross entropy")]:
        with pytest.raises(UserError, match=words) as info:
            resolve_features(_cfg(*overrides), CPU)
        assert "\n" not in str(info.value)


def test_document_boundaries_for_attention_need_the_local_attention_and_positions_are_refused():
    from megatron_mtp.config.validate import validate

    resolve_features(_cfg("data.reset_attention_mask=true"), CPU)  # megatron-core's local attention takes the mask
    resolve_features(_cfg("data.reset_attention_mask=true"), GPU_NO_TE)
    with pytest.raises(UserError, match="data.reset_attention_mask=true needs megatron-core's local attention, but "
                                        "this run uses Transformer Engine's"):
        resolve_features(_cfg("data.reset_attention_mask=true"), GPU_TE)
    with pytest.raises(UserError, match="data.reset_position_ids=true would change nothing: megatron-core's rotary"):
        validate(_cfg("data.reset_position_ids=true"), 1)
    validate(_cfg("data.eod_mask_loss=true", "data.reset_attention_mask=true"), 1)


def test_nvfp4_maps_onto_megatron_cores_fp4_fields():
    from megatron_mtp.models.deepseek_v3.transformer_config import transformer_config_kwargs

    cfg = load_config(str(ROOT / "configs" / "deepseek_v3_671b.yaml"), ["training.fp8=nvfp4"])
    kwargs = transformer_config_kwargs(cfg, GPU_TE, resolve_features(cfg, GPU_TE))
    assert (kwargs["fp4"], kwargs["fp4_recipe"], kwargs["fp4_param"]) == ("e2m1", "nvfp4", True)
    assert "fp8" not in kwargs and "fp8_recipe" not in kwargs  # megatron-core's fp8 and fp4 exclude each other


def test_cuda_graphs_shared_expert_overlap_and_bf16_layers_map_onto_megatron_core():
    from megatron_mtp.models.deepseek_v3.transformer_config import transformer_config_kwargs

    def kwargs(*overrides):
        cfg = load_config(str(ROOT / "configs" / "deepseek_v3_671b.yaml"), list(overrides))
        return transformer_config_kwargs(cfg, GPU_TE, resolve_features(cfg, GPU_TE))

    plain = kwargs("parallel.moe_a2a_overlap=false", "parallel.delay_wgrad_compute=false")
    assert plain["moe_shared_expert_overlap"] is True  # auto: a GPU, a shared expert, alltoall
    assert "moe_shared_expert_overlap" not in kwargs()  # the recipe's a2a overlap overlaps them itself
    assert "cuda_graph_impl" not in plain and "first_last_layers_bf16" not in plain
    graphed = kwargs("kernels.cuda_graph=transformer_engine", "kernels.cuda_graph_scope=[attn,moe_router]",
                     "training.bf16_first_last_layers=[1,2]")
    assert (graphed["cuda_graph_impl"], graphed["cuda_graph_scope"]) == ("transformer_engine", ["attn", "moe_router"])
    assert (graphed["first_last_layers_bf16"], graphed["num_layers_at_start_in_bf16"],
            graphed["num_layers_at_end_in_bf16"]) == (True, 1, 2)
    assert not resolve_features(_cfg(), CPU).shared_expert_overlap  # auto is off on CPU
    for overrides, message in (
            (["kernels.cuda_graph=local", "kernels.cuda_graph_scope=[moe]"], "scope moe needs fixed expert shapes"),
            (["kernels.cuda_graph=transformer_engine", "kernels.cuda_graph_scope=[full_iteration]"],
             "names 'full_iteration', which kernels.cuda_graph=transformer_engine cannot capture"),
            (["parallel.shared_expert_overlap=true", "parallel.token_dispatcher=allgather"],
             "does not work with parallel.token_dispatcher=allgather")):
        with pytest.raises(UserError, match=message):
            kwargs("parallel.moe_a2a_overlap=false", "parallel.delay_wgrad_compute=false", *overrides)
    cfg = load_config(str(ROOT / "configs" / "deepseek_v3_671b.yaml"), ["kernels.cuda_graph=transformer_engine"])
    with pytest.raises(UserError, match="install the 'gpu' extra"):
        resolve_features(cfg, GPU_NO_TE)
