"""A tiny run of the whole benchmark suite (``python -m bench --smoke``) so that the bench
code cannot rot: a 300-document corpus, the tiny random encoder, three queries a step."""

from __future__ import annotations

import gzip
import json
import importlib.util
import sys
from pathlib import Path

import pytest

SAMPLE = Path(__file__).resolve().parent.parent / "npmdb" / "data" / "dev-small"


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory, sample_corpus) -> Path:
    d = tmp_path_factory.mktemp("bench-data") / "tiny"
    d.mkdir()
    with gzip.open(d / "corpus.jsonl.gz", "wt", encoding="utf-8") as fh:
        for doc in sample_corpus[:300]:
            fh.write(json.dumps(doc) + "\n")
    lines = (SAMPLE / "cloze.jsonl").read_text(encoding="utf-8").splitlines()[:8]
    (d / "cloze.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return d


def test_bench_suite_smoke(tiny_data, tiny_encoder, tmp_path):
    from bench.__main__ import main

    args = ["--data", str(tiny_data), "--work", str(tmp_path / "work"), "--smoke",
            "--encoder", str(tiny_encoder), "--results", str(tmp_path / "results")]
    have_lance = importlib.util.find_spec("lancedb") and importlib.util.find_spec("lance")
    if not have_lance:
        args += ["--skip", "peers"]
    rc = main(args)
    res = json.loads((tmp_path / "results" / "bench-tiny-smoke.json").read_text())
    assert res["errors"] == {}, res["errors"]
    assert rc == 0
    steps = res["steps"]
    assert {r["retrieval"] for r in steps["latency"]["latency"]} == {"dense", "bm25", "hybrid"}
    assert steps["latency"]["open_ms"]["p50"] >= 0
    assert steps["ingest"]["ratio"] > 0
    assert steps["ingest"]["ivf"]["ratio"] > 0 and steps["ingest"]["ivf"]["index"] == "ivf"
    for run in (steps["ingest"], steps["ingest"]["ivf"]):  # the add's stages, timed
        assert set(run["stages_s"]) == {"prepare", "encode", "finish"}
    rows = steps["ann"]["recall"]["rows"]
    assert rows and all(0.0 <= r["recall"] <= 1.0 for r in rows)
    assert any(r["default"] for r in rows)
    cod = steps["codecs"]["codecs"]
    assert set(cod) == {"float16", "int8", "pq"}
    assert cod["float16"]["top1_agreement"] == 100.0
    assert cod["pq"]["bytes_per_vector"] == 8 and cod["int8"]["bytes_per_vector"] == 36
    assert [r["fraction"] for r in steps["growth"]["rows"]] == [0.1, 0.3, 1.0]
    if have_lance:
        assert steps["peers"]["lance"]["n"] == 3
    md = (tmp_path / "results" / "BENCHMARKS.md").read_text()
    assert "## Targets" in md and "| dense | phrase | 8 |" in md
    assert "## Vector codecs" in md and "## Growth with corpus size" in md


def test_replay_and_corpus_size_scale_step(tiny_data, tiny_encoder, tmp_path, sample_corpus):
    """bench.replay writes copies through the segment writer; bench.corpus_size measures
    each database in a fresh process and plots cost against size."""
    import npmdb
    from bench.corpus_size import plot, render, run
    from bench.replay import merge, replay
    from npmdb.storage import ivf

    src = tmp_path / "src"
    with npmdb.open(src, encoder=tiny_encoder, index="ivf", codec="int4", progress=False) as db:
        db.add(sample_corpus[:300])
        n = db.stats()["tokens"]
    big = tmp_path / "big"
    rec = replay(src, big, 3 * n, "ivf", "int4", 0.05, log=lambda m: None)
    assert rec["copies"] == 3
    merged = tmp_path / "merged"  # bench.replay --merge: the copy optimized into one segment
    m = merge(big, merged, log=lambda msg: None)
    assert m["merged_segments"] == 3 and m["optimize_s"] > 0
    assert m["optimize"].startswith("optimize: merged segments [1, 2, 3]")
    in_place = tmp_path / "in-place"  # --dst the same as --src: optimized where it lies
    replay(src, in_place, 3 * n, "ivf", "int4", 0.05, log=lambda m: None)  # 4,096+ entries
    r = merge(in_place, in_place, log=lambda msg: None, retrain=True)
    assert r["merged_segments"] == 3 and "IVF template retrained" in r["optimize"]
    grouped = tmp_path / "grouped"  # --segment-copies 2: copies 1-2 in one segment, 3 alone
    g = replay(src, grouped, 3 * n, "ivf", "int4", 0.05, log=lambda m: None, segment_copies=2)
    with npmdb.open(grouped, readonly=True, progress=False) as db, \
            npmdb.open(big, readonly=True, progress=False) as one:
        assert g["segment_copies"] == 2 and db.stats()["segments"] == 2
        assert db.stats()["tokens"] == 3 * n and db.stats()["docs"] == one.stats()["docs"]
        q = "The capital of France is [MASK]."
        assert [a.text for a in db.fill_mask(q, k=16, exact=True)] == \
            [a.text for a in one.fill_mask(q, k=16, exact=True)]
    out = run([src, big, merged], tiny_data, k=16, queries=3, rounds=1, log=lambda m: None)
    small_row, big_row, merged_row = out["rows"]
    assert big_row["tokens"] == 3 * small_row["tokens"] and big_row["segments"] == 3
    assert big_row["index"] == {"ivf": 3} and big_row["p50"] > 0 and big_row["anon_mb"] > 0
    assert merged_row["tokens"] == big_row["tokens"] and merged_row["segments"] == 1
    listed = tmp_path / "listed"  # --lists 32: the template's coarse lists, as given
    replay(src, listed, 3 * n, "ivf", "int4", 0.05, log=lambda m: None, lists=32,
           segment_copies=3)  # one segment with enough rows (ivf.MIN_TRAIN) for a template
    with npmdb.open(listed, readonly=True, progress=False) as db:
        assert ivf.template_nlist(ivf.read_template(db.env, 0)) == 32
    searched = run([listed], tiny_data, k=16, queries=3, rounds=1, log=lambda m: None,
                   ivf={"refine": 6})  # corpus_size --ivf refine=6
    assert searched["ivf"] == {"refine": 6} and searched["rows"][0]["p50"] > 0
    assert "Searched with IvfParams(refine=6)." in render(searched)
    out["name"] = "tiny"
    out["plot"] = plot(out, tmp_path / "size.png")
    if importlib.util.find_spec("matplotlib"):  # the bench extra (make test does not install it)
        assert (tmp_path / "size.png").exists()
    assert "| big | " in render(out).replace("| big |", "| big | ")


def test_shards_bench_step(tiny_data, tiny_encoder, tmp_path, sample_corpus):
    """bench.shards: one process and sharded handles answer the same queries; the table
    and the stage times render (in-process shards here: the Ray ones are in
    tests/test_shards.py)."""
    import npmdb
    from bench.common import machine
    from bench.shards import render, run

    path = tmp_path / "db"
    with npmdb.open(path, encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:150])
        db.add(sample_corpus[150:300])
    out = run(path, tiny_data, [2], "local", 3, 2, 32, 1, log=lambda m: None)
    one, two = out["rows"]
    assert one["shards"] == 0 and two["shards"] == 2 and out["segments"] == 2
    assert two["latency"]["p50"] > 0 and two["qps"] > 0 and "Exchange" in two["stages"]
    out["machine"] = machine()
    md = render(out)
    assert "| 2 | local |" in md and "Exchange" in md


