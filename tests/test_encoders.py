"""Any local Hugging Face encoder directory works: BERT (the default's tokenizer), RoBERTa
(byte-level BPE, ``<mask>``) and MPNet. The RoBERTa tokenizer is trained here on the sample
corpus (nothing is downloaded); the models are tiny and randomly initialised."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import npmdb
from npmdb.boundaries import fold

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib
from conftest import make_tiny_encoder  # noqa: E402


def _texts(sample_corpus, n=400):
    return [d["text"] for d in sample_corpus[:n]]


def make_roberta(path, texts):
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=2000, min_frequency=2,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    path.mkdir(parents=True)
    from tokenizers.processors import RobertaProcessing

    inner = bpe._tokenizer
    inner.post_processor = RobertaProcessing(("</s>", inner.token_to_id("</s>")),
                                             ("<s>", inner.token_to_id("<s>")))
    tok = RobertaTokenizerFast(tokenizer_object=inner, bos_token="<s>", eos_token="</s>",
                               sep_token="</s>", cls_token="<s>", unk_token="<unk>",
                               pad_token="<pad>", mask_token="<mask>")
    tok.save_pretrained(path)
    torch.manual_seed(0)
    cfg = RobertaConfig(vocab_size=tok.vocab_size + 8, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=514,
                        pad_token_id=tok.pad_token_id)
    RobertaModel(cfg).save_pretrained(path, safe_serialization=True)
    return path


def make_mpnet(path):
    import shutil

    import torch
    from transformers import MPNetConfig, MPNetModel, MPNetTokenizerFast

    from npmdb.encoder import default_encoder_path

    path.mkdir(parents=True)
    shutil.copy(default_encoder_path() / "vocab.txt", path / "vocab.txt")
    words = (path / "vocab.txt").read_text(encoding="utf-8").splitlines()
    vocab = {w: i for i, w in enumerate(words)}
    for special in ("<s>", "</s>", "<pad>", "<mask>"):
        vocab.setdefault(special, len(vocab))
    tok = MPNetTokenizerFast(vocab=vocab)
    tok.save_pretrained(path)
    torch.manual_seed(0)
    cfg = MPNetConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2,
                      num_attention_heads=2, intermediate_size=64, max_position_embeddings=514)
    MPNetModel(cfg).save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def encoders(tmp_path_factory, sample_corpus):
    root = tmp_path_factory.mktemp("encoders")
    return {"roberta": make_roberta(root / "roberta", _texts(sample_corpus, 2000)),
            "mpnet": make_mpnet(root / "mpnet")}


@pytest.mark.parametrize("kind", ["roberta", "mpnet"])
def test_other_encoder_families_store_and_answer(tmp_path, encoders, sample_corpus, kind):
    enc = encoders[kind]
    with npmdb.open(tmp_path / "db", encoder=enc, progress=False) as db:
        docs = sample_corpus[:150] + [{"id": "planted", "text":
                                       "Hagios Demetrios is a church in Thessaloniki, Greece."}]
        db.add(docs)
        assert db.encoder.info.model_type == kind
        by_id = {d["id"]: d for d in docs}
        for q in ("Hagios Demetrios is located in <mask>.", "Hagios Demetrios is located in [MASK]."):
            for retrieval in ("dense", "bm25"):
                for mode in ("phrase", "token"):
                    res = db.fill_mask(q, retrieval=retrieval, mode=mode, top=5, k=64)
                    assert res.answers
                    for a in res:
                        for e in a.evidence:
                            assert fold(by_id[e.doc_id]["text"][e.start:e.end]) == fold(a.text)
        res = db.fill_mask("Hagios Demetrios is located in <mask>.", retrieval="bm25", top=100)
        assert {"thessaloniki", "greece"} <= {fold(a.text) for a in res}


def test_special_tokens_written_in_text_are_text(tiny_encoder):
    """"[MASK]", "[CLS]", "[PAD]" in a document, or beside a query's mask, are characters:
    stored as word pieces, never as control tokens; the query's own mask goes in by id."""
    from npmdb.encoder import Encoder

    e = Encoder(tiny_encoder)
    text = "BERT writes [MASK] or [CLS] here, then [PAD]."
    tt = e.tokenize(text)
    assert not set(int(i) for i in tt.ids) & e.special_ids
    assert "".join(text[s:t] for s, t in tt.offsets).count("MASK") == 1
    ids, pos = e.query_ids("The token [CLS] starts [MASK].", "phrase")
    assert [i for i, t in enumerate(ids) if int(t) in e.special_ids] == [0, *pos, len(ids) - 1]


