"""The engine's tokenizers against independent implementations, through `flashlite tokenize --jsonl`:
Hugging Face `tokenizers` for the Llama 3 tokenizer.json (special tokens parsed and not) and for GPT-2 (built from
encoder.json + vocab.bpe), and `sentencepiece` for the babyllama tok105 vocabulary. Every byte-level encoding must also
decode back to its text exactly."""
import copy
import functools
import json
import random
import subprocess
import time

import pytest

from engine_testlib import model_absent, run_cli

tokenizers = pytest.importorskip("tokenizers", reason="pip package `tokenizers` is needed (scripts/requirements.txt)")

FIXED = [
    "Hello world", "Hello, world!", "  leading spaces", "trailing spaces   ", "multiple   spaces  between",
    "tabs\tand\nnewlines\n\n\nend", "\r\n windows line\r\n", " ", "   ", "\n", "\n\n \n", "a", "",
    "it's they're we've I'm you'll he'd", "IT'S THEY'RE WE'VE I'M", "don't won't can't", "'s 't 're",
    "1234567890", "3.14159 and 2,718 and 1e10", "12 345 6789 00000001", "x1y22z333w4444",
    "café naïve résumé Ångström", "Straße größer ÄÖÜ", "combining e\u0301 vs é", "ﬁ ligature ﬀ",
    "日本語のテキストです。", "中文字符测试，标点！", "한국어 텍스트", "Привет, мир!", "مرحبا بالعالم", "हिन्दी भाषा",
    "ภาษาไทย", "😀😃🎉 emoji 👍🏽 👨‍👩‍👧 family", "🇫🇷🇩🇪 flags",
    "def f(x):\n    return x**2  # comment\n", "for (int i = 0; i < n; ++i) { a[i] += b[i]; }",
    "<html><body class=\"x\">&amp;</body></html>", "https://example.com/path?q=1&r=2#frag", "user@example.com",
    "!!!???...", "—–-‐ “quotes” ‘single’ «guillemets»", "$100.00 €50 ¥1000 £3", "C++ C# F# .NET",
    "\u00a0non-breaking\u00a0space", "\u3000ideographic space", "zero\u200bwidth", "tab\t\ttab", "line\u2028sep",
    "x" * 300, " ".join(["word"] * 60), "ab" * 100, "\t" * 20, "\n" * 15, " " * 33 + "x",
    "<|begin_of_text|>Hello<|eot_id|>", "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>",
    "text<|eot_id|>more text", "<|reserved_special_token_5|>", "<|endoftext|> after", "<|eot_id|><|eot_id|>",
    "<|not_a_token|>", "<|begin_of_text",
]

RANGES = [(0x20, 0x7E), (0x20, 0x7E), (0x20, 0x7E), (0xA0, 0x24F), (0x370, 0x3FF), (0x400, 0x4FF), (0x590, 0x6FF),
          (0x900, 0x97F), (0x3040, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0x1F300, 0x1F64F), (0x2000, 0x206F),
          (0x9, 0xD), (0x30, 0x39)]


def fuzz_strings(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randint(1, 40)):
            lo, hi = rng.choice(RANGES)
            chars.append(chr(rng.randint(lo, hi)) * rng.choice([1, 1, 1, 2, 3]))
        out.append("".join(chars))
    return out


CASES = FIXED + fuzz_strings(300, 1234)


def engine_encode(binary, tokenizer_path, texts, special):
    stdin = "".join(json.dumps(t) + "\n" for t in texts).encode()
    args = ["tokenize", "--model", str(tokenizer_path), "--jsonl"] + (["--special"] if special else [])
    # split("\n"), not splitlines(): the JSON holds raw U+2028, U+0085 and friends, which splitlines() breaks on.
    lines = [l for l in run_cli(binary, args, stdin=stdin).stdout.decode().split("\n") if l]
    # The CLI skips empty input lines only, so outputs line up with inputs.
    assert len(lines) == len(texts)
    return [json.loads(line) for line in lines]


