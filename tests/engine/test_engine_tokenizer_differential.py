"""Differential test of the engine's tokenizer.json loader and encoder against Hugging Face `tokenizers`, on a few
hundred mutated files generated at test time with a fixed seed.

The bases are real tokenizers cut down so each case loads in milliseconds (Llama 3's and GPT-2's first ids with
the merges among them, the added tokens renumbered as Hugging Face numbers them) and Llama-2-style tokenizers trained
on the fly (byte fallback, Prepend/Replace normalizers, Metaspace with prepend_scheme "first", a Split chain). Each
case applies one to three mutations: vocabulary ids (changed, duplicated, removed, huge, negative, floats, strings),
merges (removed, repeated, reordered, malformed, pair form, mixed), pre-tokenizer / normalizer / decoder fields and
types (every Split behavior and invert, patterns, ByteLevel, Metaspace), added tokens (ids, flags, duplicates,
missing fields), byte fallback with missing byte tokens, unk tokens, dropout, model type and version.

For every case both must load and give the same ids (or both fail on the same texts), or both must reject the file.
Where Hugging Face accepts something flashlite intentionally does not run, flashlite must reject it at load with an
"unsupported" message; those are counted on their own. Anything else is a mismatch, and there must be none.
FLASHLITE_TOKENIZER_DIFF_CASES sets the number of cases (default 400), FLASHLITE_TOKENIZER_DIFF_SEED the seed;
FLASHLITE_TOKENIZER_DIFF_VERBOSE=1 prints one line per case."""
import copy
import json
import os
import random
import subprocess
import time

import pytest

tokenizers = pytest.importorskip("tokenizers", reason="pip package `tokenizers` is needed (scripts/requirements.txt)")

SEED = int(os.environ.get("FLASHLITE_TOKENIZER_DIFF_SEED", "20240611"))
N_CASES = int(os.environ.get("FLASHLITE_TOKENIZER_DIFF_CASES", "400"))
VERBOSE = bool(os.environ.get("FLASHLITE_TOKENIZER_DIFF_VERBOSE"))  # one line per case

TEXTS = [
    "hello world foo", "Hello, world!", "  leading spaces", "trailing spaces   ", "multiple   spaces  between",
    "tabs\tand\nnewlines\n\n\nend", "\r\n windows line\r\n", " ", "\n\n \n", "a", "it's they're we've I'M",
    "1234567890", "3.14159 and 2,718", "x1y22z333w4444", "café naïve résumé", "Straße größer ÄÖÜ",
    "日本語のテキスト", "中文字符，标点！", "Привет, мир!", "مرحبا", "😀😃🎉 emoji 👍🏽 👨‍👩‍👧", "🇫🇷 flags",
    "def f(x):\n    return x**2  # comment\n", "<html>&amp;</html>", "!!!???...", "“quotes” ‘single’",
    "\u00a0non-breaking\u00a0space", "\u3000ideographic", "zero\u200bwidth", "line\u2028sep", "▁meta▁space",
    "<|begin_of_text|>Hello<|eot_id|>", "text<|eot_id|>more <|end_of_text|>", "<s>Hello</s> <unk>", "<|endoftext|> x",
    "  <s>  spaced  </s>  ", "hello<|x|>world", "x" * 40, "ab" * 20, "wor world", "\n\n\n", "é" * 5,
]

# Patterns both Oniguruma (Hugging Face) and PCRE2 (flashlite) read the same way, plus a few that are invalid in
# both and a few that only Oniguruma accepts (flashlite must call those unsupported).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
PATTERNS = [
    {"String": " "}, {"String": "o"}, {"String": ""}, {"String": "▁"}, {"String": "ab"}, {"String": "\n"},
    {"String": "."}, {"String": "é"}, {"String": "(["},
    {"Regex": r"\s+"}, {"Regex": r"\p{N}"}, {"Regex": r"\p{N}{1,3}"}, {"Regex": r"\s*"}, {"Regex": r"(?=w)"},
    {"Regex": r"o|(?=w)"}, {"Regex": r"[aeiou]+"}, {"Regex": r"\p{L}+"}, {"Regex": r"(?i:'s|'t|'re)"},
    {"Regex": r"\s+(?!\S)"}, {"Regex": r"^\s"}, {"Regex": r"\s$"}, {"Regex": LLAMA3_PATTERN}, {"Regex": GPT2_PATTERN},
    {"Regex": r"\p{P}"}, {"Regex": r"[^\p{L}\p{N}\s]"}, {"Regex": r"\d+"}, {"Regex": r"\w+"},
    {"Regex": r"("}, {"Regex": r"[a-"}, {"Regex": r"\h+"}, {"Regex": r"(?m)a.b"},
]
BEHAVIORS = ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]