def test_roberta_offsets_have_no_leading_space(encoders):
    from npmdb.encoder import Encoder

    e = Encoder(encoders["roberta"])
    text = "Bank of America is in Charlotte, North Carolina."
    tt = e.tokenize(text)
    for s, t in tt.offsets:
        piece = text[s:t]
        assert piece and piece == piece.strip()
    ids, pos = e.query_ids("It is in <mask>.", "phrase")
    assert [int(ids[p]) for p in pos] == [e.mask_id, e.mask_id]
    assert e.tokenizer.convert_ids_to_tokens(int(ids[pos[0] - 1])) == "Ġin"


def test_opening_with_a_different_family_is_refused(tmp_path, encoders, tiny_encoder):
    with npmdb.open(tmp_path / "db", encoder=encoders["roberta"], progress=False) as db:
        db.add(["Paris is in France."])
    with pytest.raises(npmdb.ProgrammingError, match="was built with encoder"):
        npmdb.open(tmp_path / "db", encoder=tiny_encoder)
    with npmdb.open(tmp_path / "db", progress=False) as db:  # None: the recorded encoder
        assert db.fill_mask("Paris is in <mask>.", retrieval="bm25").answers


def test_a_database_keeps_an_earlier_release_default_encoder(tmp_path, monkeypatch, sample_corpus):
    """An upgrade replaces the shipped default (``models/minilm-npm``) and keeps the one
    before it as ``models/minilm-npm-<fingerprint>``: a database made with the earlier one
    answers with it, found by the fingerprint its recipe.json records; without it the
    database refuses to answer rather than mix encoders."""
    import json
    import shutil

    import npmdb.encoder as enc_mod

    models = tmp_path / "models"
    monkeypatch.setattr(enc_mod, "shipped_encoder_dir", lambda: models / "minilm-npm")

    def release(seed):   # a shipped default as the recipe's export writes one
        d = make_tiny_encoder(models / "minilm-npm", seed=seed)
        config = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**config, "_name_or_path": enc_mod.SHIPPED_NAME}))
        fp = enc_mod.fingerprint_dir(d)
        (d / "recipe.json").write_text(json.dumps({"fingerprint": fp}))
        return d, fp

    old, old_fp = release(1)
    assert enc_mod.default_encoder_path() == old
    with npmdb.open(tmp_path / "db", progress=False) as db:   # the default encoder
        db.add(sample_corpus[:60])
        before = db.fill_mask("The capital of France is [MASK].", retrieval="dense").to_list()
        assert db.encoder.info.fingerprint == old_fp

    # the upgrade: a new default in place, the earlier one kept under its fingerprint
    kept = models / f"minilm-npm-{old_fp[:8]}"
    shutil.move(str(old), str(kept))
    new, new_fp = release(2)
    assert new_fp != old_fp and enc_mod.shipped_encoders() == {old_fp: kept, new_fp: new}
    with npmdb.open(tmp_path / "db", progress=False) as db:
        assert db.encoder.path == kept.resolve()
        assert db.fill_mask("The capital of France is [MASK].",
                            retrieval="dense").to_list() == before
    with npmdb.open(tmp_path / "new-db", progress=False) as db:  # new databases: the new one
        db.add(sample_corpus[:5])
        assert db.encoder.info.fingerprint == new_fp

    shutil.rmtree(kept)
    with npmdb.open(tmp_path / "db", progress=False) as db:
        with pytest.raises(npmdb.OperationalError,
                           match="default encoder of another npmdb release .* does not ship"):
            db.fill_mask("The capital of France is [MASK].", retrieval="dense")


