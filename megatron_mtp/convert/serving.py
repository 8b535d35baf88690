"""What vLLM, SGLang and transformers load from an export, and the commands that serve it.

Each engine's facts are data (``EngineFacts``): which export layouts its MTP draft loads, how many
MTP modules it runs, the hidden sizes and dtypes its draft kernel takes, whether it ties the output
head to the embedding. ``problems`` turns them into one sentence per thing an engine cannot load or
run; ``convert to-hf --for ENGINE`` refuses the first before writing anything, and without
``--for`` every one is a warning. The commands that serve an export and OUT/SERVING.md, which to-hf
also prints, are written from these facts in serving_text.py.

The facts were read from the weight-loading code of vLLM 0.33.0 and SGLang 0.5.23 (neither runs on
a CPU, so neither was run) and checked by running transformers 5.24; convert/README.md ("Serving")
gives the reasons, and tests/convert/test_engine_naming.py walks each engine's naming rules (engine_rules.py) over
the planned export of every shipped config.

- vLLM finds MTP module d only at layer ``num_hidden_layers + d`` (so not in the NextN layout) and
  builds the draft from the *target's* config.json: pointed at ``OUT/main`` (which says
  ``num_nextn_predict_layers: 0``, since it holds no MTP layer) it must be told the depth with
  ``--hf-overrides``. Its DeepSeek model always loads ``lm_head.weight``.
- SGLang runs exactly one MTP module (``num_nextn_predict_layers`` of the draft directory must be
  1); it looks for it at layer ``num_hidden_layers``, or at layer 0 when that is 1 (so a one-layer
  main model needs the NextN layout); its fused eh-norm kernel needs bf16/fp16 and a hidden size
  that is a multiple of 256 in 512..8192, and fails at the first draft step otherwise.
- transformers 5.x drafts with ``generate(..., use_mtp=True)`` (one sequence at a time) from the main model's
  directory; it knows MTP layers only at literal layer indices (DeepSeek-V3: 61; GLM-4.5: 92 and 46,
  the 355B's and the Air's), so other shapes name theirs.
- Every engine builds the MTP block as a MoE layer: a dense model cannot have a draft.
- DeepSeek-V3.2 and GLM-5 (read from vLLM's and SGLang's main-branch DSA code): both load the indexer's
  tensors under the exported names, give the MTP layer an indexer of its own, and skip a layer's indexer where
  IndexShare reuses a top-k (vLLM from ``index_topk_freq``/``index_skip_topk_offset``); their indexer kernels
  take an ``index_head_dim`` of 128 only.

An MTP style whose draft is not the release's MTP modules says how the engines take it (``DraftServing``, from its
``convert.serving_flags``: mtp_styles/<name>/convert.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from megatron_mtp.models.family import get_family

ENGINES = ("vllm", "sglang", "transformers")

SERVING_FILE = "SERVING.md"
SGLANG_DEFAULT_STEPS = 3
"""SGLang's own choice for DeepSeek MTP: 3 chained steps, top-1, 4 draft tokens."""
FLASH_MLA_HEAD_SIZE = 576
"""The only MLA head size (kv_lora_rank + qk_rope_head_dim) vLLM's FlashAttention MLA backend takes."""


@dataclass(frozen=True)
class EngineFacts:
    name: str
    title: str
    draft_layouts: tuple[str, ...]
    """Layouts whose MTP modules the engine's draft loads."""
    one_layer_draft_layouts: tuple[str, ...]
    """The same for a one-layer main model."""
    max_depth: Optional[int]
    """MTP modules it runs (None: any number)."""
    draft_hidden_sizes: Optional[range]
    """Hidden sizes its draft kernel takes (None: any)."""
    draft_dtypes: Optional[tuple[str, ...]]
    """Export dtypes its draft kernel runs in (None: any)."""
    loads_tied_head: bool
    """False: it always loads lm_head.weight, which a tied export does not have."""
    preferred_layout: str
    """What ``--for`` writes for a checkpoint with MTP: the layout it loads with the fewest flags."""
    no_draft: Optional[str] = None
    """Why the engine has no MTP draft for the family at all (None: it has one)."""
    index_head_dims: Optional[tuple[int, ...]] = None
    """DSA indexer head widths its indexer kernels take (None: any)."""
    skips_mtp_in_main: bool = True
    """Whether its main-model loader passes over MTP tensors beside the main ones (the inline layout);
    False: it stops at a name it has no module for."""


