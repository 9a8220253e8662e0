"""Property tests (hypothesis): tokenisation offsets, block cutting, boundary flags, vector
codecs and array packing, and evidence offsets of real query results."""

from __future__ import annotations

import re
import unicodedata

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import npmdb
from npmdb.blocks import cut_blocks
from npmdb.boundaries import (
    PUNCT, STOPWORD, STOPWORDS, VALID_END, VALID_START, WORD_END, WORD_START, token_flags,
)
from npmdb.boundaries import fold_view
from npmdb.storage.codec import Float16Codec, Int8Codec, cast
from npmdb.storage.format import pack_array, unpack_array


def fold(s: str) -> str:
    return " ".join(s.split()).casefold()


@pytest.fixture(scope="module")
def encoder(tiny_encoder):
    """The default encoder's tokenizer (with the tiny random model, which is not used)."""
    from npmdb.encoder import Encoder

    return Encoder(tiny_encoder, device="cpu")


def tokens(encoder, text: str):
    tt = encoder.tokenize(text)
    offs = tt.offsets
    return tt, offs, token_flags(text, offs)


# ------------------------------------------------------------------ tokenisation offsets

WHITESPACE = list(" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2007\u2028\u2029"
                  "\u202f\u205f\u3000")
ODD = list("\u200b\u200d\ufeff\u00ad\u0301\u064e\u0651\x00\x07\ufffd.,;:!?()[]{}'\"-–—…"
           "€$%&*+/<=>@#^_`|~")
SCRIPTS = list("abcXYZéüßαβγΩЖжйёب ت ث ج ح خ ه و ي"
               "東京日本語漢字あいうアイウ한국어्क ख ग घ ไทยᄀ가ﬁﬂ½²ⅫÅ🙂👍🏽")
mixed_text = st.text(alphabet=st.sampled_from(WHITESPACE + ODD + SCRIPTS), max_size=60)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=80), mixed_text))
@example(text="")
@example(text="   \n\t ")
@example(text="Hagios Demetrios is the patron saint church of Thessaloniki.")
@example(text="a\u0301\u0301 \u200b x")
def test_token_offsets_are_trimmed_slices(encoder, text):
    tt = encoder.tokenize(text)
    offs = tt.offsets
    assert offs.shape == (len(tt.ids), 2)
    prev_s = prev_e = 0
    for s, e in offs.tolist():
        assert 0 <= s < e <= len(text), (s, e)
        piece = text[s:e]
        assert piece and piece == piece.strip(), repr(piece)
        assert s >= prev_s and e >= prev_e, "offsets must be non-decreasing"
        prev_s, prev_e = s, e


@settings(max_examples=200, deadline=None)
@given(text=mixed_text)
def test_tokens_cover_every_non_space_character_they_keep(encoder, text):
    """Tokens never have white space at their edges; every white-space-separated chunk
    holding a letter is covered by some token (letters are never silently dropped)."""
    tt = encoder.tokenize(text)
    offs = tt.offsets.tolist()
    for s, e in offs:
        assert not text[s].isspace() and not text[e - 1].isspace()
    for m in re.finditer(r"\S+", text):
        if any(unicodedata.category(c).startswith("L") for c in m.group()):
            a, b = m.span()
            assert any(s < b and a < e for s, e in offs), m.group()


# ------------------------------------------------------------------ block cutting

flag_arrays = st.lists(st.sampled_from([0, WORD_START, WORD_START | WORD_END, WORD_END,
                                        WORD_START | VALID_START]),
                       max_size=400).map(lambda x: np.asarray(x, dtype=np.uint8))


def check_blocks(flags: np.ndarray, block_len: int, blocks: list[tuple[int, int]]) -> None:
    n, cap = len(flags), block_len - 2
    if n == 0:
        assert blocks == []
        return
    assert blocks[0][0] == 0 and blocks[-1][1] == n
    for (a, b), (c, _) in zip(blocks, blocks[1:]):
        assert b == c, "blocks must be contiguous"
    for a, b in blocks:
        assert 1 <= b - a <= cap, (a, b, cap)
        if b < n and not flags[b] & WORD_START:
            # the cut splits a word: allowed only if no word start was available to back
            # off to (positions a+1 .. a+cap)
            assert not np.any(flags[a + 1:a + cap + 1] & WORD_START), (a, b)
        if b < n and flags[b] & WORD_START:
            # backing off goes to the *last* word start that fits
            later = np.flatnonzero(flags[b + 1:a + cap + 1] & WORD_START)
            assert len(later) == 0, (a, b)