def test_a_database_finds_the_installed_base_after_its_environment_moved(
        tmp_path, monkeypatch, sample_corpus):
    """A database made with the untrained base records the base's directory inside a
    virtual environment; after the environment is rebuilt elsewhere the recorded directory
    is gone and the installed base, with the same sha256, answers instead."""
    import shutil

    import npmdb.encoder as enc_mod

    old_env = make_tiny_encoder(tmp_path / "old-venv" / "model", seed=3)
    with npmdb.open(tmp_path / "db", encoder=old_env, progress=False) as db:
        db.add(sample_corpus[:40])
        before = db.fill_mask("The capital of France is [MASK].", retrieval="dense").to_list()
    new_env = tmp_path / "new-venv" / "model"
    shutil.copytree(old_env, new_env)
    shutil.rmtree(old_env)
    monkeypatch.setattr(enc_mod, "base_encoder_path", lambda: new_env)
    with npmdb.open(tmp_path / "db", progress=False) as db:
        assert db.fill_mask("The capital of France is [MASK].",
                            retrieval="dense").to_list() == before
        assert db.encoder.path == new_env.resolve()
    # another base installed: the database refuses rather than mix encoders
    shutil.rmtree(new_env)
    make_tiny_encoder(new_env, seed=4)
    with npmdb.open(tmp_path / "db", progress=False) as db:
        with pytest.raises(npmdb.OperationalError, match="is gone and no installed encoder"):
            db.fill_mask("The capital of France is [MASK].", retrieval="dense")


def test_white_space_tokens_are_never_answers(tmp_path, encoders):
    """A byte-level tokenizer makes tokens of white space alone ("Ċ" for a newline, "Ġ"
    before a double space); trimmed, they span nothing. They are boundaries, never words:
    no answer is empty or starts or ends with white space, in either mode."""
    from npmdb.boundaries import VALID_END, VALID_START, token_flags
    from npmdb.encoder import Encoder

    text = "Salem is the capital of Oregon.\n\nThe  city  of Berlin  lies in Germany."
    tt = Encoder(encoders["roberta"]).tokenize(text)
    empty = [i for i, (s, t) in enumerate(tt.offsets) if s == t]
    assert empty  # the tokenizer does make them
    flags = token_flags(text, np.asarray(tt.offsets))
    assert not any(flags[i] for i in empty)
    assert all(text[s:t].strip() == text[s:t] for (s, t), f in zip(tt.offsets, flags)
               if f & (VALID_START | VALID_END))
    with npmdb.open(tmp_path / "db", encoder=encoders["roberta"], progress=False) as db:
        db.add([text, "Madrid  is in Spain.\n\n\nLisbon is in Portugal.  "])
        for q in ("The capital of Oregon is [MASK].", "Lisbon is in [MASK]."):
            for mode in ("phrase", "token"):
                for retrieval in ("dense", "bm25"):
                    res = db.fill_mask(q, mode=mode, retrieval=retrieval, top=50, k=64)
                    assert res.answers
                    assert all(a.text and a.text == a.text.strip() for a in res), \
                        [a.text for a in res]


