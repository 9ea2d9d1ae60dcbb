"""The engine's tokenizers against independent implementations, through `flashlite tokenize --jsonl`:
Hugging Face `tokenizers` for the Llama 3 tokenizer.json (special tokens parsed and not) and for GPT-2 (built from
encoder.json + vocab.bpe), and `sentencepiece` for the babyllama tok105 vocabulary. Every byte-level encoding must also
decode back to its text exactly."""
import json
import random

import pytest

from engine_testlib import run_cli

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
        pytest.skip(f"Llama 3 tokenizer absent at {path}")
    return path


@pytest.fixture(scope="module")
def gpt2(models_dir):
    path = models_dir / "gpt2-tokenizer"
    if not (path / "encoder.json").exists():
        pytest.skip(f"GPT-2 tokenizer files absent at {path}")
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
        pytest.skip(f"tok512.bin absent at {path}")
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
        pytest.skip(f"tok105 files absent at {path}")
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
