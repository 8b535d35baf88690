"""convert to-hf --for and OUT/SERVING.md: the layout picked, each refusal (one sentence, nothing
written), the commands printed with their paths, generation_config.json, and the transformers code
of SERVING.md run as a user would run it."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from megatron_mtp.convert import serving, serving_text
from megatron_mtp.convert.to_hf import export_to_hf
from megatron_mtp.errors import UserError, is_one_sentence
from tests.convert.helpers import megatron_cli

L = 4  # the default model: 4 layers, hidden 128, MTP depth 1


def _nothing_written(parent: Path, name: str) -> None:
    assert not (parent / name).exists()
    assert not [p for p in parent.iterdir() if p.name.startswith(f".{name}.tmp")]


def _one_sentence(message: str) -> None:
    assert is_one_sentence(message), message


def _step_with(trained_run, tmp_path, **model_or_mtp) -> Path:
    step = next((trained_run / "checkpoints").glob("step_*"))
    copy = tmp_path / "step"
    shutil.copytree(step, copy)
    cfg = yaml.safe_load((copy / "config.yaml").read_text())
    for key, value in model_or_mtp.items():
        section, name = key.split("__")
        cfg[section][name] = value
    (copy / "config.yaml").write_text(yaml.safe_dump(cfg))
    return copy


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(serve_for="sglang"), r"multiple of 256 from 512 to 8192, and this model's is 128"),
        (dict(serve_for="vllm", mtp_layout="nextn"), r"vLLM finds MTP module d only at layer num_hidden_layers\+d"),
        (dict(serve_for="transformers", mtp="separate", mtp_layout="nextn"), r"transformers finds MTP module d"),
        (dict(serve_for="llama.cpp"), r"--for takes vllm, sglang or transformers, not 'llama.cpp'"),
        (dict(mtp="none", speculative=2), r"--speculative sets the draft tokens .* has no MTP module"),
        (dict(serve_for="vllm", speculative=0), r"--speculative must be a positive number"),
    ],
)
def test_refusals_are_one_sentence_and_write_nothing(trained_run, tmp_path, kwargs, match):
    with pytest.raises(UserError, match=match) as err:
        export_to_hf(trained_run, tmp_path / "out", **kwargs)
    _one_sentence(str(err.value))
    _nothing_written(tmp_path, "out")


def test_nextn_with_two_mtp_modules_is_refused(trained_run, tmp_path):
    step = _step_with(trained_run, tmp_path, mtp__num_layers=2)  # refused before the weights are read
    with pytest.raises(UserError, match="holds one MTP module, and checkpoint .* has 2") as err:
        export_to_hf(step, tmp_path / "out", mtp_layout="nextn")
    _one_sentence(str(err.value))
    _nothing_written(tmp_path, "out")


def test_serving_flags_without_mtp_are_one_sentence(trained_run, tmp_path):
    from megatron_mtp.convert.drop_mtp import drop_mtp

    dropped = drop_mtp(trained_run, tmp_path / "dropped")
    with pytest.raises(UserError, match="has no MTP layers; export it with --mtp none") as err:
        export_to_hf(dropped, tmp_path / "out", serve_for="vllm", mtp="inline")
    _one_sentence(str(err.value))
    out = export_to_hf(dropped, tmp_path / "plain", serve_for="vllm")  # --for picks none: nothing to refuse
    assert json.loads((out / "config.json").read_text())["num_nextn_predict_layers"] == 0
    assert "speculative" not in (out / "SERVING.md").read_text()


def _export(**changes) -> serving.Export:
    base = serving.Export(out=Path("/o"), layout="inline", dtype="bf16", num_layers=61, depth=1, hidden_size=7168,
                          moe=True, tied=False, mla_head_size=576)
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize(
    "engine, changes, fact",
    [
        ("vllm", dict(tied=True), "tied-head"),
        ("vllm", dict(layout="nextn"), "layout"),
        ("vllm", dict(moe=False), "dense-draft"),
        ("vllm", dict(depth=2, speculative=3), "draft-tokens"),
        ("sglang", dict(depth=2), "depth"),
        ("sglang", dict(num_layers=1), "one-layer"),
        ("sglang", dict(num_layers=1, layout="separate"), "one-layer"),
        ("sglang", dict(hidden_size=256), "hidden-size"),
        ("sglang", dict(hidden_size=8448), "hidden-size"),
        ("sglang", dict(hidden_size=640), "hidden-size"),
        ("sglang", dict(dtype="fp32"), "dtype"),
        ("sglang", dict(moe=False), "dense-draft"),
        ("transformers", dict(layout="nextn"), "layout"),
        ("transformers", dict(moe=False), "dense-draft"),
    ],
)
def test_each_engine_fact_is_one_sentence(engine, changes, fact):
    assert serving.problems(engine, _export()) == []
    found = serving.problems(engine, _export(**changes))
    assert [p.fact for p in found] == [fact]
    _one_sentence(found[0].sentence)


def test_what_each_engine_takes():
    assert serving.problems("sglang", _export(num_layers=1, layout="nextn")) == []  # NextN: layer 0
    assert serving.problems("sglang", _export(hidden_size=512)) == []
    assert serving.problems("sglang", _export(moe=False, depth=0, layout="none", dtype="fp32")) == []
    assert serving.problems("vllm", _export(depth=3, layout="separate", num_layers=1)) == []
    assert serving.problems("transformers", _export(tied=True, depth=2, layout="separate")) == []


def test_glm_facts_differ_where_its_loaders_do():
    """SGLang's GLM-4.5 NextN module has no fused eh-norm kernel (no hidden-size or dtype limit);
    transformers finds a GLM-4.5 MTP layer at 92 or 46, not 61; vLLM's MLA note is not for GLM."""
    glm = dict(family="glm4_moe", architecture="Glm4MoeForCausalLM", mla_head_size=None)
    assert serving.problems("sglang", _export(hidden_size=128, dtype="fp32", **glm)) == []
    assert [p.fact for p in serving.problems("sglang", _export(hidden_size=128, depth=2, **glm))] == ["depth"]
    assert _export(num_layers=92, **glm).transformers_finds_mtp and _export(num_layers=46, **glm).transformers_finds_mtp
    assert not _export(num_layers=61, **glm).transformers_finds_mtp and _export(num_layers=61).transformers_finds_mtp
    text = serving_text.serving_text(_export(num_layers=4, hidden_size=128, **glm), [])
    assert "model._keys_to_ignore_on_load_unexpected" in text and "TRITON_MLA" not in text
    tied = serving.problems("vllm", _export(tied=True, **glm))
    assert [p.fact for p in tied] == ["tied-head"] and "Glm4MoeForCausalLM" in tied[0].sentence