FACTS = {
    "vllm": EngineFacts(
        name="vllm", title="vLLM", draft_layouts=("inline", "separate"),
        one_layer_draft_layouts=("inline", "separate"), max_depth=None, draft_hidden_sizes=None,
        draft_dtypes=None, loads_tied_head=False, preferred_layout="inline",
        # its indexer quantises each head's query to FP8 in one 128-wide group (deepseek_v2.py, Indexer)
        index_head_dims=(128,),
    ),
    "sglang": EngineFacts(
        name="sglang", title="SGLang", draft_layouts=("inline", "separate", "nextn"),
        one_layer_draft_layouts=("nextn",), max_depth=1, draft_hidden_sizes=range(512, 8192 + 1, 256),
        # fp8: the release format, whose compute dtype is bf16 (its NextN decoder layer takes the FP8
        # quant config; eh_proj is a plain bf16 linear, as the export writes it)
        draft_dtypes=("bf16", "fp8"), loads_tied_head=True, preferred_layout="inline",
        index_head_dims=(128,),  # its FP8 indexer key cache holds 128 values and a scale (nsa_indexer.py)
    ),
    "transformers": EngineFacts(
        name="transformers", title="transformers", draft_layouts=("inline", "separate"),
        one_layer_draft_layouts=("inline", "separate"), max_depth=None, draft_hidden_sizes=None,
        draft_dtypes=None, loads_tied_head=True, preferred_layout="inline",
    ),
}


def facts_for(engine: str, family: str) -> EngineFacts:
    """``engine``'s facts for a model of ``family`` (where they differ: the family's ``serving.engine_facts``)."""
    return dataclasses.replace(FACTS[engine], **get_family(family).serving.engine_facts.get(engine, {}))


def transformers_mtp_layers(family: str) -> tuple[int, ...]:
    """The layer indices transformers' model class of ``family`` knows as MTP layers (``ServingFacts``)."""
    return get_family(family).serving.transformers_mtp_layers


@dataclass(frozen=True)
class DraftServing:
    """How the serving engines take an MTP style's draft (its ``convert.serving_flags``). The default is the
    release's own MTP modules, which each engine's facts (``EngineFacts``) judge."""

    kind: str = "mtp-modules"
    """What the draft is, as the fact of an engine's problem with it names it (``unserved``)."""
    own_model: bool = False
    """The draft is a model of its own in mtp/ beside the unchanged target, which every engine here loads from
    there as it is: no engine fact about MTP modules applies, vLLM's speculative config names mtp/, SGLang runs
    the steps it was trained for, and the family's notes on its MTP layers are left out of SERVING.md."""
    layout_words: Optional[str] = None
    """How SERVING.md names the export's layout (None: the layout's own words)."""
    words: Optional[Callable[["Export"], str]] = None
    """Export -> how SERVING.md names the draft it holds (None: its MTP modules)."""
    unserved: Optional[Callable[[str], Optional[str]]] = None
    """engine title -> why that engine cannot draft with it (the engine's one problem with the draft: ``--for``
    refuses the export), or None where that engine drafts with it; None: the engines draft with it."""
    sglang_how: str = "NEXTN: the MTP module"
    """How SERVING.md says SGLang drafts with it."""
    vllm_method: str = "mtp"
    """The ``method`` of vLLM's ``--speculative-config`` that drafts with it."""
    sglang_algorithm: str = "NEXTN"
    """SGLang's ``--speculative-algorithm`` that drafts with it."""
    transformers_code: Optional[Callable[["Export"], str]] = None
    """Export -> the lines after ``transformers_code`` (serving_text.py) that generate with it as transformers'
    assistant model (None: the model's own MTP layers, ``use_mtp=True``)."""