@settings(max_examples=400, deadline=None)
@given(flags=flag_arrays, block_len=st.integers(3, 40))
@example(flags=np.zeros(10, np.uint8), block_len=3)
@example(flags=np.full(10, WORD_START, np.uint8), block_len=5)
def test_cut_blocks_properties(flags, block_len):
    check_blocks(flags, block_len, cut_blocks(flags, block_len))


def test_cut_blocks_rejects_tiny_block_len():
    with pytest.raises(ValueError):
        cut_blocks(np.zeros(3, np.uint8), 2)


@settings(max_examples=60, deadline=None)
@given(text=st.lists(st.sampled_from(["Thessaloniki", "is", "a", "city", "in", "Greece.",
                                      "Hagios", "Demetrios,", "unbelievably", "antidisestab"
                                      "lishmentarianism", "東京", "(the", "U.S.)", "Ελλάδα"]),
                     min_size=1, max_size=120).map(" ".join),
       block_len=st.integers(4, 24))
def test_cut_blocks_on_real_tokens(encoder, text, block_len):
    _, _, flags = tokens(encoder, text)
    check_blocks(flags, block_len, cut_blocks(flags, block_len))


# ------------------------------------------------------------------ boundary flags


def names(flag: int) -> set[str]:
    return {n for n, b in (("VS", VALID_START), ("VE", VALID_END), ("WS", WORD_START),
                           ("WE", WORD_END), ("SW", STOPWORD), ("P", PUNCT)) if flag & b}


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(max_size=80), mixed_text))
def test_flag_invariants(encoder, text):
    _, offs, flags = tokens(encoder, text)
    n = len(flags)
    if n == 0:
        return
    assert flags[0] & WORD_START and flags[-1] & WORD_END
    # word starts and ends alternate: start, end, start, end, ...
    depth = 0
    for i, f in enumerate(flags):
        if f & WORD_START:
            assert depth == 0, f"word start at {i} inside a word"
            depth = 1
        if f & WORD_END:
            assert depth == 1, f"word end at {i} outside a word"
            depth = 0
    assert depth == 0
    for i, f in enumerate(flags):
        if f & VALID_START:
            assert f & WORD_START and not f & PUNCT and not f & STOPWORD
        if f & VALID_END:
            assert f & WORD_END and not f & PUNCT and not f & STOPWORD
        piece = text[offs[i, 0]:offs[i, 1]]
        if all(unicodedata.category(c)[0] in "PS" for c in piece):
            assert f & PUNCT and not f & (VALID_START | VALID_END)
        # white space between two tokens is always a word boundary
        if i and any(c.isspace() for c in text[offs[i - 1, 1]:offs[i, 0]]):
            assert f & WORD_START and flags[i - 1] & WORD_END


CONTRACTION_PARTS = {"s", "t", "d", "ll", "m", "o", "re", "ve", "y"}
WORDS = ["Bank", "America", "Thessaloniki", "Demetrios", "unbelievable", "ζώνη", "Ελλάδα",
         "Москва", "ёлка", "Straße", "naïve", "МГУ", "مدرسة", "الولد", "jalapeño", "x"]


@settings(max_examples=200, deadline=None)
@given(words=st.lists(st.sampled_from(WORDS + sorted(STOPWORDS)[:30]), min_size=1, max_size=25),
       seps=st.lists(st.sampled_from([" ", "  ", "\n", "\t", " \u00a0"]), min_size=25,
                     max_size=25))
def test_whole_words_from_whitespace_separated_text(encoder, words, seps):
    """Text of words separated by white space: each word's first token is its (only) word
    start, its last token its word end; clean words are valid starts/ends, stopwords not;
    the tokens of a word span exactly the word (its surface text is never truncated)."""
    text, spans = "", []
    for w, sep in zip(words, seps):
        if text:
            text += sep
        spans.append((len(text), len(text) + len(w)))
        text += w
    _, offs, flags = tokens(encoder, text)
    for w, (a, b) in zip(words, spans):
        idx = [i for i in range(len(flags)) if a <= offs[i, 0] and offs[i, 1] <= b]
        assert idx, w
        assert idx == list(range(idx[0], idx[-1] + 1))
        first, last = idx[0], idx[-1]
        assert text[offs[first, 0]:offs[last, 1]] == w
        assert flags[first] & WORD_START and flags[last] & WORD_END
        for i in idx[1:]:
            assert not flags[i] & WORD_START, (w, i)
        for i in idx[:-1]:
            assert not flags[i] & WORD_END, (w, i)
        # contraction parts ("s", "t", "d", "ll", ...) are stopwords only after an apostrophe
        stop = w.casefold() in STOPWORDS and w.casefold() not in CONTRACTION_PARTS
        assert bool(flags[first] & VALID_START) == (not stop), w
        assert bool(flags[last] & VALID_END) == (not stop), w
        assert all(bool(flags[i] & STOPWORD) == stop for i in idx)


