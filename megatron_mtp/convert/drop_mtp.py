"""Remove every MTP tensor from an HF directory or a megatron-mtp checkpoint.

HF (inline release layout): every non-MTP tensor (FP8 weights and their ``_scale_inv`` included,
bytes unchanged) is streamed into new shards with a new index; config.json gets
``num_nextn_predict_layers: 0``; other files (tokenizer, generation config) are copied, except
SERVING.md (its MTP commands no longer apply). A separate
export (``DIR/main`` + ``DIR/mtp``) becomes a copy of ``DIR/main``.

megatron-mtp checkpoint (run dir or step dir): the model's tensors except ``mtp.*`` (sequential
modules) and ``mtp_heads.*`` (parallel heads) are copied chunk by chunk, verbatim, into a new
checkpoint directory with ``mtp.num_layers: 0`` in its config.yaml. Optimizer state is not carried
(it belongs to a model with MTP); train_state.json records ``has_optimizer: false``, so training
starts from the weights with ``checkpoint.load=OUT`` and ``megatron-mtp eval OUT`` evaluates it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from megatron_mtp.checkpoint.finite import refuse_nonfinite, tensor_is_finite
from megatron_mtp.checkpoint.info import read_checkpoint_info, write_checkpoint_info
from megatron_mtp.checkpoint.run_dir import TOKENIZER_DIR, resolve_checkpoint
from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader
from megatron_mtp.checkpoint.torch_dist_writer import TorchDistWriter
from megatron_mtp.convert.hf_source import copy_source_record
from megatron_mtp.convert.progress import Progress
from megatron_mtp.convert.serving import SERVING_FILE
from megatron_mtp.errors import UserError
from megatron_mtp.hf_dir.safetensors_io import INDEX_NAME, HFDir, PlannedTensor, ShardedSafetensorsWriter
from megatron_mtp.models.hf_common import mtp_depth
from megatron_mtp.models.tensor_table import MAIN_KEY_PREFIXES, is_mtp_hf_name, mtp_key_prefixes
from megatron_mtp.output import staged_dir, tree_bytes

_HF_WEIGHT_SUFFIXES = (".safetensors", ".bin")


def drop_mtp(src: str | Path, out: str | Path, max_shard_bytes: int = 4 << 30) -> Path:
    src = Path(src)
    if not src.exists():
        raise UserError(f"drop-mtp source '{src}' does not exist")
    if (src / "config.json").is_file() or (src / "main" / "config.json").is_file():
        return _drop_hf(src, Path(out), max_shard_bytes)
    return _drop_mcore(src, Path(out))


def _drop_hf(src: Path, out: Path, max_shard_bytes: int) -> Path:
    if not (src / "config.json").is_file():  # separate export: main is already MTP-free
        main = HFDir(src / "main")
        if not (src / "mtp").is_dir():
            raise UserError(f"'{src}' has no MTP part (no mtp/ directory); there is nothing to drop")
        layers = main.config["num_hidden_layers"]
        if mtp_depth(main.config) or any(is_mtp_hf_name(n, layers) for n in main.names()):
            raise UserError(f"'{src / 'main'}' itself declares MTP layers; run drop-mtp on '{src / 'main'}'")
        for name in main.weight_map:  # the copy below moves bytes unread (FP8 scales too): check them first
            if not tensor_is_finite(main.raw(name)):
                refuse_nonfinite(name, f"'{src / 'main'}'")
        with staged_dir(out, needed_bytes=tree_bytes(src / "main")) as tmp:
            shutil.rmtree(tmp)
            shutil.copytree(src / "main", tmp)
        return out
    hf = HFDir(src)
    num_layers = int(hf.config.get("num_hidden_layers", 0))
    keep = [n for n in hf.weight_map if not is_mtp_hf_name(n, num_layers)]
    dropped = len(hf.weight_map) - len(keep)
    if dropped == 0 and mtp_depth(hf.config) == 0:
        raise UserError(
            f"'{src}' has no MTP layers (num_nextn_predict_layers is 0 and no layer >= {num_layers}); nothing to drop"
        )
    keep.sort(key=lambda n: (hf.weight_map[n], n))
    plan = [PlannedTensor(n, hf.shape(n), hf.dtype(n)) for n in keep]
    with staged_dir(out, needed_bytes=sum(p.nbytes for p in plan)) as tmp:
        writer = ShardedSafetensorsWriter(tmp, plan, max_shard_bytes)
        try:
            with Progress(writer.total_bytes, "drop-mtp") as bar:
                for name in keep:
                    tensor = hf.raw(name)
                    if not tensor_is_finite(tensor):
                        refuse_nonfinite(name, f"'{src}'")
                    writer.write(name, tensor)
                    bar.advance(tensor.numel() * tensor.element_size())
            writer.finish()
        finally:
            writer.abort()
        config = dict(hf.config, num_nextn_predict_layers=0)
        config.pop("num_mtp_layers", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for item in sorted(src.iterdir()):
            weights = item.name.endswith(_HF_WEIGHT_SUFFIXES)
            # SERVING.md holds the commands for the directory with MTP; they no longer apply
            if item.is_file() and item.name not in ("config.json", INDEX_NAME, SERVING_FILE) and not weights:
                shutil.copy2(item, tmp / item.name)
    return out


def _drop_mcore(src: Path, out: Path) -> Path:
    step = resolve_checkpoint(src, what="drop-mtp source").path
    state, cfg = read_checkpoint_info(step)
    reader = TorchDistReader(step)
    prefixes = mtp_key_prefixes()
    mtp_keys = [k for k in reader.keys() if k.startswith(prefixes)]
    if cfg.mtp.num_layers == 0 or not mtp_keys:
        raise UserError(f"checkpoint '{step}' has no MTP layers; there is nothing to drop")
    # the main model's weights (no MTP style's key prefix starts like one of them)
    keys = [k for k in reader.keys() if k.startswith(MAIN_KEY_PREFIXES)]
    objects = [k for k in reader.object_keys() if k.startswith(MAIN_KEY_PREFIXES) and "._extra_state/" in k]
    reader.validate(keys, tuple(objects))
    size = sum(reader.entry(k).nbytes for k in keys)
    with staged_dir(out, needed_bytes=size + tree_bytes(step / TOKENIZER_DIR)) as tmp, reader:
        writer = TorchDistWriter(tmp)
        try:
            with Progress(size, "drop-mtp") as bar:
                for key in keys:
                    entry = reader.entry(key)
                    if not reader.is_finite(key):
                        refuse_nonfinite(key, f"checkpoint '{step}'")
                    writer.declare(key, entry.shape, entry.dtype)
                    for c in entry.chunks:
                        writer.copy_chunk_blob(key, c.offsets, c.sizes, reader.blob(key, c.file, c.offset, c.length))
                    bar.advance(entry.nbytes)
                for key in objects:
                    writer.write_object_blob(key, reader.object_blob(key))
            writer.finish({})
        finally:
            writer.abort()
        new_cfg = cfg.replace(mtp=type(cfg.mtp)(num_layers=0, loss_weight_schedule=cfg.mtp.loss_weight_schedule))
        if (step / TOKENIZER_DIR).is_dir():
            shutil.copytree(step / TOKENIZER_DIR, tmp / TOKENIZER_DIR)
        copy_source_record(step, tmp)
        write_checkpoint_info(tmp, new_cfg, dict(state, has_optimizer=False))
    return out