def compare(texts, got, expected_ids, label):
    mismatches = [(t, g["ids"], e) for t, g, e in zip(texts, got, expected_ids) if g["ids"] != e]
    detail = "\n".join(f"  {t!r}: engine {g[:20]} hf {e[:20]}" for t, g, e in mismatches[:10])
    assert not mismatches, f"{label}: {len(mismatches)} of {len(texts)} encodings differ\n{detail}"


@pytest.fixture(scope="module")
def llama3(models_dir):
    path = models_dir / "llama3-tokenizer"
    if not (path / "tokenizer.json").exists():
        model_absent(f"Llama 3 tokenizer absent at {path}")
    return path


@pytest.fixture(scope="module")
def gpt2(models_dir):
    path = models_dir / "gpt2-tokenizer"
    if not (path / "encoder.json").exists():
        model_absent(f"GPT-2 tokenizer files absent at {path}")
    return path


@pytest.mark.parametrize("special", [True, False], ids=["special", "plain"])
def test_llama3_matches_hf_tokenizers(flashlite_bin, llama3, special):
    hf = tokenizers.Tokenizer.from_file(str(llama3 / "tokenizer.json"))
    hf.encode_special_tokens = not special  # plain: special-token strings are ordinary text
    got = engine_encode(flashlite_bin, llama3, CASES, special)
    compare(CASES, got, [hf.encode(t, add_special_tokens=False).ids for t in CASES], f"llama3 special={special}")
    # Byte-level BPE is lossless: decoding gives the text back.
    bad = [t for t, g in zip(CASES, got) if g["decoded"] != t]
    assert not bad, f"round trip failed for {bad[:5]}"
    assert [hf.decode(g["ids"], skip_special_tokens=False) for g in got] == [g["decoded"] for g in got]


def test_llama3_special_tokens_are_single_ids(flashlite_bin, llama3):
    got = engine_encode(flashlite_bin, llama3, ["<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>"], True)
    assert [g["ids"] for g in got] == [[128000], [128009], [128006]]
    got = engine_encode(flashlite_bin, llama3, ["<|eot_id|>"], False)
    assert len(got[0]["ids"]) > 1, "without --special a special-token string must be plain text"


def test_gpt2_matches_hf_tokenizers(flashlite_bin, gpt2):
    from tokenizers import decoders, models, pre_tokenizers

    hf = tokenizers.Tokenizer(models.BPE.from_file(str(gpt2 / "encoder.json"), str(gpt2 / "vocab.bpe")))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens(["<|endoftext|>"])
    got = engine_encode(flashlite_bin, gpt2, CASES, True)
    compare(CASES, got, [hf.encode(t, add_special_tokens=False).ids for t in CASES], "gpt2")
    bad = [t for t, g in zip(CASES, got) if g["decoded"] != t]
    assert not bad, f"round trip failed for {bad[:5]}"


def test_llama2c_tok512_round_trips(flashlite_bin, models_dir):
    path = models_dir / "stories260K" / "tok512.bin"
    if not path.exists():
        model_absent(f"tok512.bin absent at {path}")
    got = engine_encode(flashlite_bin, path, CASES, False)
    bad = [t for t, g in zip(CASES, got) if g["decoded"] != t]
    assert not bad, f"byte-fallback round trip failed for {bad[:5]}"
    assert all(0 <= i < 512 for g in got for i in g["ids"])
    # Known structure: " the" (a merged piece) is one token, and the dummy prefix is added.
    the = engine_encode(flashlite_bin, path, ["the"], False)[0]["ids"]
    assert len(the) == 1, the


def test_tok105_matches_sentencepiece(flashlite_bin, models_dir):
    spm = pytest.importorskip("sentencepiece", reason="pip package `sentencepiece` is needed")
    path = models_dir / "babyllama-tok105"
    if not (path / "tok105.model").exists():
        model_absent(f"tok105 files absent at {path}")
    sp = spm.SentencePieceProcessor(model_file=str(path / "tok105.model"))
    # SentencePiece normalises (collapses whitespace, NFKC); compare on text it leaves unchanged.
    texts = ["Once upon a time, there was a little girl named Lily.", "She said, \"Hello!\" and ran away.",
             "Tom's dog is big", "abc xyz 123", "Zebra? Quick!", "caf\u00e9 \u65e5\u672c"]
    got = engine_encode(flashlite_bin, path / "tok105.bin", texts, False)
    compare(texts, got, [sp.encode(t) for t in texts], "tok105 vs sentencepiece")


