"""What a real rank holds and sends, for comparison with `megatron-mtp plan` (tests/dist/test_plan_exact.py).

Launched through torch.distributed.run: builds the components exactly as training does
(training.components.build_components), then runs two training steps on random tokens through
megatron-core's schedule (the second is measured) and writes PLANCHECK_DIR/rank-N.json (or prints
`PLANCHECK {json}` lines) with
  state      bytes of the parameter storages, of the gradient buffers (main_grad) and of the
             optimizer's own tensors (fp32 main shards, Adam moments, step counters), each storage once;
  comm       bytes handed to torch.distributed collectives during the step, by parallel group and op;
  in_flight  the most forward passes alive at once (forward done, backward not yet), and per chunk
             (with mtp.freeze_base the schedule is forward-only and each backward runs in its forward);
  backward_calls  torch.autograd.backward calls of the measured step (the schedule's and the frozen-base loss's);
  saved      with one pipeline stage: bytes one micro-batch forward saves for backward (saved_tensors_hooks).
Usage: plan_check.py CONFIG [key=value ...]
"""

import collections
import functools
import json
import os
import sys
import weakref

import torch
import torch.distributed as dist

PATCHES = []  # (object, attribute, original): undone at the end, so a warm rank runs the next command unpatched


def patch(obj, name, value):
    PATCHES.append((obj, name, getattr(obj, name)))
    setattr(obj, name, value)


def restore():
    while PATCHES:
        obj, name, original = PATCHES.pop()
        setattr(obj, name, original)


def storage_bytes(tensors, exclude=frozenset()):
    seen = {}
    for t in tensors:
        st = t.untyped_storage()
        key = (st.data_ptr(), st.nbytes())
        if st.data_ptr() not in exclude and key not in seen:
            seen[key] = st.nbytes()
    return sum(seen.values()), {k[0] for k in seen}


def model_state(components):
    params = [p for c in components.model for p in c.parameters()]
    p_bytes, p_ptrs = storage_bytes(params)
    g_bytes, g_ptrs = storage_bytes([p.main_grad for p in params if getattr(p, "main_grad", None) is not None])
    opt = components.optimizer
    inner = []
    for sub in getattr(opt, "chained_optimizers", [opt]):
        for group in getattr(sub, "shard_fp32_from_float16_groups", []) or []:
            inner += [t for t in group if t is not None]
        for state in sub.optimizer.state.values():
            inner += [v for v in state.values() if torch.is_tensor(v)]
    o_bytes, _ = storage_bytes(inner, exclude=p_ptrs | g_ptrs)
    return {"params": p_bytes, "grads": g_bytes, "optimizer": o_bytes}


def _arg(args, kwargs, pos, name):
    return args[pos] if len(args) > pos else kwargs[name]


# op -> bytes of the call: the full tensor (gathered, or before the reduction / split)
SIZES = {
    "all_reduce": lambda a, k: _arg(a, k, 0, "tensor").nbytes,
    "broadcast": lambda a, k: _arg(a, k, 0, "tensor").nbytes,
    "all_gather_into_tensor": lambda a, k: _arg(a, k, 0, "output_tensor").nbytes,
    "_all_gather_base": lambda a, k: _arg(a, k, 0, "output_tensor").nbytes,
    "reduce_scatter_tensor": lambda a, k: _arg(a, k, 1, "input").nbytes,
    "_reduce_scatter_base": lambda a, k: _arg(a, k, 1, "input").nbytes,
    "all_to_all_single": lambda a, k: _arg(a, k, 1, "input").nbytes,
    "all_gather": lambda a, k: _arg(a, k, 1, "tensor").nbytes * len(_arg(a, k, 0, "tensor_list")),
    "all_to_all": lambda a, k: sum(t.nbytes for t in _arg(a, k, 1, "input_tensor_list")),
    "reduce_scatter": lambda a, k: sum(t.nbytes for t in _arg(a, k, 1, "input_list")),
}