class NotApplicable(Exception):
    pass


# ---- base tokenizers ----

def hf_added_ids(d):
    """Renumbers added_tokens the way Hugging Face numbers them (vocabulary id, else the next after the vocabulary)."""
    vocab, next_id, seen = d["model"]["vocab"], len(d["model"]["vocab"]), {}
    for a in d["added_tokens"]:
        if a["content"] in seen:
            a["id"] = seen[a["content"]]
        elif a["content"] in vocab:
            a["id"] = vocab[a["content"]]
        else:
            a["id"], next_id = next_id, next_id + 1
        seen[a["content"]] = a["id"]


def trim(d, n_vocab, n_added):
    """The first n_vocab ids of a rank-ordered BPE vocabulary with the merges among them."""
    m = d["model"]
    m["vocab"] = {k: v for k, v in m["vocab"].items() if v < n_vocab}
    merges = []
    for e in m["merges"]:
        a, b = e.split(" ") if isinstance(e, str) else e
        if a in m["vocab"] and b in m["vocab"] and a + b in m["vocab"]:
            merges.append(e)
    m["merges"] = merges
    d["added_tokens"] = d["added_tokens"][:n_added]
    hf_added_ids(d)
    return d


def trained(kind):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    byte_fallback = kind in ("llama2_bf", "metaspace_first")
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=byte_fallback, fuse_unk=True))
    if kind == "metaspace_first":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    elif kind == "split_chain":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(tokenizers.Regex(r"\p{N}"), "isolated", False),
            pre_tokenizers.Split(" ", "merged_with_next", False),
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)])
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"] + ([f"<0x{b:02X}>" for b in range(256)] if byte_fallback else [])
    trainer = trainers.BpeTrainer(vocab_size=700 if byte_fallback else 300, special_tokens=specials,
                                  show_progress=False)
    corpus = [t for t in TEXTS if "<" not in t] * 3 + ["the quick brown fox jumps over the lazy dog"] * 20
    tok.train_from_iterator(corpus, trainer)
    d = json.loads(tok.to_str())
    # Byte tokens are ordinary vocabulary entries in Llama 2, not added tokens.
    d["added_tokens"] = [a for a in d["added_tokens"] if not a["content"].startswith("<0x")]
    return d


@pytest.fixture(scope="module")
def bases(models_dir):
    out = {}
    llama3 = models_dir / "llama3-tokenizer" / "tokenizer.json"
    if llama3.exists():
        out["llama3"] = trim(json.loads(llama3.read_text()), 1500, 12)
    gpt2 = models_dir / "gpt2-tokenizer"
    if (gpt2 / "encoder.json").exists():
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        hf = Tokenizer(models.BPE.from_file(str(gpt2 / "encoder.json"), str(gpt2 / "vocab.bpe")))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        hf.add_special_tokens(["<|endoftext|>"])
        out["gpt2"] = trim(json.loads(hf.to_str()), 1200, 1)
    for kind in ("llama2_bf", "llama2_unk", "metaspace_first", "split_chain"):
        out[kind] = trained(kind)
    return out


# ---- mutations: each changes the dict in place and returns a short description ----

def pick(rng, seq):
    if not seq:
        raise NotApplicable()
    return rng.choice(list(seq))


def walk(node, key):
    """Every component object under a normalizer / pre_tokenizer / decoder, Sequences included."""
    if not isinstance(node, dict):
        return []
    out = [node]
    for child in node.get(key, []) if isinstance(node.get(key), list) else []:
        out += walk(child, key)
    return out


SEQ_KEY = {"pre_tokenizer": "pretokenizers", "normalizer": "normalizers", "decoder": "decoders"}


def components(d, type_):
    """The pre-tokenizer and decoder components of one type."""
    return [n for k in ("pre_tokenizer", "decoder") for n in walk(d.get(k), SEQ_KEY[k]) if n.get("type") == type_]