def test_blocks_fit_the_encoders_positions(tmp_path, encoders):
    """A block and its [CLS] and [SEP] fit the model: the default block length shrinks to
    an encoder with fewer positions, a longer one asked for is refused before anything is
    written, and RoBERTa-style models (MPNet too) lose the positions before their first."""
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from conftest import make_tiny_encoder
    from npmdb.encoder import Encoder, block_limit

    short = make_tiny_encoder(tmp_path / "short", positions=128)
    assert block_limit(short) == 126
    long_text = " ".join(f"word{i}" for i in range(400))
    with npmdb.open(tmp_path / "a", encoder=short, progress=False) as db:
        assert db.stats()["config"]["block_len"] == 126
        db.add([long_text])
        assert db.fill_mask("word3 word4 [MASK].", retrieval="bm25").answers
        assert db.fill_mask(long_text[:3000] + " [MASK].", retrieval="dense").answers
    with pytest.raises(npmdb.ProgrammingError, match=r"block_len 256 is more than the "
                                                     r"encoder .* pass block_len=126 or less"):
        npmdb.open(tmp_path / "b", encoder=short, block_len=256)
    assert not (tmp_path / "b").exists()
    for kind in ("roberta", "mpnet"):  # 514 positions, 2 of them before the first token's
        assert block_limit(encoders[kind]) == 510
        assert Encoder(encoders[kind]).max_positions == 512
    with pytest.raises(npmdb.ProgrammingError, match="pass block_len=510"):
        npmdb.open(tmp_path / "c", encoder=encoders["mpnet"], block_len=511)
    # a config that names its width d_model (Funnel's) is read; one with no width is refused
    cfg = json.loads((short / "config.json").read_text())
    cfg["d_model"] = cfg.pop("hidden_size")
    odd = tmp_path / "odd"
    odd.mkdir()
    for f in short.iterdir():
        (odd / f.name).write_bytes(f.read_bytes())
    (odd / "config.json").write_text(json.dumps(cfg))
    from npmdb.encoder import describe
    assert describe(odd).hidden_size == 32
    del cfg["d_model"]
    (odd / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(npmdb.NotSupportedError, match="cannot tell the vector width"):
        npmdb.open(tmp_path / "d", encoder=odd)
    assert not (tmp_path / "d").exists()


def test_a_changed_tokenizer_is_refused(tmp_path, tiny_encoder):
    """The same weights read through another vocabulary or casing make other tokens: a
    database records its tokenizer's files (sha256) and refuses to answer or write with
    changed ones, as it does for changed weights."""
    import json
    import shutil

    enc = tmp_path / "enc"
    shutil.copytree(tiny_encoder, enc)
    with npmdb.open(tmp_path / "db", encoder=enc, progress=False) as db:
        db.add(["Salem is the capital of Oregon."])
        assert db.encoder.info.tokenizer
    cfg = json.loads((enc / "tokenizer_config.json").read_text())
    cfg["do_lower_case"] = not cfg.get("do_lower_case", True)
    (enc / "tokenizer_config.json").write_text(json.dumps(cfg))
    with npmdb.open(tmp_path / "db", progress=False) as db:
        with pytest.raises(npmdb.OperationalError, match="the tokenizer of embedding "
                                                         "generation 0 .* is not the one"):
            db.fill_mask("Salem is the capital of [MASK].")
        with pytest.raises(npmdb.OperationalError, match="tokenizer"):
            db.add(["Paris is the capital of France."])
        assert db.count() == 1
    with pytest.raises(npmdb.ProgrammingError, match="another tokenizer"):
        npmdb.open(tmp_path / "db", encoder=enc)


def test_an_encoder_directory_without_a_tokenizer_is_refused(tmp_path, tiny_encoder):
    """transformers builds an empty tokenizer from weights alone, which would store every
    word as one id: npmdb refuses the directory before anything is written."""
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_encoder / name, bare / name)
    with pytest.raises(npmdb.OperationalError, match="has no tokenizer"):
        npmdb.open(tmp_path / "db", encoder=bare, progress=False)
    assert not (tmp_path / "db" / "data.mdb").exists()


