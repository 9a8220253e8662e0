"""A tiny run of the whole benchmark suite (``python -m bench --smoke``) so that the bench
code cannot rot: a 300-document corpus, the tiny random encoder, three queries a step."""

from __future__ import annotations

import gzip
import json
import importlib.util
import re
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
    assert "**smoke run**" in md  # the report says what it was
    assert steps["main"]["encoder"]["fingerprint"]  # what the codec verdict was measured with


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


# -- command lines and report rules (no database built) -----------------------------------


def test_report_help_exits_0():
    import subprocess

    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, "-m", "bench.report", "--help"], cwd=root,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "usage: python -m bench.report" in r.stdout and "--out" in r.stdout


def test_report_refuses_a_missing_results_file(tmp_path, capsys):
    from bench.report import main

    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "nothing.json")])
    assert exc.value.code == 2
    assert "no results file" in capsys.readouterr().err


@pytest.mark.parametrize("module, argv", [
    ("bench.replay", ["--src", "{tmp}/src", "--dst", "{tmp}/dst", "--tokens", "1000"]),
    ("bench.corpus_size", ["{tmp}/src"]),
    ("bench.probes", ["{tmp}/src"]),
    ("bench.compact_em", ["--ref", "{tmp}/src"]),
    *[(f"bench.{m}", []) for m in ("ann", "bm25_segments", "codecs", "gpu", "growth",
                                   "latency", "peers", "quality", "scale")],
    *[(f"bench.{m}", ["--db", "{tmp}/src"]) for m in ("codec_em", "ivf", "tune")],
    ("bench.shards", ["{tmp}/src"]),
])
def test_missing_data_stops_before_any_work(module, argv, tmp_path, capsys, monkeypatch):
    """A ``--data`` without cloze.jsonl stops at once (exit 2, what to pass), before the
    replay's build or any database is opened."""
    import importlib

    import npmdb

    opened = []
    monkeypatch.setattr(npmdb, "open", lambda *a, **k: opened.append(a) or 1 / 0)
    mod = importlib.import_module(module)
    args = [a.format(tmp=tmp_path) for a in argv] + ["--data", str(tmp_path / "no-data")]
    with pytest.raises(SystemExit) as exc:
        mod.main(args)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert re.search(r"no (\S+ or )*cloze\.jsonl( or \S+)* in", err) and "pass --data DIR" in err
    assert "npmdb/data/dev-small" in err
    assert not opened and not (tmp_path / "dst").exists()


def test_dev_data_default_is_found_from_the_repository():
    from bench import common

    root = Path(__file__).resolve().parent.parent
    assert common.DEV_DATA.is_absolute()
    assert common.DEV_DATA == root.parent / "shared" / "data" / "dev"
    assert (common.SMALL_DATA / "cloze.jsonl").is_file()


def test_quick_and_smoke_reports_never_replace_benchmarks_md(tmp_path):
    from bench.common import RESULTS
    from bench.report import OUT_MD, report_path

    full = {"quick": False, "smoke": False}
    assert report_path(full, "bench-dev", RESULTS) == OUT_MD
    assert report_path({"quick": True}, "bench-dev-small-quick", RESULTS) == \
        RESULTS / "bench-dev-small-quick.md"
    assert report_path({"quick": False, "smoke": True}, "bench-dev-small-smoke", RESULTS) == \
        RESULTS / "bench-dev-small-smoke.md"
    assert report_path({}, "bench-x-smoke", RESULTS) != OUT_MD  # an older JSON: by its name
    assert report_path(full, "bench-dev", tmp_path) == tmp_path / "BENCHMARKS.md"


