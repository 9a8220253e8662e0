"""Nothing loads pickle: metadata is msgpack, checkpoints are safetensors.

A static scan of the package's source (``npmdb``, ``npmdb.storage``, ``npmdb.query``,
``npmdb.train``) over the syntax tree — so ``model.eval()`` is fine and builtin ``eval``
is not — and a functional check that a database directory, checkpoints included, holds
no pickle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = ("npmdb", "storage", "query")  # npmdb, npmdb.storage, npmdb.query (+ train)
BANNED_MODULES = {"pickle", "cPickle", "_pickle", "dill", "cloudpickle", "shelve", "marshal",
                  "joblib", "jsonpickle"}
BANNED_BUILTINS = {"eval", "exec", "compile", "__import__"}


def _sources() -> list[Path]:
    out = []
    for d in PACKAGE_DIRS:
        out += sorted((ROOT / d).rglob("*.py"))
    return out


def _kw(call: ast.Call, name: str):
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return None


def _is_true(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def scan(path: Path) -> list[str]:
    """Findings in one file: ``path:line: what``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []

    def hit(node, what):
        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in BANNED_MODULES:
                    hit(node, f"imports {a.name}")
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in BANNED_MODULES:
                hit(node, f"imports from {node.module}")
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name) and f.id in BANNED_BUILTINS:
                hit(node, f"calls builtin {f.id}()")
            if isinstance(f, ast.Attribute):
                owner = f.value.id if isinstance(f.value, ast.Name) else None
                if f.attr == "load" and owner == "torch" and not _is_true(_kw(node, "weights_only")):
                    hit(node, "torch.load without weights_only=True")
                if f.attr in ("load", "loads") and owner in BANNED_MODULES:
                    hit(node, f"{owner}.{f.attr}")
                if f.attr == "load" and owner in ("np", "numpy") and _is_true(
                        _kw(node, "allow_pickle")):
                    hit(node, "numpy.load with allow_pickle=True")
                if f.attr == "load" and owner == "yaml" and _kw(node, "Loader") is None:
                    hit(node, "yaml.load without a safe Loader")
                if f.attr == "save_pretrained" and not _is_true(_kw(node, "safe_serialization")):
                    hit(node, "save_pretrained without safe_serialization=True")
                if f.attr in ("save", "dump") and owner in ("torch", "pickle", "joblib"):
                    hit(node, f"{owner}.{f.attr} writes a pickle")
        elif isinstance(node, ast.Name) and node.id in ("pickle", "cPickle"):
            hit(node, f"uses {node.id}")
    return found


def test_the_package_loads_no_pickle_and_evals_nothing():
    files = _sources()
    assert len(files) > 20  # the scan sees the whole package
    findings = [f for p in files for f in scan(p)]
    assert not findings, "\n".join(findings)


@pytest.mark.parametrize("src,expected", [
    ("import pickle\n", "imports pickle"),
    ("from pickle import loads\n", "imports from pickle"),
    ("import torch\nx = torch.load('f')\n", "torch.load without weights_only=True"),
    ("import torch\nx = torch.load('f', weights_only=False)\n", "torch.load without"),
    ("y = eval('1+1')\n", "calls builtin eval()"),
    ("exec('x = 1')\n", "calls builtin exec()"),
    ("import numpy as np\nnp.load('f', allow_pickle=True)\n", "allow_pickle=True"),
    ("m.save_pretrained('d')\n", "save_pretrained without"),
])
def test_the_scanner_catches_each_pattern(tmp_path, src, expected):
    p = tmp_path / "probe.py"
    p.write_text(src)
    findings = scan_relative(p)
    assert any(expected in x for x in findings), findings


def scan_relative(p: Path) -> list[str]:
    global ROOT
    saved = ROOT
    ROOT = p.parent
    try:
        return scan(p)
    finally:
        ROOT = saved


def test_allowed_patterns_are_not_flagged(tmp_path):
    p = tmp_path / "ok.py"
    p.write_text("import torch\nmodel.eval()\nx = torch.load('f', weights_only=True)\n"
                 "m.save_pretrained('d', safe_serialization=True)\nimport msgpack\n")
    assert scan_relative(p) == []


def test_a_database_with_a_refreshed_encoder_holds_no_pickle(tmp_path, tiny_encoder):
    """Metadata goes through msgpack and checkpoints through safetensors: no file in the
    directory is a pickle, and every checkpoint is a .safetensors file."""
    from transformers import AutoModel

    import npmdb
    from npmdb.generations import write_generation

    with npmdb.open(tmp_path / "db", encoder=tiny_encoder, progress=False) as db:
        db.add([{"id": "a", "text": "Salem is the capital of Oregon.", "meta": {"k": [1, 2]}}])
        write_generation(db, AutoModel.from_pretrained(tiny_encoder), steps=1)
    files = [f for f in (tmp_path / "db").rglob("*") if f.is_file()]
    ckpt = [f.name for f in (tmp_path / "db" / "encoders" / "g1").iterdir()]
    assert "model.safetensors" in ckpt
    assert not [n for n in ckpt if n.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))], ckpt
    for f in files:
        head = f.read_bytes()[:2]
        assert not (len(head) == 2 and head[0] == 0x80 and head[1] in range(2, 6)), \
            f"{f} starts like a pickle"