def test_a_checkpoint_gets_the_tokenizer_of_the_encoder_as_loaded(tmp_path, sample_corpus):
    """A database whose recorded encoder path is gone (moved, or the database copied to
    another machine) opens with the encoder's new place; a refreshed generation then takes
    its tokenizer from there, and reads text into the same ids as generation 0."""
    from transformers import AutoModel

    from npmdb.encoder import TOKENIZER_FILES, VOCABULARY_FILES
    from npmdb.encoders import TOKENIZER_FILES as COPIED

    assert set(TOKENIZER_FILES) | set(VOCABULARY_FILES) <= set(COPIED)
    assert {"spm.model", "tokenizer.model"} <= set(VOCABULARY_FILES)  # DeBERTa-v2/v3
    home = make_tiny_encoder(tmp_path / "a" / "enc", seed=5)
    with npmdb.open(tmp_path / "db", encoder=home, progress=False) as db:
        db.add(sample_corpus[:40])
    moved = tmp_path / "b" / "enc"
    moved.parent.mkdir()
    shutil.move(str(home), moved)
    text = "Thessaloniki is a city in Greece."
    with npmdb.open(tmp_path / "db", encoder=moved, progress=False) as db:
        want = db.encoder_for(0).tokenize(text).ids.tolist()
        _, gen = db.write_generation(AutoModel.from_pretrained(moved), steps=1)
        ckpt = tmp_path / "db" / "encoders" / f"g{gen}"
        assert (ckpt / "vocab.txt").exists() and (ckpt / "tokenizer.json").exists()
        assert db.encoder_for(gen).tokenize(text).ids.tolist() == want
        assert len(set(want)) > 3  # real word pieces, not one unknown id
        assert db.check().ok


def test_sentencepiece_models_by_other_names_count_as_a_tokenizer(tmp_path, tiny_encoder):
    """DeBERTa-v2/v3 ship ``spm.model`` (no tokenizer.json): such a directory is not
    refused as having no tokenizer (databases built with one kept opening)."""
    from npmdb.encoder import describe

    for name in ("spm.model", "tokenizer.model"):
        d = tmp_path / name
        d.mkdir()
        for f in ("config.json", "model.safetensors"):
            shutil.copy(tiny_encoder / f, d / f)
        (d / name).write_bytes(b"a sentencepiece model")
        assert describe(d).fingerprint


def test_a_changed_sentencepiece_model_by_another_name_is_refused(tmp_path, tiny_encoder):
    """``spm.model`` and ``tokenizer.model`` are fingerprinted with the other tokenizer
    files: a changed one is refused (it was accepted); a database that recorded the
    fingerprint from before, without them, still opens while they are unchanged."""
    from npmdb import encoder as enc_mod

    enc = tmp_path / "enc"
    shutil.copytree(tiny_encoder, enc)
    (enc / "spm.model").write_bytes(b"a sentencepiece model")  # beside BERT's vocab.txt
    with npmdb.open(tmp_path / "db", encoder=enc, progress=False) as db:
        db.add(["Salem is the capital of Oregon."])
    legacy = enc_mod._sha256_of(enc, enc_mod.TOKENIZER_FILES)
    recorded = enc_mod.fingerprint_tokenizer(enc)
    assert legacy != recorded
    assert enc_mod.tokenizer_matches(enc, legacy) and enc_mod.tokenizer_matches(enc, recorded)
    (enc / "spm.model").write_bytes(b"another sentencepiece model")
    assert not enc_mod.tokenizer_matches(enc, recorded)
    with npmdb.open(tmp_path / "db", progress=False) as db:
        with pytest.raises(npmdb.OperationalError, match="the tokenizer of embedding "
                                                         "generation 0 .* is not the one"):
            db.fill_mask("Salem is the capital of [MASK].")
        assert db.count() == 1
    with pytest.raises(npmdb.ProgrammingError, match="another tokenizer"):
        npmdb.open(tmp_path / "db", encoder=enc)


def _variant(tiny_encoder: Path, path: Path) -> Path:
    shutil.copytree(tiny_encoder, path)
    return path