def _train_llama2_style(tmp_path, byte_fallback):
    """A Llama-2-style tokenizer.json (U+2581 for spaces, BPE merges, <0xXX> byte fallback), trained on the fly by
    `tokenizers` itself so the test needs no downloaded vocabulary."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=byte_fallback, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"] + ([f"<0x{b:02X}>" for b in range(256)] if byte_fallback else [])
    trainer = trainers.BpeTrainer(vocab_size=600 if byte_fallback else 300, special_tokens=specials,
                                  show_progress=False)
    corpus = [t for t in FIXED if "<|" not in t] * 3 + ["the quick brown fox jumps over the lazy dog"] * 20
    tok.train_from_iterator(corpus, trainer)
    if byte_fallback:
        # Byte tokens are ordinary vocabulary entries in Llama 2, not added tokens.
        data = json.loads(tok.to_str())
        data["added_tokens"] = [a for a in data["added_tokens"] if not a["content"].startswith("<0x")]
        tok = Tokenizer.from_str(json.dumps(data))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return tok, path


@pytest.mark.parametrize("byte_fallback", [True, False], ids=["byte_fallback", "unk"])
def test_llama2_style_tokenizer_json_matches_hf(flashlite_bin, tmp_path, byte_fallback):
    hf, path = _train_llama2_style(tmp_path, byte_fallback)
    texts = [t for t in CASES if "\u2581" not in t]
    got = engine_encode(flashlite_bin, path, texts, True)
    compare(texts, got, [hf.encode(t, add_special_tokens=False).ids for t in texts], f"llama2-style bf={byte_fallback}")
    if byte_fallback:
        bad = [t for t, g in zip(texts, got) if g["decoded"] != hf.decode(g["ids"], skip_special_tokens=False)]
        assert not bad, f"decode differs from HF for {bad[:5]}"


def test_tokenize_errors_are_clear(flashlite_bin, tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": {"type": "WordPiece", "vocab": {}}}')
    proc = run_cli(flashlite_bin, ["tokenize", "--model", str(tmp_path), "--text", "x"], check=False)
    assert proc.returncode != 0 and b"model type 'WordPiece' is unsupported" in proc.stderr, proc.stderr
    bad.write_text("{not json")
    proc = run_cli(flashlite_bin, ["tokenize", "--model", str(bad), "--text", "x"], check=False)
    assert proc.returncode != 0 and b"not valid JSON" in proc.stderr, proc.stderr
    trunc = tmp_path / "tok.bin"
    trunc.write_bytes(b"\x07\x00\x00\x00" + b"\x00\x00\x00\x00" + b"\x05\x00\x00\x00ab")
    proc = run_cli(flashlite_bin, ["tokenize", "--model", str(trunc), "--text", "x"], check=False)
    assert proc.returncode != 0 and b"corrupt or truncated" in proc.stderr, proc.stderr
    proc = run_cli(flashlite_bin, ["tokenize", "--model", str(tmp_path / "absent"), "--text", "x"], check=False)
    assert proc.returncode != 0 and b"does not exist" in proc.stderr, proc.stderr


# ---- crafted tokenizer files (the attacker's probes): each must load and match HF, or fail at once, clearly ----

def _bpe_json(vocab, merges=(), added=(), pre=None, norm=None, **model):
    m = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
         "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False, "vocab": vocab, "merges": list(merges)}
    m.update(model)
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": list(added), "normalizer": norm,
            "pre_tokenizer": pre, "post_processor": None, "decoder": None, "model": m}


def _added(id_, content, **flags):
    return dict({"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": True}, **flags)


def _limited_memory():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a 64 GiB allocation cannot hide under 2 GiB


@functools.lru_cache(maxsize=None)
def _sanitized(binary):
    """AddressSanitizer reserves terabytes of address space: no address-space limit for such a build."""
    with open(binary, "rb") as f:
        return b"__asan_init" in f.read()


def _tokenize_file(binary, path, text="hello world", limit_memory=False):
    limit = limit_memory and not _sanitized(binary)
    return subprocess.run([binary, "tokenize", "--model", str(path), "--text", text], capture_output=True, timeout=60,
                          preexec_fn=_limited_memory if limit else None)


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


CHARS = {c: i for i, c in enumerate(" abcdefghijklmnopqrstuvwxyz")}


@pytest.mark.parametrize("where", ["vocab", "added", "sparse"])
def test_huge_ids_fail_at_once_naming_field_and_limit(flashlite_bin, tmp_path, where):
    if where == "vocab":
        data, field = _bpe_json({"a": 0, "b": 2147483647}), b'model.vocab["b"]'
    elif where == "added":
        data, field = _bpe_json(dict(CHARS), added=[_added(2147483647, "<x>")]), b"added_tokens[0].id"
    else:  # below the limit, but an id space of 100k for 2 tokens
        data, field = _bpe_json({"a": 0, "b": 100000}), b"model.vocab"
    t0 = time.time()
    proc = _tokenize_file(flashlite_bin, _write(tmp_path, "tokenizer.json", data), limit_memory=True)
    assert proc.returncode == 2, proc.stderr
    assert field in proc.stderr and b"unsupported" in proc.stderr, proc.stderr
    assert (b"16777216" in proc.stderr) or (b"1028" in proc.stderr), proc.stderr  # the limit is named
    assert time.time() - t0 < 10


@pytest.mark.parametrize("value", [2 ** 32 + 5, -2 ** 63, 2 ** 63, -1, 5.0, 1e3, "5", True, None])
@pytest.mark.parametrize("where", ["vocab", "added"])
def test_ids_are_parsed_strictly(flashlite_bin, tmp_path, value, where):
    if where == "vocab":
        data, key = _bpe_json({"a": 0, "b": value}), b"'model.vocab[\"b\"]'"
    else:
        data, key = _bpe_json(dict(CHARS), added=[_added(value, "<x>")]), b"'added_tokens[0].id'"
    path = _write(tmp_path, "tokenizer.json", data)
    with pytest.raises(Exception):
        tokenizers.Tokenizer.from_file(str(path))  # Hugging Face rejects these too
    proc = _tokenize_file(flashlite_bin, path)
    assert proc.returncode == 2 and key in proc.stderr, proc.stderr
    assert b"must be a non-negative integer below 2^32" in proc.stderr, proc.stderr


@pytest.mark.parametrize("field,value,expected", [
    ("invert", "yes", b"'pre_tokenizer.invert' must be true or false, found the string \"yes\""),
    ("behavior", 5, b"'pre_tokenizer.behavior' must be Removed, Isolated, MergedWithPrevious, MergedWithNext or "
                    b"Contiguous, found the integer 5"),
    ("pattern", {"Regex": 5}, b"'pre_tokenizer.pattern.Regex' must be a string, found the integer 5"),
    ("pattern", None, b"'pre_tokenizer.pattern' must be an object, found null"),
])
def test_type_errors_name_file_key_and_expectation(flashlite_bin, tmp_path, field, value, expected):
    pre = {"type": "Split", "pattern": {"String": " "}, "behavior": "Removed", "invert": False, field: value}
    path = _write(tmp_path, "tokenizer.json", _bpe_json(dict(CHARS), pre=pre))
    proc = _tokenize_file(flashlite_bin, path)
    assert proc.returncode == 2, proc.stderr
    assert str(path).encode() in proc.stderr and expected in proc.stderr, proc.stderr
    assert b"json.exception" not in proc.stderr, proc.stderr
    bad = tmp_path / "broken.json"
    bad.write_text('{"model": {"vocab": {"a": 0}, "merges": []}, "added_tokens": [}')
    proc = _tokenize_file(flashlite_bin, bad)
    assert proc.returncode == 2 and b"not valid JSON: parse error at line 1" in proc.stderr, proc.stderr
    assert b"json.exception" not in proc.stderr, proc.stderr


def _word_tokenizer(tmp_path, pre):
    """Characters, plus 'hello', 'world', 'foo', ' ', '  ' as whole tokens through merges: each piece the
    pre-tokenizer makes shows in the ids."""
    vocab = dict(CHARS)
    merges = []
    for word in ["hello", "world", "foo", "  ", " w", "o ", "lo "]:
        for k in range(2, len(word) + 1):
            if word[:k] not in vocab:
                vocab[word[:k]] = len(vocab)
                merges.append([word[:k - 1], word[k - 1]])  # pairs: these tokens hold spaces
    return _write(tmp_path, "tokenizer.json", _bpe_json(vocab, merges, pre=pre)), vocab


SPLIT_TEXTS = ["hello world foo", "hello  world foo ", "  hello", "foo  ", "wow o w", "hello\tworld", "", " ",
               "ooo www", "héllo wörld"]


@pytest.mark.parametrize("pattern", [{"String": " "}, {"String": "o"}, {"Regex": r"\s+"}, {"Regex": r"\s*"},
                                     {"Regex": r"o|(?=w)"}, {"Regex": r"l+"}, {"String": ""}],
                         ids=["space", "o", "spaces", "empty-or-spaces", "lookahead", "l-run", "empty"])
@pytest.mark.parametrize("invert", [False, True], ids=["plain", "invert"])
@pytest.mark.parametrize("behavior", ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"])
def test_split_behaviors_match_hf(flashlite_bin, tmp_path, behavior, invert, pattern):
    pre = {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert}
    path, vocab = _word_tokenizer(tmp_path, pre)
    hf = tokenizers.Tokenizer.from_file(str(path))
    got = engine_encode(flashlite_bin, path, [t for t in SPLIT_TEXTS if t], False)
    texts = [t for t in SPLIT_TEXTS if t]
    compare(texts, got, [hf.encode(t, add_special_tokens=False).ids for t in texts], f"Split {behavior} {pattern}")
    if pattern == {"String": " "} and behavior == "Removed":  # the probe: three words, or the spaces when inverted
        want = [vocab[" "]] * 2 if invert else [vocab["hello"], vocab["world"], vocab["foo"]]
        assert got[0]["ids"] == want


@pytest.mark.parametrize("unk", [None, "<unk>", "<missing>"])
@pytest.mark.parametrize("fuse_unk", [False, True])
def test_byte_fallback_without_a_byte_token_matches_hf(flashlite_bin, tmp_path, unk, fuse_unk):
    vocab = dict(CHARS)
    vocab.update({"<unk>": len(vocab), "<0xC3>": len(vocab) + 1, "<0xA9>": len(vocab) + 2, "<0xE6>": len(vocab) + 3})
    path = _write(tmp_path, "tokenizer.json", _bpe_json(vocab, byte_fallback=True, unk_token=unk, fuse_unk=fuse_unk))
    hf = tokenizers.Tokenizer.from_file(str(path))
    texts = ["héllo", "日本 é", "ab日日日c", "é日é", "plain text"]
    for t in texts:  # one process per text: an encode error (unk missing) must be an error on that text alone
        try:
            want = hf.encode(t, add_special_tokens=False).ids
        except Exception:
            want = None
        proc = run_cli(flashlite_bin, ["tokenize", "--model", str(path), "--json", "--text", t], check=False)
        if want is None:
            assert proc.returncode == 2, proc.stderr
            assert b"model.unk_token '<missing>' is not in model.vocab" in proc.stderr, proc.stderr
            continue
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)["ids"]
        assert got == want, (t, got, want)
        assert all(0 <= i < len(vocab) for i in got)


def _llama2c_bin(pieces, max_len=None, scores=None):
    import struct

    out = struct.pack("<i", max_len if max_len is not None else max(len(p) for p in pieces))
    for k, p in enumerate(pieces):
        out += struct.pack("<fi", scores[k] if scores else 0.0, len(p)) + p
    return out


LLAMA2C_PIECES = [b"<unk>", b"<s>", b"</s>", b"<0x00>", b"<0xC3>", b" ", b"a", b"b", b" a", b"ab"]


@pytest.mark.parametrize("case", ["negative-length", "huge-length", "length-past-end", "huge-max-len",
                                  "zero-max-len", "header-only-3", "truncated-score", "nan-score", "few-tokens"])
def test_llama2c_bin_fields_are_checked_against_the_file(flashlite_bin, tmp_path, case):
    import struct

    good = _llama2c_bin(LLAMA2C_PIECES)
    data = {
        "negative-length": good[:4] + struct.pack("<fi", 0.0, -5) + good[12:],
        "huge-length": good[:4] + struct.pack("<fi", 0.0, 2 ** 31 - 1) + good[12:],
        "length-past-end": good + struct.pack("<fi", 0.0, 3) + b"x",
        "huge-max-len": struct.pack("<i", 2 ** 31 - 1) + good[4:],
        "zero-max-len": struct.pack("<i", 0) + good[4:],
        "header-only-3": good[:3],
        "truncated-score": good + b"\x00\x00",
        "nan-score": _llama2c_bin(LLAMA2C_PIECES, scores=[float("nan")] * len(LLAMA2C_PIECES)),
        "few-tokens": _llama2c_bin(LLAMA2C_PIECES[:2]),
    }[case]
    path = tmp_path / "tok.bin"
    path.write_bytes(data)
    proc = _tokenize_file(flashlite_bin, path, limit_memory=True)
    assert proc.returncode == 2, proc.stderr
    assert str(path).encode() in proc.stderr, proc.stderr


def test_llama2c_partial_byte_fallback_never_emits_invalid_ids(flashlite_bin, tmp_path):
    path = tmp_path / "tok.bin"
    path.write_bytes(_llama2c_bin(LLAMA2C_PIECES))  # <0x00> and <0xC3> only: "é" (C3 A9) cannot fall back fully
    for text in ["aé b", "\u00e9\u00e9", "b\u00c3a"]:
        proc = run_cli(flashlite_bin, ["tokenize", "--model", str(path), "--json", "--text", text], check=False)
        assert proc.returncode == 0, proc.stderr
        ids = json.loads(proc.stdout)["ids"]
        assert all(0 <= i < len(LLAMA2C_PIECES) for i in ids), ids
    ids = json.loads(run_cli(flashlite_bin, ["tokenize", "--model", str(path), "--json", "--text", "é"]).stdout)["ids"]
    assert ids == [5, 0], ids  # the dummy-prefix space, then <unk> for the character without all its byte tokens


ADDED_CASES = {  # (vocabulary changes, added tokens): Hugging Face's matching rules, edge by edge
    "strip-both": ({}, [_added(27, " ", lstrip=True, rstrip=True, special=False)]),
    "rstrip-overlap": ({}, [_added(27, " ", rstrip=True, special=False)]),
    "lstrip-only": ({}, [_added(27, " ", lstrip=True, special=False)]),
    "two-on-one-id": ({"hello": 27, "world": 27}, [_added(27, "hello"), _added(27, "world")]),
    "repeated-content": ({"hello": 27, "world": 27}, [_added(27, "hello"), _added(27, "world"),
                                                       _added(27, "hello", rstrip=True)]),
    "special-hides-plain": ({}, [_added(27, "<a>b"), _added(28, "<a>", special=False)]),
    "normalized": ({}, [_added(27, "lo w", normalized=True, special=False)]),
}


@pytest.mark.parametrize("name", sorted(ADDED_CASES))
@pytest.mark.parametrize("special", [True, False], ids=["special", "plain"])
def test_added_token_matching_edges_match_hf(flashlite_bin, tmp_path, name, special):
    extra, added = copy.deepcopy(ADDED_CASES[name])
    norm = {"type": "Replace", "pattern": {"String": " "}, "content": "_"} if name == "normalized" else None
    vocab = dict(CHARS, _=len(CHARS)) if norm else dict(CHARS)
    vocab.update(extra)
    next_id = len(vocab)
    for a in added:  # the ids Hugging Face gives them
        a["id"] = vocab.get(a["content"], next_id)
        next_id += a["content"] not in vocab
    path = _write(tmp_path, "tokenizer.json", _bpe_json(vocab, added=added, norm=norm))
    hf = tokenizers.Tokenizer.from_file(str(path))
    hf.encode_special_tokens = not special
    texts = ["a   b", "  hello world  hello", "x  ", "hello<a>b<a> c", "hello world", "lo wo  lo w"]
    got = engine_encode(flashlite_bin, path, texts, special)
    compare(texts, got, [hf.encode(t, add_special_tokens=False).ids for t in texts], f"added tokens {name}")
