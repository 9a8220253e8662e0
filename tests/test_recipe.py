"""The shipped encoder's recipe: corpus readers on hand-made package files, the held-out
split, and the train → export stages on a tiny database."""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pytest

from npmdb.errors import OperationalError, ProgrammingError
from npmdb.train import recipe, sources

B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def b64(n: int) -> str:
    out = ""
    while True:
        out = B64[n % 64] + out
        n //= 64
        if n == 0:
            return out


def write_dictd(root, name, entries):
    """A dictd database (index + gzip data, as dictzip files are) of ``(head, text)``."""
    blob, index = b"", []
    for head, text in entries:
        data = text.encode()
        index.append(f"{head}\t{b64(len(blob))}\t{b64(len(data))}")
        blob += data
    (root / f"{name}.index").write_text("\n".join(index) + "\n")
    with gzip.open(root / f"{name}.dict.dz", "wb") as f:
        f.write(blob)


def test_read_dictd_and_clean(tmp_path):
    write_dictd(tmp_path, "gcide", [
        ("00-database-info", "about"),
        ("Allocate", 'Allocate \\Al"lo*cate\\, v. t. [LL. allocatus.]\n   1. To distribute or '
                     "assign; to allot. --Burke.\n      [1913 Webster]\n"),
    ])
    got = list(sources.read_dictd("gcide", tmp_path))
    assert [h for h, _ in got] == ["Allocate"]          # the database's own entries skipped
    assert sources._definition(*got[0]) == "Allocate: 1. To distribute or assign; to allot."


def test_missing_package_is_a_clear_error(tmp_path):
    with pytest.raises(OperationalError, match="install its Debian package"):
        list(sources.read_dictd("foldoc", tmp_path))
    with pytest.raises(OperationalError, match="apt-get install wordnet-base"):
        list(sources.read_wordnet(tmp_path))


def _no_packages(monkeypatch, root):
    """The readers' package directories pointed at ``root`` (empty unless filled)."""
    for name, sub in (("DICTD", "dictd"), ("WORDNET", "wordnet"), ("FORTUNES", "fortunes")):
        (root / sub).mkdir(parents=True, exist_ok=True)
        monkeypatch.setattr(sources, name, root / sub)
    return root


def test_missing_packages_are_named_at_once(tmp_path, monkeypatch):
    """Every package the corpus stage reads, in one message, whatever this machine has."""
    root = _no_packages(monkeypatch, tmp_path / "usr")
    missing = recipe.missing_packages()
    assert missing[:6] == ["wordnet-base", "dict-gcide", "dict-foldoc", "dict-jargon",
                           "dict-devil", "fortunes"]
    assert "dict-freedict-deu-eng" in missing and "dict-freedict-eng-swe" in missing
    assert "dict-freedict-ara-eng" in missing and "dict-freedict-eng-jpn" in missing
    assert len(missing) == len(set(missing)) == 24  # the Makefile's ENCODER_PACKAGES
    for pos in ("noun", "verb", "adj", "adv"):
        (root / "wordnet" / f"data.{pos}").write_text("")
    write_dictd(root / "dictd", "gcide", [("a", "b")])
    (root / "fortunes" / "wisdom").write_text("x\n")
    left = recipe.missing_packages()
    assert "wordnet-base" not in left and "dict-gcide" not in left and "fortunes" not in left
    assert len(left) == 21
    with pytest.raises(OperationalError, match="make encoder-packages"):
        recipe.check_packages()