class CommCounter:
    """Wraps torch.distributed's collectives (and megatron-core's aliases of them); bytes per 'group:op'."""

    def __init__(self):
        self.bytes = collections.Counter()
        self.active = False
        self.kinds = {}

    def name_groups(self):
        from megatron.core import parallel_state as ps

        getters = [("tp", ps.get_tensor_model_parallel_group), ("pp", ps.get_pipeline_model_parallel_group),
                   ("dp", lambda: ps.get_data_parallel_group(with_context_parallel=True)),
                   ("dp", lambda: ps.get_data_parallel_group(with_context_parallel=True, partial_data_parallel=True)),
                   ("edp", ps.get_expert_data_parallel_group),
                   ("edp", lambda: ps.get_expert_data_parallel_group(partial_expert_data_parallel=True)),
                   ("ep", ps.get_expert_model_parallel_group), ("etp", ps.get_expert_tensor_parallel_group),
                   ("embedding", ps.get_embedding_group), ("tp_ep", ps.get_expert_tensor_and_model_parallel_group),
                   ("mp", ps.get_model_parallel_group),
                   ("tp_dp", lambda: ps.get_tensor_and_data_parallel_group(with_context_parallel=True))]
        for kind, get in getters:
            try:
                group = get()
            except (AssertionError, RuntimeError, TypeError):
                continue
            self.kinds.setdefault(id(group), kind)

    def kind(self, group):
        if group is None or group is dist.group.WORLD:
            return "world"
        return self.kinds.get(id(group), "other")

    def count(self, op, group, nbytes):
        size = dist.get_world_size(group) if group is not None else dist.get_world_size()
        if self.active and size > 1:
            self.bytes[f"{self.kind(group)}:{op}"] += nbytes

    def wrap(self, op, fn):
        @functools.wraps(fn)
        def counted(*args, **kwargs):
            group = kwargs.get("group") or next((a for a in args if isinstance(a, dist.ProcessGroup)), None)
            self.count(op, group, SIZES[op](args, kwargs))
            return fn(*args, **kwargs)
        return counted

    def install(self):
        """Wrap the collectives and every megatron-core module-level alias of them (call after imports)."""
        originals = {}
        for op in SIZES:
            if hasattr(dist, op):
                original = getattr(dist, op)
                originals[original] = self.wrap(op, original)
                patch(dist, op, originals[original])
        for name, module in list(sys.modules.items()):
            if not name.startswith("megatron.core") or module is None:
                continue
            for attr, value in list(vars(module).items()):
                if callable(value) and value in originals:
                    patch(module, attr, originals[value])
        # point-to-point: megatron-core's two p2p paths (P2POp insists on the real isend/irecv)
        from megatron.core.pipeline_parallel import p2p_communication

        for name in ("_batched_p2p_ops", "_p2p_ops"):
            original_p2p = getattr(p2p_communication, name)

            def p2p(*args, _original=original_p2p, **kwargs):
                names = ("tensor_send_prev", "tensor_recv_prev", "tensor_send_next", "tensor_recv_next")
                for i, key in enumerate(names):
                    tensor = args[i] if len(args) > i else kwargs.get(key)
                    if tensor is not None:
                        self.count("send" if "send" in key else "recv", kwargs.get("group"), tensor.nbytes)
                return _original(*args, **kwargs)

            patch(p2p_communication, name, p2p)


class InFlight:
    """Counts forwards whose backward has not run, by patching the schedule's step functions."""

    def __init__(self, chunks):
        self.chunks = chunks
        self.live = [0] * len(chunks)
        self.outstanding = {}
        self.peak, self.peak_per_chunk, self.max_per_chunk = 0, [0] * len(chunks), [0] * len(chunks)

    def install(self):
        from megatron.core.pipeline_parallel import schedules

        original_forward, original_backward = schedules.forward_step, schedules.backward_step

        def forward_step(forward_step_func, data_iterator, model, *args, **kwargs):
            out = original_forward(forward_step_func, data_iterator, model, *args, **kwargs)
            output = out[0]
            chunk = next(i for i, c in enumerate(self.chunks) if c is model)
            tensor = output[0] if isinstance(output, (list, tuple)) else output
            self.outstanding[id(tensor)] = chunk
            self.live[chunk] += 1
            self.max_per_chunk[chunk] = max(self.max_per_chunk[chunk], self.live[chunk])
            if sum(self.live) > self.peak:
                self.peak, self.peak_per_chunk = sum(self.live), list(self.live)
            return out

        def backward_step(input_tensor, output_tensor, *args, **kwargs):
            tensor = output_tensor[0] if isinstance(output_tensor, (list, tuple)) else output_tensor
            chunk = self.outstanding.pop(id(tensor))
            self.live[chunk] -= 1
            return original_backward(input_tensor, output_tensor, *args, **kwargs)

        patch(schedules, "forward_step", forward_step)
        patch(schedules, "backward_step", backward_step)