def flag_table(encoder, text: str) -> list[tuple[str, set[str]]]:
    _, offs, flags = tokens(encoder, text)
    return [(text[s:e], names(int(f))) for (s, e), f in zip(offs.tolist(), flags)]


def test_flags_bank_of_america(encoder):
    assert flag_table(encoder, "Bank of America") == [
        ("Bank", {"VS", "VE", "WS", "WE"}),
        ("of", {"WS", "WE", "SW"}),
        ("America", {"VS", "VE", "WS", "WE"}),
    ]


def test_flags_the_us(encoder):
    table = flag_table(encoder, "the U.S.")
    assert [s for s, _ in table] == ["the", "U", ".", "S", "."]
    assert table[0] == ("the", {"WS", "WE", "SW"})      # a stopword: never an edge
    assert {"VS", "WS"} <= table[1][1]                   # "U" may start a phrase
    assert table[2][1] == table[4][1] == {"WS", "WE", "P"}  # punctuation: never an edge


def test_abbreviation_us_can_end_a_phrase(encoder):
    """The 'S' of 'U.S.' is a letter of an abbreviation, not the contraction "'s": a span
    can end at it, so 'U.S' is a possible answer; it starts none (it is inside "U.S", as
    "Packard" is inside "Hewlett-Packard")."""
    table = flag_table(encoder, "in the U.S. today")
    s_tok = [f for s, f in table if s == "S"][0]
    assert "VE" in s_tok and "VS" not in s_tok and "SW" not in s_tok


def test_contraction_parts_after_an_apostrophe_are_stopwords(encoder):
    table = flag_table(encoder, "don't touch John's car, we'll see")
    for piece in ("t", "s", "ll"):
        f = [f for s, f in table if s == piece][0]
        assert "SW" in f and not {"VS", "VE"} & f, (piece, f)
    assert {"VS", "VE"} <= dict(table)["John"]


def test_flags_greek(encoder):
    table = flag_table(encoder, "Η Θεσσαλονίκη είναι πόλη της Ελλάδας")
    text = "".join(s for s, _ in table)
    assert text == "ΗΘεσσαλονίκηείναιπόλητηςΕλλάδας"  # offsets keep the accents (never lossy)
    starts = [s for s, f in table if "VS" in f]
    assert len(starts) == 6 and starts[0] == "Η" and starts[1] == "Θ"
    assert sum("VE" in f for _, f in table) == 6
    assert sum("WS" in f for _, f in table) == 6


def test_flags_japanese(encoder):
    table = flag_table(encoder, "東京は日本の首都です。")
    # every ideograph is its own word; the hiragana run です is one word; 。 is punctuation
    kanji = [f for s, f in table if s in "東京日本首都"]
    assert len(kanji) == 6 and all({"VS", "VE", "WS", "WE"} <= f for f in kanji)
    assert table[-1] == ("。", {"WS", "WE", "P"})
    desu = [f for s, f in table if s in ("で", "す")]
    assert "WS" in desu[0] and "WE" not in desu[0] and "WE" in desu[-1]


def test_flags_arabic(encoder):
    text = "ذهب الولد إلى المدرسة"
    table = flag_table(encoder, text)
    assert sum("WS" in f for _, f in table) == 4 and sum("WE" in f for _, f in table) == 4
    assert sum("VS" in f for _, f in table) == 4
    assert "".join(s for s, _ in table) == text.replace(" ", "")