def test_recipe_cli_errors_are_messages_with_exit_2(tmp_path, monkeypatch, capsys):
    """Missing packages (all named), a stage run before the one whose output it reads:
    a message and exit status 2, no traceback, nothing built."""
    _no_packages(monkeypatch, tmp_path / "usr")
    out = tmp_path / "recipe"
    assert recipe.main(["--out", str(out), "--stage", "corpus", "--scale", "0.01"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "make encoder-packages" in err
    assert "wordnet-base" in err and "dict-freedict-ara-eng" in err and "24 of them" in err
    assert not (out / "corpus.jsonl.gz").exists()
    for stage in ("ingest", "train"):
        assert recipe.main(["--out", str(out), "--stage", stage]) == 2
        err = capsys.readouterr().err
        assert "corpus.jsonl.gz is missing" in err and "--stage corpus` first" in err
        assert "Traceback" not in err and not (out / "db").exists()
    assert recipe.main(["--out", str(out), "--stage", "focus"]) == 2
    assert "run --stage train first" in capsys.readouterr().err
    assert recipe.main(["--out", str(out), "--stage", "extend", "--extend-from",
                        str(tmp_path)]) == 2
    assert "focus.jsonl.gz is missing" in capsys.readouterr().err
    assert recipe.main(["--out", str(out), "--stage", "export",
                        "--export-to", str(tmp_path / "shipped")]) == 2
    err = capsys.readouterr().err
    assert "report.json is missing" in err and "--stage train" in err
    assert not (tmp_path / "shipped").exists()


def test_read_wordnet_in_the_sample_corpus_form(tmp_path):
    (tmp_path / "data.noun").write_text(
        "  1 licence header line\n"
        "09024668 15 n 02 Balearic_Islands 0 Baleares(p) 0 000 | an archipelago off Spain  \n"
        "09000001 15 n 01 Elsewhere 0 000 | a skipped synset  \n")
    for pos in ("verb", "adj", "adv"):
        (tmp_path / f"data.{pos}").write_text("")
    docs = list(sources.read_wordnet(tmp_path, skip={"wn:09000001"}))
    assert docs == [{"id": "wn:09024668", "title": "Balearic Islands",
                     "text": "Balearic Islands (Baleares): an archipelago off Spain"}]


def test_fortunes_keep_prose_only(tmp_path):
    prose = "The best way to predict the future is to invent it, said someone wise."
    art = "  /\\_/\\  ( o.o )  > ^ <  " * 3
    (tmp_path / "wisdom").write_text(f"{prose}\n%\n{art}\n%\nshort\n")
    docs = list(sources.read_fortunes(tmp_path))
    assert [d["text"] for d in docs] == [prose]


def test_held_out_split_is_a_stable_fifth(sample_corpus):
    ids = [d["id"] for d in sample_corpus]
    held = [i for i in ids if sources.held_out(i)]
    assert 0.15 < len(held) / len(ids) < 0.25
    assert held == [i for i in ids if sources.held_out(i)]      # deterministic


def test_pair_reversals_give_each_dictionary_pair_its_other_direction():
    docs = [
        {"id": "freedict-ell-eng:1", "title": "Κιότο", "text": "Κιότο: Kyoto"},
        {"id": "freedict-eng-jpn:2", "title": "エズラ",
         "text": "エズラ, エズラ記: Ezra (Jewish high priest; book of the Bible)"},
        {"id": "wn:1", "title": "Vulcan", "text": "Vulcan: (Roman mythology) god of fire"},
        {"id": "freedict-eng-rus:3", "title": "Корея", "text": "no colon here"},
        {"id": "freedict-eng-rus:4", "title": "Москва", "text": "Киев: Kiev"},
    ]
    rev = sources.pair_reversals(docs)
    assert rev == [
        {"id": "freedict-ell-eng:1:rev", "title": "Kyoto", "text": "Kyoto: Κιότο"},
        {"id": "freedict-eng-jpn:2:rev", "title": "Ezra",
         "text": "Ezra (Jewish high priest; book of the Bible): エズラ, エズラ記"},
    ]


def test_sample_corpus_pairs_occur_in_two_blocks_of_the_training_corpus(sample_corpus):
    # every foreign word of a kept dev-small pair occurs in a second document, so NPM's
    # masking can make it a target (translation was 0.0 without: never a target)
    kept = [d for d in sample_corpus if not sources.held_out(d["id"])
            and d["id"].startswith("freedict-")]
    rev = {d["id"]: d for d in sources.pair_reversals(kept)}
    assert kept and len(rev) == len(kept)
    for d in kept:
        head = d["text"].split(": ")[0]
        assert rev[d["id"] + ":rev"]["text"].endswith(": " + head)


def test_train_focus_and_export_stages_ship_a_loadable_fp16_checkpoint(
        tiny_encoder, sample_corpus, tmp_path, capsys):
    """The recipe's stages after ``corpus`` (which reads Debian packages) on hand-made
    corpora: the general stage from a base, the focus stage from its checkpoint, the
    export of the focused one with both stages recorded."""
    from npmdb.encoder import Encoder, fingerprint_dir

    out = tmp_path / "recipe"
    recipe._write_jsonl(out / "corpus.jsonl.gz", sample_corpus[:300])
    recipe._write_jsonl(out / "focus.jsonl.gz", sample_corpus[300:500])
    (out / "corpus.json").write_text(json.dumps({"documents": 300, "focus": {"documents": 200}}))
    target = tmp_path / "shipped"
    assert recipe.main(["--out", str(out), "--stage", "train", "--base", str(tiny_encoder),
                        "--steps", "2"]) == 0
    capsys.readouterr()
    assert recipe.main(["--out", str(out), "--stage", "export", "--export-to", str(target)]) == 2
    err = capsys.readouterr().err
    assert "report-focus.json is missing" in err and "--stage focus" in err
    assert "Traceback" not in err and not target.exists()
    assert recipe.main(["--out", str(out), "--stage", "focus", "--focus-steps", "3"]) == 0
    assert recipe.main(["--out", str(out), "--stage", "export",
                        "--export-to", str(target)]) == 0
    rec = json.loads((target / "recipe.json").read_text())
    assert rec["fingerprint"] == fingerprint_dir(target)
    assert rec["steps"] == 5 and list(rec["stages"]) == ["general", "focus"]
    assert [s for s, _ in rec["loss_curve"]][-1] == 5      # one curve over both stages
    assert rec["corpus"]["focus"]["documents"] == 200
    from safetensors.numpy import load_file
    assert {a.dtype for a in load_file(target / "model.safetensors").values()
            if a.dtype.kind == "f"} == {np.dtype("float16")}
    enc = Encoder(target)
    assert enc.info.name == recipe.SHIPPED_NAME and enc.info.hidden_size == 32
    assert enc.encode_query("Paris is the capital of [MASK].").start is not None


def test_extend_stage_continues_from_the_focused_checkpoint_and_is_exported(
        tiny_encoder, sample_corpus, tmp_path, monkeypatch, capsys):
    """The GPU stage (run here on the CPU, a few steps): over the focus corpus joined with
    the general one (a document in both once), from the focused checkpoint; the export
    records three stages and keeps the default it replaces; a new focus stage drops the
    stale extension."""
    import gzip

    import torch

    import npmdb.encoder as enc_mod
    from npmdb.encoder import fingerprint_dir

    target = tmp_path / "models" / "minilm-npm"
    monkeypatch.setattr(enc_mod, "shipped_encoder_dir", lambda: target)

    out = tmp_path / "recipe"
    recipe._write_jsonl(out / "corpus.jsonl.gz", sample_corpus[:300])
    recipe._write_jsonl(out / "focus.jsonl.gz", sample_corpus[250:400])  # 50 in both
    (out / "corpus.json").write_text(json.dumps({"documents": 300}))
    assert recipe.main(["--out", str(out), "--stage", "train", "--base", str(tiny_encoder),
                        "--steps", "2"]) == 0
    assert recipe.main(["--out", str(out), "--stage", "focus", "--focus-steps", "2"]) == 0
    with recipe.focus_db(out) as fdb:
        focused = fingerprint_dir(recipe.head_checkpoint(fdb))
    assert recipe.main(["--out", str(out), "--stage", "export",
                        "--export-to", str(target)]) == 0
    shipped_before = json.loads((target / "recipe.json").read_text())["fingerprint"]
    assert recipe.main(["--out", str(out), "--stage", "extend", "--extend-corpus", "all",
                        "--extend-steps", "3", "--extend-batch", "4",
                        "--extend-option", "exclude_repeats=true",
                        "--max-seconds", "600"]) == 0
    with gzip.open(out / "extend.jsonl.gz", "rt") as f:
        ids = [json.loads(line)["id"] for line in f]
    assert len(ids) == len(set(ids)) == 400
    rep = json.loads((out / "report-extend.json").read_text())
    assert rep["steps"] == 3 and rep["corpus"] == "all"
    assert rep["start"]["fingerprint"] == focused and rep["config"]["batch_blocks"] == 4
    assert rep["config"]["exclude_repeats"] is True
    assert rep["options"] == {"exclude_repeats": True}
    assert recipe.main(["--out", str(out), "--stage", "export",
                        "--export-to", str(target)]) == 0
    rec = json.loads((target / "recipe.json").read_text())
    assert list(rec["stages"]) == ["general", "focus", "extend"] and rec["steps"] == 7
    # the default it replaced is kept beside it, under its fingerprint
    kept = target.with_name(f"minilm-npm-{shipped_before[:8]}")
    assert fingerprint_dir(kept) == shipped_before
    assert enc_mod.shipped_encoders() == {shipped_before: kept, rec["fingerprint"]: target}
    assert rec["stages"]["extend"]["device"] == rep["device"]
    with recipe.extend_db(out) as edb:
        assert fingerprint_dir(recipe.head_checkpoint(edb)) != focused
    # extending an exported checkpoint records how that one was made: the stages nest
    assert recipe.main(["--out", str(out), "--stage", "extend", "--extend-from", str(target),
                        "--extend-steps", "2", "--extend-batch", "4"]) == 0
    again = json.loads((out / "report-extend.json").read_text())["start"]
    assert again["fingerprint"] == rec["fingerprint"]
    assert again["stages"] == json.loads(json.dumps(rec["stages"]))
    broken = tmp_path / "broken"
    shutil.copytree(target, broken)
    (broken / "recipe.json").write_text("{not json")
    capsys.readouterr()
    assert recipe.main(["--out", str(out), "--stage", "extend", "--extend-from", str(broken),
                        "--extend-steps", "2", "--extend-batch", "4"]) == 2
    assert "not a recipe.json that npmdb wrote" in capsys.readouterr().err
    assert (out / "report-extend.json").exists()  # the refused run kept the last extension
    # a new focused checkpoint makes the extension stale: it is dropped
    assert recipe.main(["--out", str(out), "--stage", "focus", "--focus-steps", "2"]) == 0
    assert not (out / "report-extend.json").exists() and not (out / "extend-db").exists()
    # --stage all runs the extension only where CUDA is present (unless told)
    assert ("extend" in recipe._stages("all", "auto")) == torch.cuda.is_available()
    assert "extend" in recipe._stages("all", "yes")
    assert "extend" not in recipe._stages("all", "no")
    with pytest.raises(ProgrammingError, match="unknown extend corpus"):
        recipe.extend_corpus(out, "wiki")


def test_extend_options_are_typed_and_a_malformed_one_is_a_usage_error(capsys):
    from npmdb.arguments import parse_assignments

    assert parse_assignments(["a=true", "b=3", "c=0.5", "d=word", "e=False"], "--x") == {
        "a": True, "b": 3, "c": 0.5, "d": "word", "e": False}
    with pytest.raises(SystemExit):
        recipe.main(["--stage", "extend", "--extend-option", "exclude_repeats"])
    assert "--extend-option wants NAME=VALUE, got 'exclude_repeats'" in capsys.readouterr().err


def test_the_base_encoder_stays_selectable_by_name():
    from npmdb.encoder import BASE_NAME, base_encoder_path, describe

    for name in ("base", BASE_NAME):
        info = describe(name)
        assert info.name == BASE_NAME and info.path == str(base_encoder_path().resolve())


def test_the_shipped_encoder_is_the_default_and_matches_its_recorded_fingerprint():
    """npmdb ships its own trained encoder (``make encoder`` rebuilds it)."""
    from npmdb.encoder import (
        Encoder, default_encoder_path, fingerprint_dir, shipped_encoder_dir, shipped_encoders,
    )

    d = shipped_encoder_dir()
    rec = json.loads((d / "recipe.json").read_text())
    assert fingerprint_dir(d) == rec["fingerprint"]          # the weights are the recorded ones
    # the defaults of earlier releases, kept for the databases made with them
    kept = shipped_encoders()
    assert kept[rec["fingerprint"]] == d and len(kept) >= 2
    assert all(fingerprint_dir(p) == fp for fp, p in kept.items())
    assert default_encoder_path() == d
    assert rec["steps"] > 0 and rec["corpus"]["documents"] > 0 and rec["loss_curve"]
    enc = Encoder(d)
    assert enc.info.name == recipe.SHIPPED_NAME
    qv = enc.encode_query("Salem is the capital of [MASK].")
    assert qv.start.shape == (enc.info.hidden_size,) and np.isfinite(qv.start).all()


def test_script_pairs_read_both_dictionary_directions(tmp_path):
    write_dictd(tmp_path, "freedict-eng-ell", [
        ("kabul", "Kabul /kəbul/\n\nΚαμπούλ\n"),
        ("goods", "goods /ɡʊdz/ <n>\nαγαθά, εμπορεύματα\n"),
        ("latin only", "latin only /x/\nnot greek\n"),            # no Greek side: skipped
    ])
    write_dictd(tmp_path, "freedict-ell-eng", [
        ("Κιότο", "Κιότο /cˈoto/ <prop>\nKyoto\n"),
        ("αγαθιάρης", "αγαθιάρης /ˌaɣaθiˈaris/ <adj>\n1. gullible\n2. naive\n"),
    ])
    got = list(sources.script_pairs("ell", tmp_path))
    assert got == [("Καμπούλ", "Kabul"), ("αγαθά", "goods"), ("Κιότο", "Kyoto"),
                   ("αγαθιάρης", "gullible")]


def test_script_pair_documents_put_each_word_in_two_blocks_and_keep_sample_pairs_out(tmp_path):
    import random

    write_dictd(tmp_path, "freedict-eng-ell", [
        ("kabul", "Kabul /kəbul/\n\nΚαμπούλ\n"), ("kyoto", "Kyoto /x/\n\nΚιότο\n"),
        ("goods", "goods /ɡʊdz/ <n>\nαγαθά\n"),
        ("long", "a long definition here /x/\nένα δύο τρία τέσσερα\n"),   # > 3 words
    ])
    write_dictd(tmp_path, "freedict-ell-eng", [])
    sample = [{"id": "freedict-ell-eng:1", "title": "Κιότο", "text": "Κιότο: Kyoto"},
              {"id": "wn:1", "title": "Goods", "text": "Goods: things"}]
    exclude = sources.pair_words(sample)
    assert exclude == {"κιότο", "kyoto"}          # dictionary pairs only, both sides
    docs = sources.script_pair_documents("ell", 10, random.Random(0), exclude=exclude,
                                         root=tmp_path)
    texts = [d["text"] for d in docs]
    # the name first, then the common word; each pair in the dictionary's form and an
    # encyclopedia's, which names the language
    assert texts == ["Καμπούλ: Kabul", "Kabul (Greek: Καμπούλ)",
                     "αγαθά: goods", "goods (Greek: αγαθά)"]
    assert len({d["id"] for d in docs}) == len(docs)
    one = sources.script_pair_documents("ell", 1, random.Random(0), root=tmp_path)
    assert [d["title"] for d in one] == ["Καμπούλ", "Kabul"] or \
        [d["title"] for d in one] == ["Κιότο", "Kyoto"]


def test_read_wikipedia_gives_plain_passages_cut_at_sentences(tmp_path):
    import bz2
    import zipfile

    page = ('<page><title>{t}</title><ns>0</ns><id>{i}</id><revision><id>1</id>'
            '<text xml:space="preserve">{x}</text></revision></page>')
    body = ("'''Algiers''' is the [[capital city|capital]] of [[Algeria]].{{cite web|x=1}} "
            "It lies on the Mediterranean coast of North Africa. " * 6).strip()
    xml = ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">'
           + page.format(t="Algiers", i=7, x=body)
           + page.format(t="Alger", i=8, x="#REDIRECT [[Algiers]]") + "</mediawiki>")
    dump = tmp_path / "dump.xml.bz2"
    dump.write_bytes(bz2.compress(xml.encode()))
    got = list(sources.read_wikipedia(dump, max_words=40))
    assert [d["id"] for d in got] == ["enwiki:7:0", "enwiki:7:1", "enwiki:7:2"]
    assert all(d["title"] == "Algiers" for d in got)
    assert got[0]["text"].startswith("Algiers is the capital of Algeria. It lies on")
    assert all(len(d["text"].split()) <= 40 and d["text"].endswith(".") for d in got)
    assert "[[" not in got[0]["text"] and "cite" not in got[0]["text"]
    wheel = tmp_path / "gensim-0-py3-none-any.whl"        # read out of the wheel as well
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(sources.WIKIPEDIA_MEMBER, dump.read_bytes())
    assert list(sources.read_wikipedia(wheel, max_words=40)) == got
    with pytest.raises(OperationalError, match="pip download --no-deps gensim"):
        list(sources.read_wikipedia(tmp_path / "missing.whl"))
