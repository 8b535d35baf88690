"""Corpora as they ship: Parquet, Arrow (HF datasets' save_to_disk), zstd JSONL, directories, globs and
@lists tokenise to the same dataset as plain JSONL; a sharded preprocess merged equals the unsharded one;
data.paths takes globs and weighted @lists."""

from __future__ import annotations

import json
import os

import pytest

from megatron_mtp.data.preprocess import preprocess
from megatron_mtp.errors import UserError

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstandard = pytest.importorskip("zstandard")
datasets = pytest.importorskip("datasets")


def _files(prefix) -> bytes:
    return b"".join(open(f"{prefix}{ext}", "rb").read() for ext in (".bin", ".idx"))


@pytest.fixture(scope="module")
def texts(documents):
    out = list(documents[:240])
    out[5] = ""  # a document that tokenises to nothing (kept as a lone EOD with --append-eod)
    return out


def _run(inputs, tokenizer_dir, prefix, **kw):
    return preprocess([str(i) for i in inputs], str(tokenizer_dir), str(prefix), append_eod=True, progress=False,
                      chunk_bytes=kw.pop("chunk_bytes", 2048), **kw)


def test_every_format_tokenises_to_the_same_dataset_as_plain_jsonl(tmp_path, texts, tokenizer_dir, write_jsonl):
    plain = write_jsonl(tmp_path / "plain.jsonl", texts)
    lines = plain.read_bytes()
    (tmp_path / "zstd.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines))
    write_jsonl(tmp_path / "gz.jsonl.gz", texts, compress=True)
    table = pa.table({"id": list(range(len(texts))), "text": texts})
    pq.write_table(table, tmp_path / "rows.parquet", row_group_size=37)  # many row groups, another column
    with pa.OSFile(str(tmp_path / "file.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=50)  # the Arrow file format (the stream format: below)
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "hf"), num_shards=3)

    reference = _run([plain], tokenizer_dir, tmp_path / "ref")
    assert reference.documents == len(texts)
    for name in ("zstd.jsonl.zst", "gz.jsonl.gz", "rows.parquet", "file.arrow", "hf"):
        stats = _run([tmp_path / name], tokenizer_dir, tmp_path / f"out-{name}", workers=2 if name == "hf" else 1)
        assert _files(tmp_path / f"out-{name}") == _files(tmp_path / "ref"), name
        assert stats.documents == reference.documents
    # a directory, a glob and an @list name their files in order; the text column is picked by --text-key
    (tmp_path / "parts").mkdir()
    halves = [write_jsonl(tmp_path / "parts" / f"p{i}.jsonl", part, key="content")
              for i, part in enumerate((texts[:120], texts[120:]))]
    (tmp_path / "list.txt").write_text("# the two halves\nparts/p0.jsonl\n\nparts/p1.jsonl\n")
    for spec in (tmp_path / "parts", f"{tmp_path}/parts/*.jsonl", f"@{tmp_path / 'list.txt'}"):
        _run([spec], tokenizer_dir, tmp_path / "again", text_key="content")
        assert _files(tmp_path / "again") == _files(tmp_path / "ref"), spec
    with pytest.raises(UserError, match="is named twice"):
        _run([tmp_path / "parts", halves[0]], tokenizer_dir, tmp_path / "twice", text_key="content")
    assert not (tmp_path / "twice.idx").exists()


def test_a_table_row_without_text_is_named_by_file_and_row(tmp_path, texts, tokenizer_dir):
    rows = list(texts[:40])
    rows[12] = None
    pq.write_table(pa.table({"text": rows, "url": ["u"] * 40}), tmp_path / "t.parquet", row_group_size=5)
    with pytest.raises(UserError) as bad:
        _run([tmp_path / "t.parquet"], tokenizer_dir, tmp_path / "out")
    assert str(bad.value) == (f"{tmp_path / 't.parquet'}, row 13: the 'text' value is null; fix the row or pass "
                              "--skip-bad-lines to skip bad lines")
    assert not (tmp_path / "out.idx").exists()
    stats = _run([tmp_path / "t.parquet"], tokenizer_dir, tmp_path / "out", skip_bad_lines=True)
    assert stats.documents == 39 and stats.bad_lines == {"text is not a string": 1}
    with pytest.raises(UserError, match=r"has no column 'content' \(columns: text, url\); pick the text column "
                                        "with --text-key"):
        _run([tmp_path / "t.parquet"], tokenizer_dir, tmp_path / "x", text_key="content")
    pq.write_table(pa.table({"url": [1, 2]}), tmp_path / "ints.parquet")
    with pytest.raises(UserError, match="column 'url' holds int64, not strings"):
        _run([tmp_path / "ints.parquet"], tokenizer_dir, tmp_path / "x", text_key="url")
    # an HF DatasetDict directory names its splits; a damaged zstd file is one sentence
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a"]})}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(UserError, match="is an HF DatasetDict with splits train; pass one split's directory"):
        _run([tmp_path / "dd"], tokenizer_dir, tmp_path / "x")
    whole = zstandard.ZstdCompressor().compress("".join(json.dumps({"text": t}) + "\n" for t in texts).encode())
    (tmp_path / "cut.jsonl.zst").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(UserError, match="is a damaged zstd file"):
        _run([tmp_path / "cut.jsonl.zst"], tokenizer_dir, tmp_path / "x")
    # the Arrow stream format (what HF datasets writes) read with another text column
    table = pa.table({"body": texts[:30]})
    with pa.OSFile(str(tmp_path / "s.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=7)
    assert _run([tmp_path / "s.arrow"], tokenizer_dir, tmp_path / "s", text_key="body").documents == 30


def test_a_sharded_preprocess_merged_equals_the_unsharded_one(tmp_path, texts, tokenizer_dir, write_jsonl):
    from megatron_mtp.cli import main
    from megatron_mtp.data.prefixes import expand_blend
    from megatron_mtp.data.shards import merge_datasets

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(5):  # five shipped shards, split 1/2/2 over three preprocess shards
        write_jsonl(corpus / f"part-{i:02d}.jsonl", texts[i * 48:(i + 1) * 48])
    whole = _run([corpus], tokenizer_dir, tmp_path / "whole", workers=2)
    for i in range(3):
        _run([f"{corpus}/*.jsonl"], tokenizer_dir, tmp_path / "fw", shard=(i, 3))
    shards = sorted(str(p)[:-4] for p in tmp_path.glob("fw_shard-*.idx"))
    assert [s.rsplit("/", 1)[1] for s in shards] == [f"fw_shard-{i:05d}-of-00003" for i in range(3)]
    assert json.loads(open(shards[0] + ".meta.json").read())["inputs"] == [str(corpus / "part-00.jsonl")]
    meta = merge_datasets(list(reversed(shards)), str(tmp_path / "merged"), progress=False)  # put in order
    assert _files(tmp_path / "merged") == _files(tmp_path / "whole")
    assert meta["documents"] == whole.documents and meta["tokens"] == whole.tokens
    # a missing shard is named, nothing is written
    assert main(["merge-datasets", "--input", shards[0], shards[2], "--output-prefix", str(tmp_path / "m2")]) == 2
    assert not (tmp_path / "m2.idx").exists()
    with pytest.raises(UserError, match=r"--shard 1/9: the inputs hold only 5 files"):
        _run([corpus], tokenizer_dir, tmp_path / "x", shard=(1, 9))
    # a split part without a document would make megatron-core's sampler loop forever: refused by name
    from megatron_mtp.config import load_config
    from megatron_mtp.data.datasets import check_data_config, resolve_data

    cfg = load_config(None, [f"data.paths=[{shards[0]}]", f"data.tokenizer={tokenizer_dir}", "data.split=99.5,0.5,0",
                             f"data.cache_dir={tmp_path / 'cache'}", "training.seq_length=16"])
    with pytest.raises(UserError, match=r"has 48 documents, so data.split '99.5,0.5,0' leaves its validation part "
                                        "none; give it more documents"):
        check_data_config(cfg, resolve_data(cfg))
    # data.paths: a glob over the shards, with one weight, is shared by their sizes; a weighted @list
    sizes = [open(s + ".bin", "rb").seek(0, 2) for s in shards]
    prefixes, weights = expand_blend([str(tmp_path / "fw_shard-*"), str(tmp_path / "whole")], [0.3, 0.7], "p")
    assert prefixes == shards + [str(tmp_path / "whole")]
    assert weights == pytest.approx([0.3 * s / sum(sizes) for s in sizes] + [0.7])
    (tmp_path / "blend.txt").write_text("0.25 fw_shard-00000-of-00003  # a comment\n0.75 whole\n")
    assert expand_blend([f"@{tmp_path / 'blend.txt'}"], None, "p") == ([shards[0], str(tmp_path / "whole")],
                                                                        [0.25, 0.75])
    (tmp_path / "bad.txt").write_text("0.25 whole\nfw_shard-00000-of-00003\n")
    with pytest.raises(UserError, match="some lines carry a weight and some do not"):
        expand_blend([f"@{tmp_path / 'bad.txt'}"], None, "data.paths")
    with pytest.raises(UserError, match=r"data.paths entry '.*nope-\*' matches no dataset"):
        expand_blend([str(tmp_path / "nope-*")], None, "data.paths")
    # a corpus file or a .bin where a prefix belongs: what to give instead, not a tokenizer error
    with pytest.raises(UserError, match=r"entry '.*part-00.jsonl' is a corpus file, not a dataset prefix; tokenise "
                                        r"it first \(megatron-mtp preprocess --input"):
        expand_blend([str(corpus / "part-00.jsonl")], None, "data.paths")
    with pytest.raises(UserError, match=r"entry '.*whole.bin' ends with '.bin'; give the dataset prefix without the "
                                        r"extension \('.*whole'\)"):
        expand_blend([str(tmp_path / "whole.bin")], None, "data.paths")
    # a shard glob with a shard gone (its preprocess unfinished): one sentence naming it, not a run on the rest
    os.rename(shards[1] + ".idx", shards[1] + ".idx.away")
    glob_cfg = load_config(None, [f"data.paths=[{tmp_path / 'fw_shard-*'}]", f"data.tokenizer={tokenizer_dir}",
                                  f"data.cache_dir={tmp_path / 'cache'}", "training.seq_length=16"])
    with pytest.raises(UserError, match=rf"^data.paths entry '.*fw_shard-\*' matches the shards of a sharded "
                                        rf"preprocess, but shard 1 of 3 \({shards[1]}\) is missing; finish its "
                                        r"preprocess \(--shard I/N\) or name the shards you mean without a glob$"):
        resolve_data(glob_cfg)


def test_the_gigatoken_backend_writes_the_hf_tokenizers_bytes(tmp_path, texts, tokenizer_dir, write_jsonl):
    pytest.importorskip("gigatoken")
    from megatron_mtp.data.fast_tokenizer import fast_backend
    from megatron_mtp.data.tokenizer import load_tokenizer

    assert fast_backend(load_tokenizer(tokenizer_dir).backend, "auto") == ("gigatoken", None)
    path = write_jsonl(tmp_path / "c.jsonl", texts)
    with open(path, "a", encoding="utf-8") as fh:  # a lone surrogate escape: gigatoken's chunk goes the HF way
        fh.write('{"text": "bad \\ud800 text"}\n' + json.dumps({"text": "après 😀 日本 \t  x"}) + "\n")
    out = {}
    for backend in ("hf", "gigatoken"):
        for workers in (1, 2):
            stats = _run([path], tokenizer_dir, tmp_path / f"{backend}{workers}", workers=workers, skip_bad_lines=True,
                         tokenizer_backend=backend)
            assert stats.bad_lines == {"invalid Unicode in text": 1}
            out[backend, workers] = _files(tmp_path / f"{backend}{workers}")
    assert len(set(out.values())) == 1