@pytest.mark.parametrize("text,words", [
    # Arabic with harakat (the tokenizer strips the marks, leaving gaps in the offsets)
    ("كَتَبَ الوَلَدُ الدَّرْسَ", ["كَتَبَ", "الوَلَدُ", "الدَّرْسَ"]),
    # decomposed (NFD) accents, as macOS and many PDFs produce them
    (unicodedata.normalize("NFD", "Θεσσαλονίκη Ελλάδα"),
     unicodedata.normalize("NFD", "Θεσσαλονίκη Ελλάδα").split()),
    (unicodedata.normalize("NFD", "café crème"), unicodedata.normalize("NFD", "café crème").split()),
])
def test_combining_marks_neither_split_words_nor_get_lost(encoder, text, words):
    """DESIGN.md 1: no phrase starts or ends inside a word, and answers are sliced from the
    text without loss (accents and Arabic diacritics kept). Combining marks the tokenizer
    drops must neither make a word boundary nor fall off the end of a word's span."""
    _, offs, flags = tokens(encoder, text)
    assert sum(bool(f & WORD_START) for f in flags) == len(words), flag_table(encoder, text)
    starts = [i for i, f in enumerate(flags) if f & WORD_START]
    ends = [i for i, f in enumerate(flags) if f & WORD_END]
    got = [text[offs[a, 0]:offs[b, 1]] for a, b in zip(starts, ends)]
    assert got == words


@pytest.mark.parametrize("text,words", [
    ("a river in\x00Quentaria\x00.", ["a", "river", "in", "Quentaria", "."]),
    ("north\x01south\x7f", ["north", "south"]),
])
def test_control_characters_separate_words(encoder, text, words):
    """A NUL or other control character the tokenizer drops is a word boundary, as white
    space is: it is not absorbed into the word before it, so "in\\x00Quentaria" is the
    stopword "in" and the name, and no answer starts with "in"."""
    _, offs, flags = tokens(encoder, text)
    starts = [i for i, f in enumerate(flags) if f & WORD_START]
    ends = [i for i, f in enumerate(flags) if f & WORD_END]
    assert [text[offs[a, 0]:offs[b, 1]] for a, b in zip(starts, ends)] == words
    assert not any(flags[i] & VALID_START and text[offs[i, 0]:offs[i, 1]] == "in"
                   for i in range(len(flags)))


# ------------------------------------------------------------------ vector codecs

vec_arrays = hnp.arrays(np.float32, st.tuples(st.integers(1, 12), st.integers(1, 48)),
                        elements=st.floats(-6e4, 6e4, width=32))


@settings(max_examples=200, deadline=None)
@given(x=vec_arrays)
@example(x=np.zeros((2, 3), np.float32))
@example(x=np.array([[1e-8, -3e-6, 6.5e4, 0.1]], np.float32))
def test_float16_codec_round_trip(x):
    c = Float16Codec()
    stored = c.encode(x)
    assert stored.dtype == np.float16 and stored.shape == x.shape
    assert stored.nbytes == x.shape[0] * c.bytes_per_vector(x.shape[1])
    y = c.decode(stored)
    assert y.dtype == np.float32 and y.shape == x.shape
    # round to nearest: half an ulp, relative 2**-11 for normals, 2**-25 absolute below
    bound = np.maximum(np.abs(x) * 2.0 ** -11, 2.0 ** -25) * (1 + 1e-6)
    assert np.all(np.abs(y - x) <= bound)


@settings(max_examples=40, deadline=None)
@given(x=hnp.arrays(np.float32, st.tuples(st.integers(1, 300), st.just(64)),
                    elements=st.floats(width=32, allow_nan=True, allow_infinity=True)))
@example(x=np.array([[6.55e4, 6.6e4, -1e9, 3e-8, 6e-8, 1e-45, np.nan, -0.0] * 8] * 80,
                    np.float32))
@pytest.mark.filterwarnings("ignore:overflow encountered in cast")
def test_fast_float16_casts_are_bit_identical_to_numpy(x):
    """The hot path converts large arrays through torch; every value (overflow to inf,
    subnormals, ties, NaN) must come out exactly as numpy's astype gives it."""
    h = cast(x, np.float16)
    np.testing.assert_array_equal(np.isnan(h), np.isnan(x))
    ok = ~np.isnan(x)
    assert h.dtype == np.float16
    np.testing.assert_array_equal(h[ok].view(np.uint16), x.astype(np.float16)[ok].view(np.uint16))
    back = cast(h, np.float32)
    ref = h.astype(np.float32)
    assert back.dtype == np.float32
    np.testing.assert_array_equal(np.isnan(back), np.isnan(ref))
    np.testing.assert_array_equal(back[~np.isnan(ref)].view(np.uint32),
                                  ref[~np.isnan(ref)].view(np.uint32))


