"""--stream: text released as rounds commit, never retracted; stop strings across rounds and multi-byte
characters held back until final; the CLI's batch input, JSON and errors."""

from __future__ import annotations

import json

import pytest
from test_batch_generate import _OracleDrafts, _prompts

from megatron_mtp.inference.text_stream import TextStream
from tests.workers.pool import POOL


def _replay(stream: TextStream, texts: list[str], final: str) -> list[str]:
    chunks = [stream.update(t) for t in texts]
    return chunks + [stream.finish(final)]


def test_stop_string_across_commits_is_held_back_then_cut():
    chunks = _replay(TextStream(["XYZ"]), ["ab", "abX", "abXY", "abXYQ", "abXYQ rest X"], "abXYQ rest X")
    assert chunks == ["ab", "", "", "XYQ", " rest ", "X"]
    # completed inside the next commit ("abXYZcd"): the held-back prefix was never printed, the text ends before it
    chunks = _replay(TextStream(["XYZ", "ZZ"]), ["ab", "abXY"], "ab")
    assert chunks == ["ab", "", ""]
    assert _replay(TextStream(["ZZ"]), ["aZ", "aZb"], "aZb") == ["a", "Zb", ""]


def test_incomplete_multibyte_character_is_held_back(gen_d1):
    """Byte-level BPE splits a character over tokens: the prefix decodes to U+FFFD until it completes."""
    text = "naïve café ✓ 日本"
    ids = gen_d1.encode(text)
    decoded = [gen_d1.decode(ids[: i + 1]) for i in range(len(ids))]
    assert any(d.endswith("\ufffd") for d in decoded)  # the tokenizer does split characters here
    stream = TextStream([])
    chunks = [stream.update(d) for d in decoded] + [stream.finish(text)]
    assert "".join(chunks) == text and not any("\ufffd" in c for c in chunks)


def test_batched_stream_equals_final_text_with_stop_strings(gen_d1):
    """Rounds commit several tokens at once (oracle drafts, K=3); each prompt's stop string spans a token
    boundary of its output. The chunks of every sequence join to its final text, which equals batch 1's."""
    gen = gen_d1
    prompts = _prompts(gen.config.vocab_size)[:8]
    plains = [gen.generate(p, max_new_tokens=16, ignore_eos=True).tokens for p in prompts]
    stops = []
    for plain in plains:
        pieces = [gen.decode(plain[: i + 1]) for i in range(len(plain))]
        i = next((i for i in range(3, 15) if len(pieces[i]) > len(pieces[i - 1]) and len(pieces[i - 1]) > 0
                  and pieces[i][len(pieces[i - 1]) - 1 : len(pieces[i - 1]) + 1] not in pieces[i - 1]), 5)
        stops.append(pieces[i][len(pieces[i - 1]) - 1 : len(pieces[i - 1]) + 1])  # spans tokens i-1 and i
    chunks: dict[int, list[str]] = {}
    finished = {}

    def on_text(index, chunk, result):
        chunks.setdefault(index, []).append(chunk)
        if result is not None:
            finished[index] = result

    oracle = _OracleDrafts(gen.drafter, gen.target, [p + t for p, t in zip(prompts, plains)], gen.config.vocab_size)
    results = []
    for stop_index in range(len(prompts)):  # one stop string per run: each prompt's own
        chunks.clear()
        batch = gen.generate_batch(prompts, batch_size=3, max_new_tokens=16, speculative_k=3, ignore_eos=True,
                                   stop=[stops[stop_index]], on_text=on_text, drafter=oracle)
        alone = gen.generate(prompts[stop_index], max_new_tokens=16, ignore_eos=True, stop=[stops[stop_index]])
        assert batch.results[stop_index].text == alone.text
        assert batch.results[stop_index].stats.finish_reason == "stop"
        for index, result in enumerate(batch.results):
            assert "".join(chunks[index]) == result.text
        results.append(batch)
    assert any(b.stats.mean_accept_length > 1.5 for b in results)


def _cli(*args):
    return POOL.run(["-m", "megatron_mtp", "generate", *args], timeout=300)