def test_gpu_check_runs_its_cpu_smoke(tiny_data, tiny_encoder, tmp_path, monkeypatch):
    """``python -m bench.gpu`` (the one command for a short GPU lease) on the CPU: the
    training timing once, its result files written."""
    from bench import common
    from bench.gpu import main

    monkeypatch.setattr(common, "RESULTS", tmp_path)
    assert main(["--data", str(tiny_data), "--docs", "120", "--steps", "4", "--batch", "6",
                 "--warmup", "1", "--encoder", str(tiny_encoder)]) == 0
    res = json.loads((tmp_path / "gpu.json").read_text())
    run = res["training"][0]  # npmdb's forward passes; with CUDA also cuDNN's for comparison
    assert len(res["training"]) == (2 if res["cuda"] else 1) and not run["cudnn_attention"]
    assert run["steps"] == 4 and run["steps_per_s"] > 0
    if not res["cuda"]:
        assert "| npmdb (no cuDNN attention) | cpu | 6 | 4 |" in (tmp_path / "gpu.md").read_text()


def test_report_renders_partial_results():
    """The report copes with a run whose steps failed or were skipped."""
    from bench.report import render, targets

    res = {"data": "x", "quick": True, "machine": {"cpus": 2, "python": "3", "time": "t"},
           "steps": {"main": {}}, "errors": {"latency": "boom"}, "total_s": 1.0}
    assert targets(res) == []
    md = render(res, {})
    assert "Steps that failed" in md and "latency" in md