@dataclass(frozen=True)
class Export:
    """What serving needs to know about one export."""

    out: Path
    layout: str
    """inline: OUT holds main + MTP (release layout); separate: OUT/main + OUT/mtp (release naming);
    nextn: OUT/main + OUT/mtp in SGLang's NextN naming; none: OUT holds the main model only."""
    dtype: str
    num_layers: int
    depth: int
    """MTP modules exported (0 for layout none)."""
    hidden_size: int
    moe: bool
    tied: bool
    mla_head_size: Optional[int]
    """MLA's cached width per token (None: not MLA)."""
    index_head_dim: Optional[int] = None
    """The width of a DSA indexer head (None: no indexer)."""
    speculative: Optional[int] = None
    """Draft tokens per step asked for with --speculative (None: each engine's default)."""
    repeats: int = 1
    """Depths the one exported module was trained for (mtp.repeated_layer: mtp.num_layers), else 1."""
    family: str = "deepseek_v3"
    """The model family (models/<family>/)."""
    architecture: str = "DeepseekV3ForCausalLM"
    """What config.json's architectures says."""
    draft: DraftServing = DraftServing()
    """How the engines take its MTP part (its MTP style's: the release's MTP modules by default)."""

    @property
    def draft_tokens(self) -> int:
        """Draft tokens per step the serving commands ask for: --speculative, else one per trained depth."""
        return self.speculative or self.depth * self.repeats

    @property
    def transformers_finds_mtp(self) -> bool:
        """Whether transformers finds this export's MTP layers without being told where they are."""
        return self.depth == 1 and self.num_layers in transformers_mtp_layers(self.family)

    @property
    def main_dir(self) -> Path:
        return self.out / "main" if self.layout in ("separate", "nextn") else self.out

    @property
    def mtp_dir(self) -> Optional[Path]:
        if self.layout in ("separate", "nextn"):
            return self.out / "mtp"
        return self.out if self.layout == "inline" else None


@dataclass(frozen=True)
class Problem:
    engine: str
    fact: str
    """Which fact: tied-head, index-head, dense-draft, layout, one-layer, depth, hidden-size, dtype, draft-tokens."""
    sentence: str
    blocks: Optional[str]
    """"model": the engine cannot load the export; "draft": it cannot run the MTP draft; None: the
    commands in SERVING.md work around it."""


def check_engine(name: Optional[str]) -> None:
    from megatron_mtp.errors import UserError

    if name is not None and name not in ENGINES:
        raise UserError(f"--for takes {', '.join(ENGINES[:-1])} or {ENGINES[-1]}, not '{name}'")


def choose_layout(
    engine: Optional[str], mtp: Optional[str], mtp_layout: Optional[str], dtype: Optional[str],
    has_mtp: bool, num_layers: int, family: str = "deepseek_v3",
) -> tuple[str, str, str]:
    """(--mtp, --mtp-layout, --dtype): what the user gave, the rest from ``--for`` or the defaults."""
    if mtp is None and mtp_layout == "nextn":
        mtp = "separate"
    if engine is None:
        return mtp or "separate", mtp_layout or "hf", dtype or "bf16"
    if mtp is None:
        facts = facts_for(engine, family)
        if not has_mtp or facts.no_draft is not None:
            mtp = "none"  # no MTP draft there: the main model alone is what it serves
        elif num_layers == 1 and mtp_layout is None and facts.preferred_layout not in facts.one_layer_draft_layouts:
            mtp, mtp_layout = "separate", "nextn"  # the only layout SGLang's DeepSeek draft finds for L == 1
        else:
            mtp = facts.preferred_layout
    return mtp, mtp_layout or "hf", dtype or "bf16"