def test_cli_batch_json_stream_and_errors(export_d1, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n\n{"prompt": "for i in", "max_new_tokens": 3}\n'
                       '{"prompt": [5, 6, 7]}\n')
    proc = _cli(str(export_d1), "--prompts-file", str(prompts), "--batch-size", "2", "--speculative", "2",
                "--max-new-tokens", "6", "--ignore-eos", "--json", "--stats")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [line.get("index") for line in lines[:3]] == [0, 1, 2] and "summary" in lines[3]
    assert [len(line["tokens"]) for line in lines[:3]] == [6, 3, 6]
    experts = lines[3]["summary"]["experts"]
    assert experts["verify"]["tokens"] > experts["plain"]["tokens"]
    assert len(lines[3]["summary"]["acceptance_per_sequence"]) == 3
    assert "acceptance per sequence" in proc.stderr and "routed experts per MoE layer" in proc.stderr

    streamed = _cli(str(export_d1), "--prompts-file", str(prompts), "--batch-size", "2", "--speculative", "2",
                    "--max-new-tokens", "6", "--ignore-eos", "--stream", "--json")
    assert streamed.returncode == 0, streamed.stderr
    events = [json.loads(line) for line in streamed.stdout.splitlines()]
    for index in range(3):
        text = "".join(e["text"] for e in events if e.get("index") == index and "done" not in e)
        assert text == lines[index]["text"]
        assert [e["tokens"] for e in events if e.get("index") == index and e.get("done")] == [lines[index]["tokens"]]

    one = _cli(str(export_d1), "--prompt", "def add(a, b):", "--max-new-tokens", "6", "--ignore-eos",
               "--speculative", "2", "--stream", "--stats")
    assert one.returncode == 0 and one.stdout == lines[0]["text"] + "\n"
    # one prompt's statistics, not a batch summary
    assert one.stderr.startswith("new tokens: 6 in") and "draft/target time ratio" in one.stderr, one.stderr
    assert "prompts, batch size" not in one.stderr

    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    long = tmp_path / "long.txt"
    long.write_text("def f\n" + "x " * 600 + "\n")
    for args, words in [(["--prompts-file", str(prompts), "--batch-size", "0"], "--batch-size is 0"),
                        (["--prompts-file", str(empty)], "has no prompts"),
                        (["--prompts-file", str(long)], f"the prompt on line 2 of {long} has")]:
        bad = _cli(str(export_d1), *args)
        errors = [line for line in bad.stderr.splitlines() if line.strip()]
        assert bad.returncode == 2 and len(errors) == 1 and words in errors[0], bad.stderr
        assert bad.stdout == ""


def test_cli_batch_on_a_glm_export(export_glm, gen_glm, tmp_path):
    """--prompts-file on GLM-4.5 (grouped-query attention): prompts of different lengths decoded 2 at a time
    with K = 2, each one's tokens as the library decodes it alone."""
    prompts = tmp_path / "prompts.txt"
    texts = ["def add(a, b):", "for i in range(10): print(i) if i % 2 else None", "x"]
    prompts.write_text("\n".join(texts) + "\n")
    proc = _cli(str(export_glm), "--prompts-file", str(prompts), "--batch-size", "2", "--speculative", "2",
                "--max-new-tokens", "6", "--ignore-eos", "--json")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [line.get("index") for line in lines[:3]] == [0, 1, 2] and "summary" in lines[3]
    alone = [gen_glm.generate(text, max_new_tokens=6, ignore_eos=True).tokens for text in texts]
    assert [line["tokens"] for line in lines[:3]] == alone
    assert lines[3]["summary"]["verify_forwards"] > 0


@pytest.mark.parametrize("text", ['{"prompt": 3}', "not json"])
def test_bad_jsonl_line_names_it(tmp_path, text):
    from megatron_mtp.errors import UserError
    from megatron_mtp.inference.prompts_file import read_prompts_file

    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "ok"}\n' + text + "\n")
    with pytest.raises(UserError, match=f"line 2 of {path}"):
        read_prompts_file(path, 8)


@pytest.mark.parametrize("name", ["p.JSONL", "p.ndjson", "p.NDJSON"])
def test_json_lines_are_known_by_any_of_their_suffixes(tmp_path, name):
    from megatron_mtp.inference.prompts_file import read_prompts_file

    path = tmp_path / name
    path.write_text('{"prompt": "def f():", "max_new_tokens": 3}\n')
    (prompt,) = read_prompts_file(path, 8)
    assert (prompt.prompt, prompt.max_new_tokens) == ("def f():", 3)


def test_a_byte_order_mark_is_no_part_of_the_first_prompt_and_a_directory_is_named(tmp_path):
    from megatron_mtp.errors import UserError
    from megatron_mtp.inference.prompts_file import read_prompts_file

    path = tmp_path / "p.txt"
    path.write_bytes("\ufeffdef f():\nx = 1\n".encode("utf-8"))
    assert [p.prompt for p in read_prompts_file(path, 8)] == ["def f():", "x = 1"]
    with pytest.raises(UserError, match=f"prompts file {tmp_path} is a directory"):
        read_prompts_file(tmp_path, 8)
