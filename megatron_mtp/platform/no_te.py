"""Correct megatron-core's view of Transformer Engine when TE is absent (CPU, or GPU without TE).

megatron-core's TE extension imports with stand-ins even when TE is missing, so some modules
believe TE is present: multi_latent_attention then calls isinstance() against a mock class, and the
MoE router's gating GEMM reads a name that is never bound.
We state the truth in those modules. Local (non-TE) specs are built in platform/local_modules.py.
"""

from __future__ import annotations

_APPLIED = False


def apply() -> None:
    global _APPLIED
    if _APPLIED:
        return
    from megatron.core.transformer import multi_latent_attention

    multi_latent_attention.HAVE_TE = False

    # The router's gating GEMM references `te_general_gemm`, which is only bound when TE imports.
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    _APPLIED = True