@pytest.mark.parametrize(
    "engine, given, has_mtp, layers, picked",
    [
        (None, (None, None, None), True, 4, ("separate", "hf", "bf16")),
        ("vllm", (None, None, None), True, 4, ("inline", "hf", "bf16")),
        ("sglang", (None, None, None), True, 4, ("inline", "hf", "bf16")),
        ("sglang", (None, None, None), True, 1, ("separate", "nextn", "bf16")),
        ("transformers", (None, None, None), True, 4, ("inline", "hf", "bf16")),
        ("vllm", (None, None, None), False, 4, ("none", "hf", "bf16")),
        ("vllm", ("separate", None, "fp32"), True, 4, ("separate", "hf", "fp32")),
        (None, (None, "nextn", None), True, 4, ("separate", "nextn", "bf16")),
    ],
)
def test_for_picks_the_layout_with_the_fewest_flags(engine, given, has_mtp, layers, picked):
    assert serving.choose_layout(engine, *given, has_mtp, layers) == picked


def _blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def _argv(block: str) -> list[str]:
    return shlex.split(block.replace("\\\n", " "))


def test_cli_for_vllm_prints_serving_md_with_its_paths(trained_run, tmp_path):
    out = tmp_path / "vllm"
    proc = megatron_cli("convert", "to-hf", str(trained_run), str(out), "--for", "vllm")
    text = (out / "SERVING.md").read_text()
    assert proc.stdout == f"wrote {out}\n\n{text}"
    assert not (out / "main").exists()
    assert json.loads((out / "config.json").read_text())["num_nextn_predict_layers"] == 1
    plain, draft = (_argv(b) for b in _blocks(text, "bash")[:2])
    assert plain == ["vllm", "serve", str(out.absolute())]
    assert draft[:3] == plain and draft[3] == "--speculative-config"
    assert json.loads(draft[4]) == {"method": "mtp", "num_speculative_tokens": 1}
    assert "warning:" not in proc.stderr  # with --for, what vLLM cannot do is refused, the rest is in SERVING.md
    assert "multiple of 256 from 512 to 8192, and this model's is 128" in text and "No MTP draft here" in text