def layout_name(mtp: str, mtp_layout: str) -> str:
    return "nextn" if mtp == "separate" and mtp_layout == "nextn" else mtp


def problems(engine: str, export: Export) -> list[Problem]:
    """Everything ``engine`` cannot load or run in ``export``, one sentence each."""
    facts, e = facts_for(engine, export.family), export
    name = facts.title
    found = []

    def add(fact: str, sentence: str, blocks: Optional[str] = "draft") -> None:
        found.append(Problem(engine, fact, sentence, blocks))

    if e.tied and not facts.loads_tied_head:
        add("tied-head", f"{name}'s {e.architecture} always loads lm_head.weight, and this model ties its output "
            "head to the embedding, so the export has none", "model")
    dims = facts.index_head_dims
    if e.index_head_dim is not None and dims is not None and e.index_head_dim not in dims:
        add("index-head", f"{name}'s sparse-attention indexer kernels take an index_head_dim of "
            f"{' or '.join(map(str, dims))} only, and this model's is {e.index_head_dim}", "model")
    if e.depth == 0:
        return found
    why = e.draft.unserved(name) if e.draft.unserved is not None else None
    if why is not None:
        add(e.draft.kind, why)
        return found
    if e.draft.own_model:  # the engines that draft with it load the drafter from its own directory
        return found
    if e.layout == "inline" and not facts.skips_mtp_in_main:
        add("inline-main", f"{name}'s {e.architecture} loader stops at tensor names it has no module for, and an "
            "inline export holds the MTP module beside the main model; export with --mtp separate or --mtp none",
            "model")
    if facts.no_draft is not None:
        add("no-draft", f"{facts.no_draft}, so it serves the main model of this export without the MTP draft; "
            "draft with megatron-mtp generate --speculative K" + (
                " or SGLang (--for sglang)" if engine != "sglang" and facts_for("sglang", e.family).no_draft is None
                else ""))
        return found
    if not e.moe:
        add("dense-draft", f"{name} builds every MTP module as a MoE layer and this model is dense, so its MTP "
            "weights cannot serve as a draft there; export with --mtp none")
    if e.layout not in facts.draft_layouts:
        add("layout", f"{name} finds MTP module d only at layer num_hidden_layers+d, which --mtp-layout nextn "
            "renumbers from 0; export with --mtp-layout hf or --mtp inline")
    elif e.num_layers == 1 and e.layout not in facts.one_layer_draft_layouts:
        add("one-layer", f"{name} looks for the MTP module of a one-layer main model at layer 0, and this "
            "layout stores it at layer 1; export with --mtp separate --mtp-layout nextn")
    if facts.max_depth is not None and e.depth > facts.max_depth:
        add("depth", f"{name} runs {facts.max_depth} MTP module and this checkpoint has {e.depth}; export "
            "with --mtp none, or serve the draft with vLLM (--for vllm)")
    sizes = facts.draft_hidden_sizes
    if sizes is not None and e.hidden_size not in sizes:
        add("hidden-size", f"{name}'s fused eh-norm kernel runs the MTP draft only for a hidden size that is a "
            f"multiple of {sizes.step} from {sizes.start} to {sizes.stop - 1}, and this model's is "
            f"{e.hidden_size}; export with --mtp none, or serve the draft with vLLM (--for vllm)")
    if facts.draft_dtypes is not None and e.dtype not in facts.draft_dtypes:
        add("dtype", f"{name}'s fused eh-norm kernel runs the MTP draft in bf16 or fp16 only, and this export "
            f"is {e.dtype}; serve it with --dtype bfloat16 (as SERVING.md does) or export with --dtype bf16 or fp8",
            None)
    k = e.speculative
    if engine == "vllm" and k is not None and k > e.depth and k % e.depth:
        add("draft-tokens", f"vLLM takes a number of draft tokens up to the MTP depth {e.depth} or a multiple "
            f"of it, not --speculative {k}")
    return found