def saved_bytes_of_forward(model, batch):
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    params |= {p.main_grad.untyped_storage().data_ptr() for p in model.parameters() if hasattr(p, "main_grad")}
    kept = []

    def pack(t):
        if torch.is_tensor(t) and t.untyped_storage().data_ptr() not in params:
            kept.append(weakref.ref(t))  # alive while a graph node holds it (head-by-head frees graphs early)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"],
                    loss_mask=batch["loss_mask"])
    total, _ = storage_bytes([t for t in (ref() for ref in kept) if t is not None])
    del out
    if getattr(model.module, "mtp_objective", None) is not None:  # mtp.freeze_base keeps the MTP graph here
        model.module.mtp_objective = None
    return total


def main():
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from megatron_mtp.config import load_config
    from megatron_mtp.config.validate import validate
    from megatron_mtp.config.vocab import resolve_vocab
    from megatron_mtp.platform import setup
    from megatron_mtp.training.components import build_components
    from megatron_mtp.training.distributed import destroy, env_world, init_distributed
    from megatron_mtp.training.forward_step import make_forward_step

    cfg = load_config(sys.argv[1], sys.argv[2:])
    _, world = env_world()
    validate(cfg, world)
    plat = setup("cpu")
    counter = CommCounter()
    ranks = init_distributed(cfg, plat)
    counter.name_groups()
    vocab = resolve_vocab(cfg)
    comp = build_components(cfg, plat, vocab)
    t = cfg.training
    num_micro = t.global_batch_size // (t.micro_batch_size * ranks.dp)
    g = torch.Generator().manual_seed(1 + ranks.dp_rank)
    batches = []
    for _ in range(num_micro):
        tokens = torch.randint(0, cfg.model.vocab_size or 1000, (t.micro_batch_size, t.seq_length), generator=g)
        batches.append({"tokens": tokens, "labels": torch.roll(tokens, -1, 1),
                        "loss_mask": torch.ones(t.micro_batch_size, t.seq_length),
                        "position_ids": torch.arange(t.seq_length).expand(t.micro_batch_size, -1)})
    saved = None
    if ranks.pp == 1:
        saved = saved_bytes_of_forward(comp.model[0], batches[0])
        comp.model[0].zero_grad_buffer()
    flight = InFlight(comp.model)
    flight.install()
    counter.install()
    backward_calls, inside = [0], [False]  # backward passes this rank runs in the measured step
    original_backward = torch.autograd.backward

    def counted_backward(*args, **kwargs):  # re-entered once through the CPU platform's torch-function mode
        if inside[0]:
            return original_backward(*args, **kwargs)
        backward_calls[0] += int(counter.active)
        inside[0] = True
        try:
            return original_backward(*args, **kwargs)
        finally:
            inside[0] = False

    patch(torch.autograd, "backward", counted_backward)
    fwd_bwd = get_forward_backward_func()
    for counted in (False, True):  # the second step is measured (with overlap_param_gather the first
        # step's parameter all-gather runs in the second step's forward)
        data = iter(batches) if len(comp.model) == 1 else [iter(batches) for _ in comp.model]
        counter.active = counted
        for chunk in comp.model:
            chunk.zero_grad_buffer()
        comp.optimizer.zero_grad()
        frozen = cfg.mtp.freeze_base  # the trainer's MTP-only step: forward-only schedule, MTP backward in the loss
        fwd_bwd(forward_step_func=make_forward_step(None, mtp_only_microbatches=num_micro if frozen else None),
                data_iterator=data, model=comp.model, num_microbatches=num_micro, seq_length=t.seq_length,
                micro_batch_size=t.micro_batch_size, forward_only=frozen)
        if frozen:
            comp.config.finalize_model_grads_func(comp.model)
        comp.optimizer.step()
    counter.active = False
    state = model_state(comp)
    record = {
        "rank": ranks.rank, "pp_rank": ranks.pp_rank, "tp_rank": ranks.tp_rank, "ep_rank": ranks.ep_rank,
        "dp_rank": parallel_state.get_data_parallel_rank(with_context_parallel=True),
        "edp_rank": parallel_state.get_expert_data_parallel_rank(),
        "num_micro": num_micro, "state": state, "comm": dict(counter.bytes), "saved": saved,
        "in_flight": {"peak": flight.peak, "per_chunk": flight.peak_per_chunk, "max_per_chunk": flight.max_per_chunk},
        "backward_calls": backward_calls[0],
    }
    out = os.environ.get("PLANCHECK_DIR")
    if out:  # one file per rank: lines that ranks print at the same time can interleave
        with open(os.path.join(out, f"rank-{ranks.rank}.json"), "w") as fh:
            json.dump(record, fh)
    else:
        print("PLANCHECK " + json.dumps(record), flush=True)
    destroy()


if __name__ == "__main__":
    try:
        main()
    finally:
        restore()