def test_default_export_notes_serving_md_and_names_both_directories(trained_run, tmp_path):
    out = tmp_path / "sep"
    proc = megatron_cli("convert", "to-hf", str(trained_run), str(out), "--speculative", "2")
    # no engine named: no warning about one, a note pointing at SERVING.md, which says it
    assert "warning:" not in proc.stderr and "SGLang's fused eh-norm kernel" in (out / "SERVING.md").read_text()
    assert "note: SERVING.md says what sglang cannot do with this export" in proc.stderr, proc.stderr
    text = (out / "SERVING.md").read_text()
    vllm_plain, vllm_draft, sglang_plain = (_argv(b) for b in _blocks(text, "bash"))
    main, mtp = str(out.absolute() / "main"), str(out.absolute() / "mtp")
    assert vllm_plain == ["vllm", "serve", main] and sglang_plain[-2:] == ["--model-path", main]
    overrides = vllm_draft[vllm_draft.index("--hf-overrides") + 1]
    assert json.loads(overrides) == {"num_nextn_predict_layers": 1}
    spec = json.loads(vllm_draft[vllm_draft.index("--speculative-config") + 1])
    assert spec == {"method": "mtp", "model": mtp, "num_speculative_tokens": 2}
    assert "--speculative-algorithm" not in text and "No MTP draft here" in text
    assert "multiple of 256 from 512 to 8192, and this model's is 128" in text


def test_sglang_commands_for_a_model_its_draft_kernel_takes():
    e = _export(out=Path("/x y"), layout="separate", dtype="fp32")
    argv = serving_text.sglang_argv(e, draft=True)
    assert argv[:6] == ["python", "-m", "sglang.launch_server", "--model-path", "/x y/main", "--dtype"]
    got = dict(zip(argv[3::2], argv[4::2]))
    assert got == {"--model-path": "/x y/main", "--dtype": "bfloat16", "--speculative-algorithm": "NEXTN",
                   "--speculative-draft-model-path": "/x y/mtp", "--speculative-num-steps": "3",
                   "--speculative-eagle-topk": "1", "--speculative-num-draft-tokens": "4"}
    text = serving_text.serving_text(e, serving.problems("sglang", e))
    assert _argv(_blocks(text, "bash")[3]) == argv  # quoted so that a path with a space survives


def test_generation_config_holds_only_the_special_tokens(export_fp32):
    transformers = pytest.importorskip("transformers")
    config = json.loads((export_fp32 / "main" / "config.json").read_text())
    gen = json.loads((export_fp32 / "main" / "generation_config.json").read_text())
    assert gen == {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    assert None not in gen.values() and not (export_fp32 / "mtp" / "generation_config.json").exists()
    loaded = transformers.GenerationConfig.from_pretrained(export_fp32 / "main")
    assert loaded.eos_token_id == config["eos_token_id"] and not loaded.do_sample
    mtp = json.loads((export_fp32 / "mtp" / "config.json").read_text())
    assert (mtp["num_hidden_layers"], mtp["num_nextn_predict_layers"], config["num_nextn_predict_layers"]) == (L, 1, 0)


def _run(code: str, scope: dict) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, scope)
    return out.getvalue()


@pytest.mark.parametrize("for_engine, kwargs", [("transformers", {}), (None, {}), (None, {"mtp": "none"})],
                         ids=["inline", "separate", "none"])
def test_serving_md_transformers_code_runs_and_mtp_decodes_like_plain(trained_run, tmp_path, for_engine, kwargs):
    pytest.importorskip("transformers")
    out = export_to_hf(trained_run, tmp_path / "hf", serve_for=for_engine, dtype="fp32", **kwargs)
    blocks = _blocks((out / "SERVING.md").read_text(), "python")
    scope: dict = {}
    plain = _run(blocks[0], scope)
    assert plain.startswith("def add(a, b):")
    if kwargs.get("mtp") == "none":
        assert len(blocks) == 1
        return
    assert len(blocks) == 2 and "use_mtp=True" in blocks[1]
    assert _run(blocks[1], scope) == plain  # greedy: the MTP draft changes the speed, never the text


def test_warnings_reach_the_caller_before_anything_is_written(trained_run, tmp_path, capsys):
    seen = []

    def warn(text: str) -> None:
        seen.append(text)
        _nothing_written(tmp_path, "hf")

    export_to_hf(trained_run, tmp_path / "hf", warn=warn)
    # no engine named: what SGLang cannot do is in SERVING.md and one note, not a warning (--for makes it one)
    assert seen == [] and "note: SERVING.md says what sglang cannot do" in capsys.readouterr().err
    export_to_hf(trained_run, tmp_path / "quiet")  # the Python API (generate's cached export) stays quiet
    err = capsys.readouterr().err
    assert "warning" not in err and "note:" not in err