ODD_VALUES = [None, True, "yes", 5, 1.5, [], {}]


def m_vocab_id(rng, d):
    vocab = d["model"]["vocab"]
    tok = pick(rng, vocab)
    ids = list(vocab.values())
    new = pick(rng, [pick(rng, ids), max(ids) + 1, max(ids) + 10, max(ids) + 5000, 2 ** 24, 2 ** 31 - 1,
                     2 ** 32 - 1, 2 ** 32 + 5, -1, -2 ** 63, 2 ** 63, 1.5, 5.0, "5", None, True])
    vocab[tok] = new
    return f"vocab[{tok!r}] = {new!r}"


def m_vocab_remove(rng, d):
    vocab = d["model"]["vocab"]
    tok = pick(rng, [t for t in vocab if len(t) == 1] if rng.random() < 0.5 else vocab)
    del vocab[tok]
    return f"del vocab[{tok!r}]"


def m_vocab_add(rng, d):
    vocab = d["model"]["vocab"]
    tok = pick(rng, ["zz", "😀", "wor", " world", "é", "<unk>", "<0xE6>", "\u2581\u2581", "hello"])
    vocab[tok] = pick(rng, [len(vocab), max(vocab.values()) + 1, pick(rng, list(vocab.values()))])
    hf_added_ids(d)  # keep the added tokens consistent, so the vocabulary is what changes
    return f"vocab[{tok!r}] = {vocab[tok]}"


def m_vocab_type(rng, d):
    d["model"]["vocab"] = pick(rng, [[], "x", None, {}, {"a": 0}])
    return f"vocab = {d['model']['vocab']!r}"


def m_merges(rng, d):
    merges = d["model"]["merges"]
    if not merges:
        raise NotApplicable()
    op = pick(rng, ["remove", "duplicate", "swap", "corrupt", "pairs", "mixed", "unknown"])
    i = rng.randrange(len(merges))
    if op == "remove":
        del merges[i: i + rng.randint(1, 20)]
    elif op == "duplicate":
        merges.insert(rng.randrange(len(merges) + 1), copy.deepcopy(merges[i]))
    elif op == "swap":
        j = rng.randrange(len(merges))
        merges[i], merges[j] = merges[j], merges[i]
    elif op == "corrupt":
        merges[i] = pick(rng, ["a b c", "ab", "", " a b", "a  b", ["a"], ["a", "b", "c"], 5, None, ["a", 5]])
    elif op == "pairs":
        d["model"]["merges"] = [e.split(" ") if isinstance(e, str) else e for e in merges]
    elif op == "mixed":
        merges[i] = merges[i].split(" ") if isinstance(merges[i], str) else " ".join(merges[i])
    else:
        merges.append(pick(rng, ["qq zz", "a \u2603"]))
    return f"merges {op} at {i}"