def _codec_res(float16_em: float, pq_em: float) -> dict:
    row = lambda em, b: {"bytes_per_vector": b, "dim": 384, "em": em,  # noqa: E731
                         "em_delta": em - float16_em, "top1_agreement": 78.4,
                         "vector_bytes_per_token": b, "total_bytes_per_token": b + 1000,
                         "score_ms": 3.0}
    return {"data": "npmdb/data/dev-small", "machine": {"cpus": 2, "python": "3", "time": "t"},
            "steps": {"main": {"encoder": {"name": "enc", "fingerprint": "f" * 64}},
                      "codecs": {"k": 1024, "queries": 365,
                                 "index_bytes_per_token": {"hnsw": 1000, "bm25": 5},
                                 "codecs": {"float16": row(float16_em, 768),
                                            "pq": row(pq_em, 96)}}},
            "errors": {}, "total_s": 1.0}


def test_codec_target_is_decided_by_this_runs_codec_step():
    """Not by the committed codec_em file (another day, another encoder)."""
    from bench.report import render, targets

    (row,) = [r for r in targets(_codec_res(12.3, 10.1)) if r[0].startswith("a codec")]
    assert row[2] is False and "ΔEM -2.2" in row[1]
    assert "this run's codec step" in row[3] and "365 cloze queries" in row[3]
    assert "untrained" not in row[3]
    (row,) = [r for r in targets(_codec_res(12.3, 11.8)) if r[0].startswith("a codec")]
    assert row[2] is True
    (row,) = [r for r in targets(_codec_res(0.0, 0.0)) if r[0].startswith("a codec")]
    assert row[2] is None and "not measured in this run" in row[3]
    md = render(_codec_res(12.3, 10.1), {})
    assert "| a codec at ≤ dim/4 bytes per token losing ≤ 1 EM point |" in md
    if "bench.codec_em" in md:  # the committed own run is shown as such, not as a verdict
        assert "decided by this run's codec step alone" in md


def test_figures_agree_with_their_verdicts():
    from bench.common import vs_limit
    from bench.report import targets
    from bench.serve_load import render

    assert vs_limit(84.67, 85, 0) == "84.7" and vs_limit(86.2, 85, 0) == "86"
    assert vs_limit(1.304, 1.3, 2) == "1.304" and vs_limit(1.296, 1.3, 2) == "1.296"
    assert vs_limit(1.25, 1.3, 2) == "1.25" and vs_limit(1.3, 1.3, 2) == "1.30"
    res = {"data": "x", "machine": {}, "errors": {},
           "steps": {"ingest": {"ivf": {"ratio": 0.8467, "add_tok_s": 1.0,
                                        "encoder_tok_s": 1.0}},
                     "latency": {"stats": {"tokens": 200762},
                                 "breakdown": {"dense": {"EncodeQuery": 10.0}},
                                 "latency": [{"retrieval": "dense", "mode": "phrase",
                                              "k": 1024, "p50": 20.01, "p99": 30.0}]}}}
    rows = {r[0]: r for r in targets(res)}
    ivf = rows["ingest into a trained ivf (int4) ≥ 85% of the encoder-alone speed"]
    assert ivf[1] == "84.7%" and ivf[2] is False
    assert "dense p50 (k=1024, 201k tokens) ≤ 2× one query-encoder forward" in rows
    assert rows["dense p50 (k=1024, 201k tokens) ≤ 2× one query-encoder forward"][1] == \
        "×2.001"
    run = {"p50": 10.0, "p99": 20.0, "errors": 0, "rps": 5.0}
    md = render({"clients": 2, "docs": 1, "tokens": 1, "db": "d", "queries": 1, "seconds": 3,
                 "machine": {"cpus": 2, "time": "t"}, "target": 1.3, "errors": 0,
                 "modes": {"bm25": {"in_process_1": run, "api_1": run, "ratio_1": 1.304,
                                    "in_process_c": run, "api_c": run, "ratio_c": 1.0}}})
    assert "×1.304 (over 1.3×)" in md and "×1.00 |" in md


