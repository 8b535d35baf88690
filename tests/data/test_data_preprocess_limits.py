"""Preprocessing at its limits: a huge document is a bad line (memory stays bounded), a table file written
over while it is read is one sentence, a killed run's temporaries are removed by the next run of the same
prefix, and the gigatoken backend's per-chunk check stops a run where it disagrees with the HF tokenizer."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_mtp.data.preprocess import preprocess
from megatron_mtp.errors import UserError, is_one_sentence

ROOT = Path(__file__).resolve().parents[2]
GOOD = json.dumps({"text": "x = 1\n"}) + "\n"


def _run(tmp_path, tokenizer_dir, inputs, **kwargs):
    return preprocess([str(p) for p in inputs], str(tokenizer_dir), str(tmp_path / "out" / "ds"), progress=False,
                      **kwargs)


def test_a_document_above_the_limit_is_a_bad_line(tmp_path, tokenizer_dir):
    big = json.dumps({"text": "y = 2 " * 1000}) + "\n"  # 6,000 bytes of text
    huge = json.dumps({"text": "z" * 20_000}) + "\n"  # a line of more than 8 x the limit: never read whole
    path = tmp_path / "in.jsonl"
    path.write_text(GOOD + big + GOOD + huge + GOOD)
    with pytest.raises(UserError) as err:
        _run(tmp_path, tokenizer_dir, [path], max_document_bytes=1000)
    assert str(err.value) == (
        f"{path}:2: the document is 6,000 bytes, more than --max-document-bytes 1,000 (tokenising it would take "
        "about 150 bytes of memory per byte); raise --max-document-bytes or split the document; fix the line or "
        "pass --skip-bad-lines to skip bad lines")
    assert is_one_sentence(str(err.value))
    assert not (tmp_path / "out").exists() or os.listdir(tmp_path / "out") == []
    for workers in (1, 2):  # the too-long line crosses to worker processes as its length alone
        stats = _run(tmp_path, tokenizer_dir, [path], max_document_bytes=1000, skip_bad_lines=True, workers=workers)
        assert stats.documents == 3 and stats.bad_lines == {"document too long": 2}
        assert stats.bad_examples[1] == (f"{path}:4: the line is 20,013 bytes, more than 8 times "
                                         "--max-document-bytes, so it was not read; raise --max-document-bytes "
                                         "or split the document")
    assert _run(tmp_path, tokenizer_dir, [path], max_document_bytes=None).documents == 5  # no limit


def test_a_100_mb_document_costs_no_gigabytes(tmp_path, tokenizer_dir):
    """It took 8 GB+ and was killed without a word; now it is one sentence, in bounded memory: the peak of the run
    that meets it is less than 512 MB above the peak of the same command on a three-line file (the imports' share,
    about 450 MB here, varies with the environment; the document's, about 130 MB, is what is bounded)."""
    path = tmp_path / "huge.jsonl"
    with open(path, "w") as fh:
        fh.write(GOOD)
        fh.write('{"text": "')
        for _ in range(100):
            fh.write("word " * 200_000)  # 1 MB
        fh.write('"}\n')
        fh.write(GOOD)
    small = tmp_path / "small.jsonl"
    small.write_text(GOOD * 3)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    measured = ("import resource, sys\nfrom megatron_mtp.cli import main\nrc = main(sys.argv[1:])\n"
                "print('peak_kb', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\nsys.exit(rc)")

    def preprocess_peak(source: Path, out: str) -> tuple[subprocess.CompletedProcess, float]:
        proc = subprocess.run([sys.executable, "-c", measured, "preprocess", "--input", str(source), "--tokenizer",
                               str(tokenizer_dir), "--output-prefix", str(tmp_path / out / "ds"), "--workers", "1",
                               "--no-progress"], capture_output=True, text=True, env=env, timeout=300)
        return proc, int(proc.stderr.rsplit("peak_kb ", 1)[1].split()[0]) / 1024

    base, base_mb = preprocess_peak(small, "small")
    assert base.returncode == 0, base.stderr[-2000:]
    proc, peak_mb = preprocess_peak(path, "out")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"{path}:2: the line is 100,000,013 bytes, more than 8 times --max-document-bytes" in proc.stderr
    assert peak_mb - base_mb < 512, f"peak RSS {peak_mb:.0f} MB, {base_mb:.0f} MB for a three-line file"


def test_a_parquet_file_written_over_while_read_is_one_sentence(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from megatron_mtp.data.sources import iter_input_chunks

    path = tmp_path / "t.parquet"

    def write(rows: int, stem: str) -> None:
        pq.write_table(pa.table({"text": [f"{stem} {i} " * 20 for i in range(rows)]}), path, row_group_size=500)

    for replacement in ("a damaged file", "another table", "renamed over"):
        write(3000, "row")
        chunks = iter_input_chunks([str(path)], "text", chunk_bytes=1)
        first = next(chunks)
        assert first.texts[0].startswith("row 0 ")
        if replacement == "a damaged file":  # in place: the reader fails on the next row group
            with open(path, "r+b") as fh:
                fh.truncate(os.path.getsize(path) // 3)
        elif replacement == "another table":  # in place, a valid file of other rows
            data = (tmp_path / "other.parquet")
            pq.write_table(pa.table({"text": ["other"] * 7000}), data)
            with open(path, "r+b") as fh:
                fh.write(data.read_bytes())
        else:  # a new file renamed over the path: the open file still reads the old one, whole
            pq.write_table(pa.table({"text": ["new"] * 10}), tmp_path / "new.parquet")
            os.replace(tmp_path / "new.parquet", path)
        if replacement == "renamed over":
            rows = len(first.texts) + sum(len(c.texts) for c in chunks if c.texts)
            assert rows == 3000
            continue
        with pytest.raises(UserError) as err:
            list(chunks)
        assert str(err.value).startswith(f"input file '{path}' changed while it was read (after row ")
        assert str(err.value).endswith("it was written over in place); re-run once it is complete and nothing "
                                       "writes it")
        assert is_one_sentence(str(err.value))


def test_a_killed_runs_temporaries_are_removed_by_the_next_run(tmp_path, tokenizer_dir):
    prefix = tmp_path / "out" / "ds"
    writer = subprocess.Popen(  # a writer of the prefix, killed outright mid-run
        [sys.executable, "-c", "import sys, time\nfrom megatron_mtp.data.indexed import IndexedWriter\n"
         "w = IndexedWriter(sys.argv[1], 320)\nw.add(__import__('numpy').arange(9, dtype='int32'), "
         "__import__('numpy').array([9]))\nprint('ready', flush=True)\ntime.sleep(120)", str(prefix)],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert writer.stdout.readline().strip() == "ready"
        left = sorted(p.name for p in prefix.parent.iterdir())
        assert left == [f"ds.bin.tmp-{writer.pid}-" + left[0].rsplit("-", 1)[1]]
        from megatron_mtp.data.indexed import remove_stale_temporaries

        assert remove_stale_temporaries(str(prefix)) == []  # a live writer's files stay
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    finally:
        writer.kill()
    (tmp_path / "in.jsonl").write_text(GOOD * 3)
    stats = _run(tmp_path, tokenizer_dir, [tmp_path / "in.jsonl"])
    assert stats.documents == 3
    assert sorted(p.name for p in prefix.parent.iterdir()) == ["ds.bin", "ds.idx", "ds.meta.json"]


@pytest.fixture
def regexless_tokenizer(tmp_path, tokenizer_dir):
    """The test tokenizer with its byte-level pre-tokenizer's regex off: gigatoken loads it but splits
    words as if the regex were on, so the two backends give other tokens for most texts."""
    pytest.importorskip("gigatoken")
    from tokenizers import Tokenizer, pre_tokenizers

    out = tmp_path / "regexless"
    shutil.copytree(tokenizer_dir, out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.save(str(out / "tokenizer.json"))
    return out


def test_gigatoken_disagreeing_with_the_tokenizer_is_caught(tmp_path, regexless_tokenizer, monkeypatch):
    from megatron_mtp.data import fast_tokenizer
    from megatron_mtp.data.tokenizer import load_tokenizer

    hf = load_tokenizer(regexless_tokenizer).backend
    texts = ["Hello, world!  Two spaces", "def f(x):\n    return x ** 2  # comment", "plain words here"]
    fast = fast_tokenizer.gigatoken_of(hf)
    assert fast_tokenizer._ids(fast, texts) != [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
    # before the run: auto falls back to the HF tokenizer and says why; an explicit gigatoken is refused
    assert fast_tokenizer.fast_backend(hf, "auto") == (
        "hf", "tokenizing with the HF tokenizer, not gigatoken: it gives other tokens than the tokenizer's own on "
        "the probe texts")
    with pytest.raises(UserError, match="^--tokenizer-backend gigatoken cannot be used: it gives other tokens"):
        fast_tokenizer.fast_backend(hf, "gigatoken")
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    fallback = _run(tmp_path, regexless_tokenizer, [path], tokenizer_backend="auto")
    reference = _run(tmp_path / "hf", regexless_tokenizer, [path], tokenizer_backend="hf")
    assert (tmp_path / "out" / "ds.bin").read_bytes() == (tmp_path / "hf" / "out" / "ds.bin").read_bytes()
    assert fallback.tokens == reference.tokens
    # during the run: texts the probe does not cover (here: a probe of one word, on which they agree) are
    # caught by the per-chunk check, which stops the run naming the document and leaves no dataset
    monkeypatch.setattr(fast_tokenizer, "PROBE", ["word"])
    assert fast_tokenizer.fast_backend(hf, "auto") == ("gigatoken", None)
    with pytest.raises(UserError) as err:
        _run(tmp_path / "giga", regexless_tokenizer, [path], tokenizer_backend="auto")
    assert str(err.value) == ("gigatoken gave other tokens than the tokenizer's own for the document at input 1, "
                              "line/row 2; rerun with --tokenizer-backend hf")  # the median document
    assert not (tmp_path / "giga" / "out").exists() or os.listdir(tmp_path / "giga" / "out") == []