def m_split(rng, d):
    nodes = [n for n in walk(d.get("pre_tokenizer"), "pretokenizers") if n.get("type") == "Split"]
    if not nodes or rng.random() < 0.3:  # add a Split in front of (or behind) the existing pre-tokenizer
        new = {"type": "Split", "pattern": pick(rng, PATTERNS), "behavior": pick(rng, BEHAVIORS),
               "invert": rng.random() < 0.5}
        old = [d["pre_tokenizer"]] if d.get("pre_tokenizer") else []
        d["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [new] + old if rng.random() < 0.5 else old + [new]}
        return f"add Split {new}"
    n = pick(rng, nodes)
    field = pick(rng, ["behavior", "behavior", "invert", "invert", "pattern", "pattern", "drop", "odd"])
    if field == "behavior":
        n["behavior"] = pick(rng, BEHAVIORS + ["removed", "Foo"])
    elif field == "invert":
        n["invert"] = not n["invert"] if rng.random() < 0.8 else pick(rng, ODD_VALUES)
    elif field == "pattern":
        n["pattern"] = pick(rng, PATTERNS + [{"String": "a", "Regex": "b"}, {}, {"Foo": "a"}, {"Regex": 5}])
    elif field == "drop":
        del n[pick(rng, ["pattern", "behavior", "invert", "type"])]
    else:
        n[pick(rng, ["pattern", "behavior", "invert"])] = pick(rng, ODD_VALUES)
    return f"Split {field} -> {n}"


def m_byte_level(rng, d):
    n = pick(rng, components(d, "ByteLevel"))
    key = pick(rng, ["add_prefix_space", "use_regex", "trim_offsets"])
    if rng.random() < 0.6:
        n[key] = not n.get(key, True)
    elif rng.random() < 0.5:
        n.pop(key, None)
    else:
        n[key] = pick(rng, ODD_VALUES)
    return f"ByteLevel {key} -> {n.get(key, '<absent>')!r}"


def m_metaspace(rng, d):
    nodes = components(d, "Metaspace")
    if not nodes:
        nodes = [{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}]
        old = [d["pre_tokenizer"]] if d.get("pre_tokenizer") else []
        d["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": old + nodes}
    n = pick(rng, nodes)
    key = pick(rng, ["prepend_scheme", "prepend_scheme", "replacement", "split", "add_prefix_space"])
    values = {"prepend_scheme": ["first", "never", "always", "sometimes", None, "<absent>"],
              "replacement": ["▁", "_", " ", "ab", "", 5, "<absent>"], "split": [True, False, None, "x", "<absent>"],
              "add_prefix_space": [True, False, None, "<absent>"]}[key]
    v = pick(rng, values)
    if v == "<absent>":
        n.pop(key, None)
    else:
        n[key] = v
    return f"Metaspace {key} -> {v!r}"


def m_pre_tokenizer(rng, d):
    d["pre_tokenizer"] = pick(rng, [
        None, {"type": "Whitespace"}, {"type": "Digits", "individual_digits": True}, {"type": "Foo"}, {"type": 5},
        [], "x", {"type": "Sequence", "pretokenizers": []}, {"type": "Sequence"},
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        {"type": "Sequence", "pretokenizers": [d.get("pre_tokenizer")] if d.get("pre_tokenizer") else []}])
    return f"pre_tokenizer = {json.dumps(d['pre_tokenizer'])[:80]}"


def m_normalizer(rng, d):
    choices = [
        None, {"type": "Prepend", "prepend": "▁"}, {"type": "Prepend", "prepend": "x"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        {"type": "Replace", "pattern": {"Regex": r"\s+"}, "content": " "},
        {"type": "Replace", "pattern": {"String": ""}, "content": "x"},
        {"type": "Replace", "pattern": {"String": "o"}, "content": ""},
        {"type": "Replace", "pattern": {"Regex": "^."}, "content": "yz"},
        {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                             {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        {"type": "NFC"}, {"type": "Lowercase"}, {"type": "Prepend"}, {"type": "Prepend", "prepend": 5},
        {"type": "Replace", "pattern": {"String": "a", "Regex": "b"}, "content": "x"}, {"type": "Foo"},
        {"type": "Sequence", "normalizers": [None]}, "x",
    ]
    old = d.get("normalizer")
    new = pick(rng, choices)
    if old and isinstance(new, dict) and rng.random() < 0.3:
        new = {"type": "Sequence", "normalizers": [old, new]}
    d["normalizer"] = new
    return f"normalizer = {json.dumps(new)[:80]}"


def m_decoder(rng, d):
    d["decoder"] = pick(rng, [
        None, {"type": "ByteLevel"}, {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        {"type": "Strip", "content": " ", "start": -1, "stop": 0},
        {"type": "Strip", "content": "ab", "start": 1, "stop": 0}, {"type": "Fuse"}, {"type": "ByteFallback"},
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"}, {"type": "CTC"}, {"type": "Foo"},
        {"type": "Sequence",
         "decoders": [{"type": "Fuse"}, {"type": "Strip", "content": " ", "start": "1", "stop": 0}]},
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}])
    return f"decoder = {json.dumps(d['decoder'])[:80]}"


def m_added(rng, d):
    added = d["added_tokens"]
    op = pick(rng, ["id", "duplicate", "duplicate_flags", "flag", "flag", "drop_field", "new", "new", "content",
                    "type"])
    if op == "type":
        d["added_tokens"] = pick(rng, [None, {}, "x", []])
        return f"added_tokens = {d['added_tokens']!r}"
    if op == "new":
        content = pick(rng, ["<|x|>", "hello", " ", "ab", "wor", "\n\n", "é", "▁", "<s>", "  "])
        token = {"id": 0, "content": content, "single_word": False, "lstrip": rng.random() < 0.3,
                 "rstrip": rng.random() < 0.3, "normalized": rng.random() < 0.5, "special": rng.random() < 0.5}
        added.append(token)
        hf_added_ids(d)
        if rng.random() < 0.15:
            token["id"] += rng.choice([-1, 1, 1000])
        return f"new added token {token}"
    a = pick(rng, added)
    if op == "id":
        a["id"] = pick(rng, [a["id"] + 1, a["id"] - 1, 0, 2 ** 31 - 1, 2 ** 32 + 5, -1, 1.0, "1"])
    elif op == "duplicate":
        added.insert(rng.randrange(len(added) + 1), copy.deepcopy(a))
    elif op == "duplicate_flags":
        b = copy.deepcopy(a)
        b[pick(rng, ["special", "lstrip", "rstrip", "normalized"])] ^= True
        added.append(b)
    elif op == "flag":
        key = pick(rng, ["special", "lstrip", "rstrip", "normalized", "single_word"])
        a[key] = not a[key] if rng.random() < 0.85 else pick(rng, ODD_VALUES)
    elif op == "drop_field":
        del a[pick(rng, ["id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"])]
    else:
        a["content"] = pick(rng, ["", "a", " ", pick(rng, d["model"]["vocab"]) if d["model"]["vocab"] else "a", 5])
        if rng.random() < 0.7:
            hf_added_ids(d)
    return f"added {op} -> {a}"


def m_model(rng, d):
    m = d["model"]
    key = pick(rng, ["byte_fallback", "byte_fallback", "unk_token", "unk_token", "fuse_unk", "ignore_merges",
                     "dropout", "continuing_subword_prefix", "end_of_word_suffix", "type", "drop_bytes"])
    if key == "drop_bytes":  # byte fallback with some byte tokens missing
        byte_tokens = [t for t in m["vocab"] if t.startswith("<0x")]
        for t in rng.sample(byte_tokens, min(len(byte_tokens), rng.randint(1, 200))):
            del m["vocab"][t]
        m["byte_fallback"] = True
        return "removed byte tokens"
    values = {"byte_fallback": [True, False, None, "yes"], "fuse_unk": [True, False, 1],
              "unk_token": ["<unk>", "<s>", "a", None, 5, "<not-there>"], "ignore_merges": [True, False, "no"],
              "dropout": [0, 0.0, 0.5, 1, 2, -0.1, "x", None, 1e-50],
              "continuing_subword_prefix": ["", "##", None, 5], "end_of_word_suffix": ["", "</w>", None],
              "type": ["WordPiece", "Foo", "<absent>", 5, "BPE"]}[key]
    v = pick(rng, values)
    if v == "<absent>":
        m.pop(key, None)
    else:
        m[key] = v
    return f"model.{key} = {v!r}"


def m_top(rng, d):
    key = pick(rng, ["version", "version", "model", "truncation"])
    if key == "model":
        del d["model"]
        return "del model"
    if key == "truncation":
        d["truncation"] = pick(rng, [None, "x", 5])
        return f"truncation = {d['truncation']!r}"
    d["version"] = pick(rng, ["2.0", 1.0, None, "1.0"])
    return f"version = {d['version']!r}"


MUTATIONS = [(m_vocab_id, 4), (m_vocab_remove, 2), (m_vocab_add, 2), (m_vocab_type, 1), (m_merges, 5), (m_split, 8),
             (m_byte_level, 3), (m_metaspace, 4), (m_pre_tokenizer, 3), (m_normalizer, 4), (m_decoder, 3),
             (m_added, 7), (m_model, 6), (m_top, 1)]


def mutate(rng, d):
    done = []
    for _ in range(rng.choice([1, 1, 1, 2, 2, 3])):
        for _attempt in range(10):
            fn = rng.choices([f for f, _ in MUTATIONS], weights=[w for _, w in MUTATIONS])[0]
            try:
                done.append(fn(rng, d))
                break
            except (NotApplicable, KeyError, TypeError, AttributeError, ValueError, IndexError):
                continue
    return done


# ---- running both ----

def hf_outcome(path, special):
    """(None, load error) or (per-text ids or ("error", message), None)."""
    try:
        tok = tokenizers.Tokenizer.from_file(str(path))
    except BaseException as e:  # pyo3 panics derive from BaseException
        if isinstance(e, KeyboardInterrupt):
            raise
        return None, str(e)
    tok.encode_special_tokens = not special
    out = []
    for t in TEXTS:
        try:
            out.append(tok.encode(t, add_special_tokens=False).ids)
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt):
                raise
            out.append(("error", str(e)))
    return out, None


def cli(binary, path, texts, special):
    stdin = "".join(json.dumps(t) + "\n" for t in texts).encode()
    args = [binary, "tokenize", "--model", str(path), "--jsonl"] + (["--special"] if special else [])
    proc = subprocess.run(args, input=stdin, capture_output=True, timeout=60)
    lines = [json.loads(l)["ids"] for l in proc.stdout.decode().split("\n") if l]
    return proc.returncode, lines, proc.stderr.decode(errors="replace")


def fl_outcome(binary, path, special):
    """(None, load error, rc) or (per-text ids or ("error", message), None, 0). Exit code 2 is a flashlite::Error;
    anything else (1: another exception type, negative: a signal) is reported as a crash."""
    rc, _, err = cli(binary, path, [], special)
    if rc != 0:
        return None, err, rc
    out, i = [], 0
    while i < len(TEXTS):
        rc, lines, err = cli(binary, path, TEXTS[i:], special)
        out += lines
        i += len(lines)
        if rc == 0:
            assert i == len(TEXTS), f"{len(lines)} lines for {len(TEXTS[i:])} texts"
            break
        if rc != 2:
            return None, f"crash (exit {rc}) on {TEXTS[i]!r}: {err}", rc
        out.append(("error", err))
        i += 1
    return out, None, 0


def same(a, b):
    return a == b or (isinstance(a, tuple) and isinstance(b, tuple))


def test_mutated_tokenizer_json_matches_hf(flashlite_bin, bases, tmp_path):
    rng = random.Random(SEED)
    names = sorted(bases)
    counts = {"cases": 0, "both_accept_equal": 0, "both_reject": 0, "flashlite_rejects_unsupported": 0, "mismatches": 0}
    mismatches = []
    t0 = time.time()
    for case in range(N_CASES):
        base = names[case % len(names)]
        d = copy.deepcopy(bases[base])
        what = mutate(rng, d) if case >= len(names) else ["unmutated"]
        special = rng.random() < 0.7
        path = tmp_path / f"case{case}.json"
        path.write_text(json.dumps(d, ensure_ascii=rng.random() < 0.5))
        hf, hf_err = hf_outcome(path, special)
        fl, fl_err, fl_rc = fl_outcome(flashlite_bin, path, special)
        counts["cases"] += 1
        label = f"case {case} ({base}, special={special}, {'; '.join(what)})"
        if fl_rc not in (0, 2):
            kind, detail = "mismatch", f"flashlite crashed: {fl_err}"
        elif hf is None and fl is None:
            kind, detail = "both_reject", ""
        elif hf is None:
            kind, detail = "mismatch", f"HF rejects ({hf_err[:200]}) but flashlite loads"
        elif fl is None:
            unsupported = "unsupported" in fl_err
            kind = "flashlite_rejects_unsupported" if unsupported else "mismatch"
            detail = f"HF loads but flashlite rejects without saying unsupported: {fl_err.strip()}"
        else:
            bad = [(t, h, f) for t, h, f in zip(TEXTS, hf, fl) if not same(h, f)]
            kind = "mismatch" if bad else "both_accept_equal"
            detail = "; ".join(f"{t!r}: hf {str(h)[:120]} flashlite {str(f)[:120]}" for t, h, f in bad[:3])
        counts["mismatches" if kind == "mismatch" else kind] += 1
        if VERBOSE:
            reasons = f"hf: {(hf_err or 'ok')[:100]!r} flashlite: {(fl_err or 'ok').strip()[:160]!r}"
            print(f"{kind:30s} {label[:200]}\n    {reasons}")
        if kind == "mismatch":
            mismatches.append(f"{label}: {detail}")
    counts["seconds"] = round(time.time() - t0, 1)
    print("\ntokenizer.json differential vs Hugging Face tokenizers:", json.dumps(counts))
    assert not mismatches, f"{len(mismatches)} mismatches:\n" + "\n".join(mismatches[:20])
    # The mutations must leave enough loadable files for the comparison to mean something.
    assert counts["both_accept_equal"] >= counts["cases"] // 4, counts
    assert counts["both_reject"] >= counts["cases"] // 10, counts
