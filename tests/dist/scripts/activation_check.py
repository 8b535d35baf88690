"""Bytes one forward pass saves for backward, per layer, for comparison with plan/activations.py.

Builds the model as training does (one process, CPU) for each case and runs one micro-batch
forward under torch.autograd.graph.saved_tensors_hooks. Every saved tensor still held by the graph
after the forward is counted once by its storage (data pointer and size, measured after the
forward, so storages that recompute freed count 0, and so do the graphs that head-by-head MTP
backward frees inside the forward), parameters excluded, and attributed to the outermost decoder
or MTP layer running when it was saved (embedding, the decoder's own checkpoint inputs, or the
output side otherwise).
Usage: activation_check.py CONFIG CASES_JSON   (a list of {"overrides": [...], "batch": b, "seq": s});
prints one JSON line: a list of {group: bytes}.
"""

import collections
import json
import sys
import weakref

import torch


def group_of(path: tuple) -> str:
    for name in path:
        parts = name.split(".")
        if parts[:2] == ["decoder", "layers"] and len(parts) > 2:
            return f"layer{parts[2]}"
        if parts[0] in ("mtp", "mtp_heads"):
            return "mtp"
    if path and path[-1] == "decoder":
        return "decoder"  # full recompute: the layers' checkpointed inputs
    if path and path[0] == "embedding":
        return "embedding"
    return "output"


def measure(config: str, case: dict) -> dict:
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    from megatron_mtp.config import load_config
    from megatron_mtp.config.vocab import resolve_vocab
    from megatron_mtp.platform import setup
    from megatron_mtp.platform.megatron_core import reset_moe_tracker
    from megatron_mtp.training.components import build_components, unwrap
    from megatron_mtp.training.distributed import destroy, init_distributed

    # megatron-core's loss trackers are process-global and sized by the first model that fills them
    reset_moe_tracker()
    MTPLossLoggingHelper.tracker.clear()
    b, s = case["batch"], case["seq"]
    cfg = load_config(config, case["overrides"] + [f"training.seq_length={s}", f"training.micro_batch_size={b}",
                                                   f"training.global_batch_size={b}"])
    plat = setup("cpu")
    init_distributed(cfg, plat)
    comp = build_components(cfg, plat, resolve_vocab(cfg), with_optimizer=False)
    gpt = unwrap(comp.model[0])
    comp.config.mtp_loss_scaling_factor = 0.3
    params = {p.untyped_storage().data_ptr() for p in gpt.parameters()}
    params |= {p.main_grad.untyped_storage().data_ptr() for p in gpt.parameters() if hasattr(p, "main_grad")}
    stack = []
    for name, module in gpt.named_modules():
        if name:
            module.register_forward_pre_hook(lambda m, i, name=name: stack.append(name) and None)
            module.register_forward_hook(lambda m, i, o, name=name: stack.pop() and None)
    saved = []

    def pack(t):
        if torch.is_tensor(t) and t.untyped_storage().data_ptr() not in params:
            saved.append((tuple(stack), weakref.ref(t)))  # alive while a graph node holds it
        return t

    tokens = torch.randint(0, cfg.model.vocab_size, (b, s), generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = gpt(tokens, torch.arange(s).expand(b, s), None, labels=torch.roll(tokens, -1, 1),
                  loss_mask=torch.ones(b, s))
    seen, groups = set(), collections.Counter()
    for path, ref in saved:
        t = ref()
        if t is None:
            continue
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in seen:
            seen.add(key)
            groups[group_of(path)] += storage.nbytes()
    del out
    destroy()
    return dict(groups)


def main():
    cases = json.loads(sys.argv[2])
    print(json.dumps([measure(sys.argv[1], case) for case in cases]))


if __name__ == "__main__":
    main()