def test_short_serve_load_runs_do_not_replace_the_cited_results():
    from bench.serve_load import NAME, result_name

    assert result_name(20.0, 4, ["bm25", "dense"]) == NAME
    assert result_name(3.0, 2, ["bm25"]) == "serve_load-bm25-2c-3s"
    assert result_name(20.0, 4, ["bm25"]) != NAME
    assert result_name(10.0, 4, ["bm25", "dense"]) != NAME
    assert result_name(3.0, 2, ["bm25"], "mine") == "mine"


def test_plots_without_matplotlib_are_reported_once(tmp_path, capsys, monkeypatch):
    from bench import report

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    monkeypatch.setattr(report, "_WARNED", set())
    res = {"data": "x", "quick": True, "machine": {"cpus": 2, "python": "3", "time": "t"},
           "steps": {"latency": {"latency": [{"retrieval": "dense", "mode": "phrase", "k": 8,
                                              "p50": 1.0, "p99": 2.0}],
                                 "open_ms": {"p50": 0.3}}},
           "errors": {}, "total_s": 1.0}
    for _ in range(2):
        md, plots = report.write_report(res, "bench-x-quick", results_dir=tmp_path)
        assert plots == {} and md == tmp_path / "BENCHMARKS.md"
    assert capsys.readouterr().err.count("matplotlib is not installed") == 1


def test_main_database_build_prints_progress_lines_to_a_log(tiny_data, tiny_encoder, tmp_path,
                                                           capsys):
    """Where stderr is not a terminal (a log, ``| tee``), the build still reports its
    stages as lines."""
    from bench.__main__ import ensure_main_db

    info: dict = {}
    ensure_main_db(tiny_data, tmp_path / "work", info, encoder=str(tiny_encoder))
    err = capsys.readouterr().err
    assert "building the main database" in err
    assert "tokenize: " in err and "encode: " in err and " tok in " in err
    assert "\r" not in err and info["encoder"]["fingerprint"]


@pytest.mark.parametrize("module, argv, said", [
    ("bench", ["--only", "latency,foo"], "unknown step(s) foo"),
    ("bench", ["--skip", "bar"], "unknown step(s) bar"),
    ("bench.latency", ["--queries", "0"], "--queries: must be at least 1"),
    ("bench.latency", ["--ingest-docs", "-1"], "--ingest-docs: must be at least 1"),
    ("bench.latency", ["--ks", "64,abc"], "--ks: expected a whole number"),
    ("bench.quality", ["--limit", "-360"], "--limit: must be 0 or more"),
    ("bench.serve_load", ["--clients", "0"], "--clients: must be at least 1"),
    ("bench.serve_load", ["--seconds", "-1"], "--seconds: expected a positive number"),
    ("bench.serve_load", ["--modes", "foo"], "unknown mode(s) foo"),
])
def test_bad_arguments_stop_before_any_work(module, argv, said, capsys, monkeypatch):
    """They ran (a count of -1 took all but one document, 0 wrote NaN rows, a step named
    foo failed only after the main database's build) or ended in a traceback."""
    import importlib

    import npmdb

    opened = []
    monkeypatch.setattr(npmdb, "open", lambda *a, **k: opened.append(a) or 1 / 0)
    mod = importlib.import_module(module if module != "bench" else "bench.__main__")
    with pytest.raises(SystemExit) as exc:
        mod.main(argv)
    assert exc.value.code == 2 and said in capsys.readouterr().err
    assert not opened


def test_a_report_elsewhere_links_the_scale_plots_from_where_it_is(tmp_path):
    """Sections copied from other results link their plots from the repository's root:
    broken in a report under bench/results."""
    from bench.report import ROOT, _relink

    md = "![x](bench/results/corpus-size-a.png) and [y](bench/results/b.md)"
    assert _relink(md, ROOT.resolve()) == md
    assert _relink(md, (ROOT / "bench" / "results").resolve()) == \
        "![x](corpus-size-a.png) and [y](b.md)"