def test_weights_that_do_not_fit_the_model_are_refused_and_nothing_is_created(tmp_path,
                                                                             tiny_encoder):
    """Weights named for another model (a wrapper's prefix) loaded as random ones, other
    in each process; a tokenizer with more ids than the embedding table failed the first
    add with torch's IndexError. Both are refused when the database would be made, and no
    database is left behind."""
    import json

    from safetensors.torch import load_file, save_file

    prefixed = _variant(tiny_encoder, tmp_path / "prefixed")
    weights = load_file(prefixed / "model.safetensors")
    save_file({f"wrapper.{k}": v for k, v in weights.items()}, prefixed / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(npmdb.OperationalError, match=r"do not fit its config\.json's "
                                                     r"BertModel: .* would be random.*"
                                                     r"'wrapper\."):
        npmdb.open(tmp_path / "db", encoder=prefixed, progress=False)
    assert not (tmp_path / "db").exists()

    small = _variant(tiny_encoder, tmp_path / "small-table")
    cfg = json.loads((small / "config.json").read_text())
    weights = load_file(small / "model.safetensors")
    key = "embeddings.word_embeddings.weight"
    weights[key] = weights[key][:1000].clone()
    save_file(weights, small / "model.safetensors", metadata={"format": "pt"})
    (small / "config.json").write_text(json.dumps({**cfg, "vocab_size": 1000}))
    with pytest.raises(npmdb.OperationalError, match="30522 token ids but the model's "
                                                     "embedding table has 1000 rows"):
        npmdb.open(tmp_path / "db", encoder=small, progress=False)
    assert not (tmp_path / "db").exists()

    # an MLM checkpoint (NPM's own) has no pooler: that is no missing weight
    from transformers import BertConfig, BertForMaskedLM

    mlm = tmp_path / "mlm"
    BertForMaskedLM(BertConfig(**{k: cfg[k] for k in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
        "intermediate_size")})).save_pretrained(mlm)
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        if (tiny_encoder / f).exists():
            shutil.copy(tiny_encoder / f, mlm / f)
    with npmdb.open(tmp_path / "db", encoder=mlm, progress=False) as db:
        db.add(["Salem is the capital of Oregon."])


def test_an_encoder_without_a_mask_token_makes_no_database(tmp_path, tiny_encoder):
    """The tokenizer was first loaded at the first add: the database was made, bound to the
    directory's fingerprints, and refused for good once the directory was fixed."""
    import json

    enc = _variant(tiny_encoder, tmp_path / "enc")
    good = {f: (enc / f).read_bytes() for f in ("tokenizer_config.json", "tokenizer.json",
                                                "special_tokens_map.json") if (enc / f).exists()}
    cfg = json.loads(good["tokenizer_config.json"])
    (enc / "tokenizer_config.json").write_text(json.dumps({**cfg, "mask_token": None}))
    (enc / "special_tokens_map.json").unlink(missing_ok=True)
    with pytest.raises(npmdb.NotSupportedError, match="has no mask token"):
        npmdb.open(tmp_path / "db", encoder=enc, progress=False)
    assert not (tmp_path / "db").exists()
    for f, data in good.items():
        (enc / f).write_bytes(data)
    with npmdb.open(tmp_path / "db", encoder=enc, progress=False) as db:
        db.add(["Salem is the capital of Oregon."])
        assert db.fill_mask("Salem is the capital of [MASK].").answers


def test_an_encoder_with_too_few_positions_says_so(tmp_path):
    enc = make_tiny_encoder(tmp_path / "enc", positions=8)
    with pytest.raises(npmdb.NotSupportedError, match="takes 8 positions; npmdb needs at "
                                                      "least 10"):
        npmdb.open(tmp_path / "db", encoder=enc, progress=False)


def test_models_whose_positions_start_after_padding():
    from npmdb.encoder import usable_positions

    for kind in ("roberta", "roberta-prelayernorm", "xlm-roberta", "ibert", "esm"):
        assert usable_positions({"model_type": kind, "max_position_embeddings": 66,
                                 "pad_token_id": 1}) == 64
    assert usable_positions({"model_type": "bert", "max_position_embeddings": 66}) == 66