@settings(max_examples=300, deadline=None)
@given(text=st.text(st.sampled_from(list("aAßẞİıΣσς xY\t\n\u00a0\u3000.,Éé")) | st.characters(),
                    max_size=40), data=st.data())
@example(text="Straße  in\tBerlin", data=None)
def test_fold_view_slices_fold_like_fold(text, data):
    """Answers are grouped by slices of a document's folded text: wherever fold_view
    offers one, every span without white space at its edges folds exactly as fold()."""
    view = fold_view(text)
    if view is None:
        return
    spans = [(a, b) for a in range(len(text)) for b in range(a + 1, len(text) + 1)
             if not text[a].isspace() and not text[b - 1].isspace()]
    if data is not None and len(spans) > 60:
        spans = data.draw(st.lists(st.sampled_from(spans), max_size=60))
    for a, b in spans:
        assert view[a:b] == fold(text[a:b])


@settings(max_examples=200, deadline=None)
@given(x=hnp.arrays(np.float32, st.tuples(st.integers(1, 12), st.integers(1, 48)),
                    elements=st.floats(-1e6, 1e6, width=32, allow_subnormal=False)))
@example(x=np.zeros((3, 4), np.float32))
@example(x=np.array([[0, 0, 0], [1, -1, 0.5]], np.float32))
def test_int8_codec_round_trip(x):
    c = Int8Codec()
    stored = c.encode(x)
    assert stored.dtype == np.uint8 and stored.shape == (x.shape[0], x.shape[1] + 4)
    assert stored.shape[1] == c.bytes_per_vector(x.shape[1])
    y = c.decode(stored)
    assert y.dtype == np.float32 and y.shape == x.shape
    scale = np.abs(x).max(axis=1, keepdims=True) / 127.0
    # symmetric rounding: at most half a step per component (plus float32 rounding); rows
    # whose largest component is below 1e-30 have a subnormal scale (precision loss) and
    # are only checked to stay within their own magnitude
    normal = (scale >= 1e-30)[:, 0]
    assert np.all(np.abs(y - x)[normal] <= (scale * 0.5 * (1 + 1e-5))[normal])
    tiny = np.abs(x).max(axis=1, keepdims=True)
    assert np.all((np.abs(y - x) <= tiny * 1.01 + 1e-38)[~normal])
    assert np.all(y[np.all(x == 0, axis=1)] == 0)
    # the largest component per row survives up to float rounding
    big = np.argmax(np.abs(x), axis=1)
    rows = np.arange(len(x))[normal]
    assert np.allclose(y[rows, big[rows]], x[rows, big[rows]], rtol=1e-5, atol=0)


DTYPES = [np.float16, np.float32, np.int32, np.int64, np.uint8, np.int8]


@st.composite
def packable(draw):
    dt = np.dtype(draw(st.sampled_from(DTYPES)))
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=6))
    a = draw(hnp.arrays(dt, shape))
    if draw(st.booleans()) and a.ndim:
        a = a.astype(dt.newbyteorder(">"))  # big-endian in: stored little-endian
    if draw(st.booleans()) and a.ndim and a.shape[-1] > 1:
        a = a[..., ::2]  # not contiguous
    return a


@settings(max_examples=300, deadline=None)
@given(a=packable())
def test_pack_unpack_round_trip(a):
    buf = pack_array(a)
    b = unpack_array(buf, verify=True)
    assert b.shape == a.shape
    assert b.dtype == a.dtype.newbyteorder("<") or b.dtype == a.dtype
    assert b.dtype.byteorder in ("<", "=", "|")
    np.testing.assert_array_equal(b, a)
    # zero-copy over a memoryview too
    c = unpack_array(memoryview(buf), verify=True)
    np.testing.assert_array_equal(c, a)


@pytest.mark.parametrize("a", [np.array(3.5, np.float32), np.array(7, np.int64)])
def test_pack_unpack_zero_dim_array(a):
    """A 0-d array must come back 0-d (np.ascontiguousarray in pack_array makes it 1-d)."""
    b = unpack_array(pack_array(a), verify=True)
    assert b.shape == () and b.dtype == a.dtype and b == a


def _header_len(ndim: int) -> int:
    h = 8 + 8 * ndim
    return h + (-h % 16)


@settings(max_examples=200, deadline=None)
@given(a=packable().filter(lambda a: a.size > 0), data=st.data())
def test_flipped_payload_bit_is_detected(a, data):
    buf = bytearray(pack_array(a))
    h = _header_len(a.ndim)
    pos = data.draw(st.integers(h, len(buf) - 1))
    bit = data.draw(st.integers(0, 7))
    buf[pos] ^= 1 << bit
    with pytest.raises(npmdb.OperationalError):
        unpack_array(bytes(buf), verify=True)