def _cap_unavailable() -> str | None:
    from bench.memcap import MemoryCap

    return MemoryCap.available()


@pytest.mark.skipif(_cap_unavailable() is not None,
                    reason="no writable cgroup memory controller (needs root on Linux)")
def test_memory_cap_limits_the_child_and_the_scale_step_reports_capped_runs(
        tiny_data, tiny_encoder, tmp_path, sample_corpus):
    """bench.memcap's cgroup really bounds a child (one that allocates past the limit is
    killed; one within it runs), and corpus_size's capped runs land in its report."""
    import subprocess

    import npmdb
    from bench.corpus_size import render, run
    from bench.memcap import MemoryCap

    grab = "import numpy as np; a = np.ones(int({mb}) * 2**20, np.uint8); print(a.sum())"
    with MemoryCap(200) as cap:
        small = subprocess.run([sys.executable, "-c", grab.format(mb=50)],
                               preexec_fn=cap.preexec, capture_output=True)
        big = subprocess.run([sys.executable, "-c", grab.format(mb=400)],
                             preexec_fn=cap.preexec, capture_output=True)
    assert small.returncode == 0 and big.returncode != 0
    src = tmp_path / "src"
    with npmdb.open(src, encoder=tiny_encoder, index="ivf", codec="int4", progress=False) as db:
        db.add(sample_corpus[:100])
    out = run([src], tiny_data, k=16, queries=3, rounds=1, cap_ratio=1.5, log=lambda m: None)
    row = out["rows"][0]
    assert out["cap_mb"] == pytest.approx(1.5 * row["rss_mb"])
    assert row["capped"]["p50"] > 0 and len(row["capped"]["pass_p50"]) == 2
    assert row["capped"]["peak_mb"] is None or row["capped"]["peak_mb"] <= out["cap_mb"] + 1
    out["name"] = "tiny"
    assert "Under a memory limit" in render(out)


def test_bm25_segments_bench_step(tiny_data, tiny_encoder, tmp_path, sample_corpus):
    """bench.bm25_segments: the corpus in 1, 4 and 16 adds answers as one segment."""
    import npmdb
    from bench.bm25_segments import render, run

    main_db = tmp_path / "main"
    with npmdb.open(main_db, encoder=tiny_encoder, progress=False) as db:
        db.add(sample_corpus[:300])
    out = run(main_db, tiny_data, tmp_path, limit=8, log=lambda m: None)
    assert [r["segments"] for r in out["layouts"].values()] == [1, 4, 16]
    # the same scores (documents tied at the cut may differ: block order breaks ties)
    assert all(r["agree"] == 8 for r in out["layouts"].values())
    assert "| 16 | 16 | " in render(out) and " | 8 / 8 | " in render(out)