def test_invisible_characters_between_emoji_are_never_answers(tmp_path, encoders):
    """A byte-level tokenizer splits "❤️" and "👨‍👩‍👧" into symbols and the variation selector
    or zero-width joiners between them; each emoji is punctuation-like, so those invisible
    characters were words of their own, and answers ('\\ufe0f' ranked first for
    "I [MASK] Paris."), or the start of one ('\\u200d👧 family')."""
    import unicodedata

    from npmdb.boundaries import VALID_END, VALID_START, token_flags
    from npmdb.encoder import Encoder

    def is_invisible(edge: str) -> bool:
        return bool(edge) and unicodedata.category(edge) in ("Cf", "Mn", "Me")

    text = "I ❤️ Paris. The 👨‍👩‍👧 family loves Paris and the party 🎉 was great."
    tt = Encoder(encoders["roberta"]).tokenize(text)
    flags = token_flags(text, np.asarray(tt.offsets))
    edges = [(s, t) for (s, t), f in zip(tt.offsets, flags) if f & (VALID_START | VALID_END)]
    assert edges and not any(is_invisible(text[s:t][:1]) or is_invisible(text[s:t][-1:])
                             for s, t in edges if t > s)
    with npmdb.open(tmp_path / "db", encoder=encoders["roberta"], progress=False) as db:
        db.add([text] * 3)
        for q in ("I [MASK] Paris.", "The [MASK] family loves Paris."):
            for retrieval in ("bm25", "dense"):
                for a in db.fill_mask(q, retrieval=retrieval, top=20).answers:
                    assert not is_invisible(a.text[:1]) and not is_invisible(a.text[-1:]), \
                        (q, retrieval, a.text)


def test_an_encoder_saved_in_shards_works_and_every_shard_is_fingerprinted(tmp_path,
                                                                          tiny_encoder):
    """``save_pretrained(max_shard_size=...)`` writes an index and several weight files:
    such a directory was refused as having "no weights"."""
    from transformers import AutoModel

    from npmdb.encoder import fingerprint_dir, weight_files

    enc = tmp_path / "sharded"
    enc.mkdir()
    AutoModel.from_pretrained(tiny_encoder).save_pretrained(enc, max_shard_size="1MB")
    for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny_encoder / f).exists():
            shutil.copy(tiny_encoder / f, enc / f)
    shards = [f for f in weight_files(enc) if not f.endswith(".json")]
    assert len(shards) > 1 and not (enc / "model.safetensors").exists()
    with npmdb.open(tmp_path / "db", encoder=enc, progress=False) as db:
        db.add(["Salem is the capital of Oregon.", "Boise is the capital of Idaho."])
        answers = [a.text for a in db.fill_mask("Salem is the capital of [MASK].",
                                                retrieval="dense").answers]
        assert answers
    before = fingerprint_dir(enc)
    last = enc / shards[-1]
    data = bytearray(last.read_bytes())
    data[-1] ^= 1
    last.write_bytes(bytes(data))
    assert fingerprint_dir(enc) != before
    with npmdb.open(tmp_path / "db", progress=False) as db:
        with pytest.raises(npmdb.OperationalError, match="not the one that made its vectors"):
            db.fill_mask("Salem is the capital of [MASK].", retrieval="dense")


def test_a_byte_level_possessive_ending_is_a_word_of_its_own(encoders):
    """RoBERTa's tokenizer makes one token of "'s": "Oregon" could not end a phrase before
    it ("Oregon's" was the only one), where BERT's "'" "s" let it."""
    from npmdb.boundaries import STOPWORD, VALID_END, VALID_START, token_flags
    from npmdb.encoder import Encoder

    text = "Salem is Oregon's capital and O'Brien's home, says Mu'tazila."
    tt = Encoder(encoders["roberta"]).tokenize(text)
    assert any(text[s:t] == "'s" for s, t in tt.offsets)   # the tokenizer makes it
    flags = token_flags(text, np.asarray(tt.offsets))
    ends = {text[:t].split()[-1] for (s, t), f in zip(tt.offsets, flags) if f & VALID_END}
    assert {"Oregon", "O'Brien", "Mu'tazila"} <= ends
    assert not {"Mu", "Mu'"} & ends   # "'t" of "Mu'tazila" is no ending: one word
    for (s, t), f in zip(tt.offsets, flags):
        if text[s:t] == "'s":
            assert f & STOPWORD and not f & (VALID_START | VALID_END)