@settings(max_examples=300, deadline=None)
@given(a=packable().filter(lambda a: a.size > 0), data=st.data())
@example(a=np.arange(6, dtype=np.uint8).reshape(2, 3), data=None)
@example(a=np.ones((1, 1, 2, 4), np.float16), data="ndim 4 -> 6")  # found by CI's draws
def test_flipped_byte_anywhere_is_detected_or_harmless(a, data):
    """Any flipped byte other than the dtype code (see the next test) either raises
    OperationalError under verify=True -- never struct.error or ValueError -- or leaves
    the decoded array identical (a padding byte)."""
    buf = bytearray(pack_array(a))
    if data is None:  # the explicit example: the ndim byte
        pos, mask = 3, 0xFF
    elif isinstance(data, str):  # ndim 4 -> 6: shape (1, 1, 2, 4, 0, <data bytes>)
        pos, mask = 3, 2
    else:
        pos = data.draw(st.integers(0, len(buf) - 1).filter(lambda p: p != 2))
        mask = data.draw(st.sampled_from([0xFF, 1, 2, 4, 8, 16, 32, 64, 128]))
    buf[pos] ^= mask
    try:
        b = unpack_array(bytes(buf), verify=True)
    except npmdb.OperationalError:
        return
    assert b.dtype == a.dtype.newbyteorder("<") or b.dtype == a.dtype
    np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("dtype,code_from,code_to", [(np.uint8, 4, 5), (np.float32, 1, 2)])
def test_corrupted_dtype_byte_is_detected(dtype, code_from, code_to):
    """The header (dtype, shape) is not covered by the checksum: a damaged dtype byte that
    keeps the item size (u1 -> i1 is one flipped bit; f4 -> i4) reinterprets the data
    without any error. The flags column is u1, tokens i4: both are read with verify=True."""
    a = np.arange(1, 9, dtype=dtype).reshape(2, 4) * 3
    buf = bytearray(pack_array(a))
    assert buf[2] == code_from
    buf[2] = code_to
    with pytest.raises(npmdb.OperationalError):
        unpack_array(bytes(buf), verify=True)


def test_truncated_or_bad_magic_is_detected():
    buf = pack_array(np.arange(10, dtype=np.int32))
    for bad in (buf[:-1], buf + b"\0", b"XX" + buf[2:], buf[:5]):
        with pytest.raises(npmdb.OperationalError):
            unpack_array(bad, verify=True)


# ------------------------------------------------------------------ evidence offsets

QUERY_WORDS = ["city", "river", "capital", "church", "genus", "Greece", "the", "is", "a",
               "located", "in", "of", "plant", "family", "language", "island", "war",
               "part", "known", "as", "Spain", "person", "who"]


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(words=st.lists(st.sampled_from(QUERY_WORDS), min_size=1, max_size=10),
       at=st.integers(0, 10),
       mode=st.sampled_from(["phrase", "token"]),
       retrieval=st.sampled_from(["dense", "bm25", "hybrid"]),
       exact=st.booleans(),
       group_by=st.sampled_from(["phrase", "word"]),
       max_len=st.integers(1, 12))
def test_evidence_slices_the_documents(tiny_db, words, at, mode, retrieval, exact, group_by,
                                       max_len):
    assume(group_by == "phrase" or mode == "token")
    words = list(words)
    words.insert(min(at, len(words)), "[MASK]")
    q = " ".join(words) + "."
    res = tiny_db.fill_mask(q, top=8, mode=mode, retrieval=retrieval, exact=exact,
                            group_by=group_by, max_len=max_len, evidence=4)
    docs: dict[str, str] = {}
    for a in res.answers:
        assert a.evidence, a
        assert 1 <= len(a.evidence) <= min(4, a.support)
        for ev in a.evidence:
            if ev.doc_id not in docs:
                d = tiny_db.get(ev.doc_id)
                assert d is not None, ev.doc_id
                docs[ev.doc_id] = d["text"]
            text = docs[ev.doc_id]
            assert 0 <= ev.start < ev.end <= len(text)
            assert fold(text[ev.start:ev.end]) == fold(a.text), (ev, a.text)
            assert text[ev.start:ev.end].replace("\n", " ") in ev.snippet
