"""The engine's safetensors parser against the reference, the `safetensors` package: valid files written by the package
(and by hand, for dtypes numpy lacks) are mutated — bytes overwritten, cut, appended; the header length changed; the
header's JSON edited (offsets, shapes, dtypes, duplicate keys, __metadata__, array forms, whitespace) — and every
file must get the same verdict from both: both accept it or both reject it. flashlite's verdicts come from
flashlite_safetensors_check (tests/engine/safetensors_check.cpp), built beside bin/flashlite."""
import json
import os
import pathlib
import random
import struct
import subprocess

import pytest

from engine_testlib import REPO

np = pytest.importorskip("numpy")
safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import save as st_save  # noqa: E402

SEED = int(os.environ.get("FLASHLITE_DIFF_SEED", "20240611"))
DTYPES = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ",
          "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"]
NOT_DTYPES = ["f32", "F8", "I4", "Q4_0", "F128", "", "F32 "]


@pytest.fixture(scope="module")
def st_check():
    env = os.environ.get("FLASHLITE_ST_CHECK")
    if env:
        path = pathlib.Path(env)
    else:
        cli = os.environ.get("FLASHLITE_BIN")
        path = (pathlib.Path(cli).parent if cli else REPO / "build" / "bin") / "flashlite_safetensors_check"
    if not path.exists() and (env or os.environ.get("FLASHLITE_BIN")):  # scripts/test.sh builds it: must exist
        pytest.fail(f"{path} does not exist")
    if not path.exists():
        pytest.skip(f"{path} not built (or set FLASHLITE_ST_CHECK)")
    return str(path)


# ---- valid files ----

def pack(header_text, data, pad=True):
    h = header_text.encode() if isinstance(header_text, str) else header_text
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def hand_written():
    """A file the package cannot write from numpy: BF16, F8, F4 and F6 tensors, a scalar, an empty tensor."""
    specs = [("w.bf16", "BF16", [3, 4], 24), ("w.f8", "F8_E4M3", [5], 5), ("w.f4", "F4", [6], 3),
             ("w.f6", "F6_E2M3", [4], 3), ("w.scalar", "F32", [], 4), ("w.empty", "F16", [0, 7], 0)]
    header, data = {}, b""
    for name, dtype, shape, nbytes in specs:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + nbytes]}
        data += bytes(random.Random(nbytes).randrange(256) for _ in range(nbytes))
    header["__metadata__"] = {"format": "pt", "note": "hand written"}
    return pack(json.dumps(header), data)


def base_files():
    rng = np.random.default_rng(7)
    a = {"model.embed_tokens.weight": rng.normal(size=(6, 4)).astype(np.float32),
         "model.norm.weight": rng.normal(size=(4,)).astype(np.float16),
         "ids": np.arange(5, dtype=np.int64), "mask": np.array([True, False, True]),
         "bytes": np.arange(7, dtype=np.uint8), "scalar": np.array(3.5, dtype=np.float64),
         "empty": np.zeros((0, 3), dtype=np.float32)}
    b = {"only": rng.normal(size=(2, 3, 2)).astype(np.float32)}
    return [st_save(a, metadata={"format": "np"}), st_save(b), hand_written()]


def split(blob):
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8:8 + n]), blob[8 + n:]


# ---- mutations: each returns (description, bytes) ----

INTERESTING = b'{}[]":,0123456789 -.eE\t\n\x00\xff\x7f\xc3FIU_'


def flip_header(rng, blob):
    n = struct.unpack("<Q", blob[:8])[0]
    if n == 0 or len(blob) < 8 + n:
        return "unchanged (no header)", blob
    out = bytearray(blob)
    where = []
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(8, 8 + n)
        out[i] = rng.choice(INTERESTING) if rng.random() < 0.7 else rng.randrange(256)
        where.append(i)
    return f"header bytes {where} overwritten", bytes(out)


def flip_data(rng, blob):
    n = struct.unpack("<Q", blob[:8])[0]
    if len(blob) == 8 + n:
        return "unchanged (no data)", blob
    out = bytearray(blob)
    i = rng.randrange(8 + n, len(blob))
    out[i] ^= 0xFF
    return f"data byte {i} flipped", bytes(out)


def cut(rng, blob):
    k = rng.randrange(0, len(blob))
    return f"truncated to {k} bytes", blob[:k]


def append(rng, blob):
    k = rng.choice([1, 2, 4, 8, 13])
    return f"{k} bytes appended", blob + bytes(rng.randrange(256) for _ in range(k))


def header_length(rng, blob):
    n = struct.unpack("<Q", blob[:8])[0]
    m = rng.choice([n - 1, n + 1, n - 2, n + 2, n - 8, n + 8, 0, 1, 2**63, 2**64 - 1, 100_000_001, len(blob)])
    m %= 2**64
    return f"header length {n} -> {m}", struct.pack("<Q", m) + blob[8:]


class RawJson(str):
    """JSON text inserted as is (forms json.dumps cannot write: -0, 1.0 for an int, duplicate keys)."""


def render(members, ws=""):
    parts = []
    for k, v in members:
        parts.append(json.dumps(k) + ws + ":" + ws + (str(v) if isinstance(v, RawJson) else json.dumps(v)))
    return "{" + ws + ("," + ws).join(parts) + ws + "}"


def edit_header(rng, blob):
    """One or two structural edits of the header, then re-serialised (with the header length kept right)."""
    header, data = split(blob)
    members = list(header.items())
    tensors = [i for i, (k, _) in enumerate(members) if k != "__metadata__"]
    done = []
    for _ in range(rng.choice([1, 1, 2])):
        kind = rng.randrange(22)
        i = rng.choice(tensors) if tensors else None
        name, info = members[i] if i is not None else (None, None)
        info = json.loads(json.dumps(info)) if isinstance(info, dict) else info
        if i is None:
            kind = 16
        elif not isinstance(info, dict) or len({"dtype", "shape", "data_offsets"} & info.keys()) < 3:  # edited before
            kind = rng.choice([7, 8, 16, 17])
        if kind == 0:  # shift an offset
            j, d = rng.randrange(2), rng.choice([-4, -2, -1, 1, 2, 4])
            info["data_offsets"][j] = max(0, info["data_offsets"][j] + d)
            done.append(f"{name} offset[{j}] {d:+}")
        elif kind == 1:  # swap the offsets of two tensors
            k = rng.choice([j for j in tensors if isinstance(members[j][1], dict) and "data_offsets" in members[j][1]])
            other = json.loads(json.dumps(members[k][1]))
            info["data_offsets"], other["data_offsets"] = other["data_offsets"], info["data_offsets"]
            members[k] = (members[k][0], other)
            done.append(f"offsets of {name} and {members[k][0]} swapped")
        elif kind == 2:  # another dtype, known or not
            info["dtype"] = rng.choice(DTYPES + NOT_DTYPES)
            done.append(f"{name} dtype {info['dtype']!r}")
        elif kind == 3:  # another shape
            s = info["shape"]
            choice = rng.randrange(6)
            if choice == 0 and s:
                s = s[:-1]
            elif choice == 1:
                s = s + [1]
            elif choice == 2:
                s = list(reversed(s)) + [rng.choice([0, 2])]
            elif choice == 3:
                s = [2**32, 2**32, 4]
            elif choice == 4:
                s = [rng.choice([2**61, 2**62, 2**63, 2**64 - 1]), 0]
            else:
                s = [0] + [2**64 - 1]
            info["shape"] = s
            done.append(f"{name} shape {s}")
        elif kind == 4:  # duplicate a tensor entry (same or different content)
            dup = json.loads(json.dumps(info))
            if rng.random() < 0.5:
                dup["data_offsets"] = [dup["data_offsets"][0] + 4, dup["data_offsets"][1] + 4]
            members.insert(rng.randrange(len(members) + 1), (name, dup))
            done.append(f"{name} duplicated")
        elif kind == 5:  # unknown field, nested or not
            info[rng.choice(["x", "note", "dtype2"])] = rng.choice([1, "s", None, [[[]]], {"a": {"b": [1, 2]}}])
            done.append(f"{name} extra field")
        elif kind == 6:  # duplicate a known field
            text = render(list(info.items()) + [(rng.choice(["dtype", "shape", "data_offsets"]),
                                                 info[rng.choice(["dtype", "shape", "data_offsets"])])])
            info = RawJson(text)
            done.append(f"{name} duplicate field")
        elif kind == 7:  # __metadata__ variants
            meta = rng.choice([None, {}, {"a": 1}, [], "x", {"a": "b", "c": None}, RawJson('{"a":"b","a":1}'),
                               RawJson('{"a":1,"a":"b"}'), {"format": "pt"}])
            members = [m for m in members if m[0] != "__metadata__"]
            members.insert(rng.randrange(len(members) + 1), ("__metadata__", meta))
            if rng.random() < 0.3:
                members.append(("__metadata__", {"format": "pt"}))
            tensors = [j for j, (k, _) in enumerate(members) if k != "__metadata__"]
            done.append(f"__metadata__ {meta!r}")
            continue
        elif kind == 8:  # remove a tensor: its bytes become unused
            members.pop(i)
            tensors = [j for j, (k, _) in enumerate(members) if k != "__metadata__"]
            done.append(f"{name} removed")
            continue
        elif kind == 9:  # a second tensor on the same bytes
            members.append((name + ".alias", info))
            done.append(f"{name} aliased")
            continue
        elif kind == 10:  # an empty tensor at some offset
            off = rng.choice([0, info["data_offsets"][0], info["data_offsets"][1], len(data), len(data) + 4])
            members.append(("zero." + str(off), {"dtype": "F32", "shape": [0], "data_offsets": [off, off]}))
            done.append(f"empty tensor at {off}")
            continue
        elif kind == 11:  # the array form [dtype, shape, offsets], or a broken one
            arr = [info["dtype"], info["shape"], info["data_offsets"]]
            arr = rng.choice([arr, arr[:2], arr + [1], arr[::-1]])
            info = arr
            done.append(f"{name} as array {arr}")
        elif kind == 12:  # the dtype as a map
            info = RawJson(render([("dtype", RawJson(rng.choice([
                '{"%s":null}' % info["dtype"], '{"%s":1}' % info["dtype"], '{}', '{"%s":null,"U8":null}' % info["dtype"],
                '{"XX":null}']))), ("shape", info["shape"]), ("data_offsets", info["data_offsets"])]))
            done.append(f"{name} dtype map")
        elif kind == 13:  # offsets in odd forms
            b, e = info["data_offsets"]
            form = rng.choice([f"[{b},{e},{e}]", f"[{b}]", f'["{b}",{e}]', f"[{b}.0,{e}]",
                               f"[-0,{e}]" if b == 0 else f"[{b},{e}]", f"[{b},{e}e0]", f"{{\"0\":{b},\"1\":{e}}}",
                               f"[{b},{e + 2**64}]"])
            info = RawJson(render([("dtype", info["dtype"]), ("shape", info["shape"]), ("data_offsets", RawJson(form))]))
            done.append(f"{name} offsets {form}")
        elif kind == 14:  # shape entries in odd forms
            form = rng.choice(["[1.0]", "[-1]", "[true]", "[null]", '["2"]', "[-0]", "{}", "null", "[1e400]"])
            info = RawJson(render([("dtype", info["dtype"]), ("shape", RawJson(form)),
                                   ("data_offsets", info["data_offsets"])]))
            done.append(f"{name} shape {form}")
        elif kind == 15:  # a field missing
            info.pop(rng.choice(["dtype", "shape", "data_offsets"]))
            done.append(f"{name} field removed")
        elif kind == 16:  # a tensor whose value is not a tensor
            members.append(("bogus", rng.choice([None, 1, "x", [], {}])))
            done.append("non-tensor member")
            continue
        elif kind == 17:  # data grows or shrinks at the end
            k = rng.choice([-4, -1, 1, 4])
            data = data[:k] if k < 0 else data + bytes(k)
            done.append(f"data {k:+} bytes")
            continue
        elif kind == 18:  # deep nesting in an ignored field (the reference's recursion limit is 127 levels)
            d = rng.choice([100, 124, 125, 126, 127, 200])
            info = RawJson(render(list(info.items()) + [("deep", RawJson("[" * d + "]" * d))]))
            done.append(f"{name} nested {d} deep")
        elif kind == 19:  # numbers the reference cannot represent in an ignored field
            info = RawJson(render(list(info.items()) + [("n", RawJson(rng.choice(["1e309", "-1e309", "1e308", "1e-400",
                                                                                     "123456789012345678901234567890"])))]))
            done.append(f"{name} odd number")
        elif kind == 20:  # tensor names with escapes
            new = rng.choice(["a\u0000b", "\u00e9", "\ud83d\ude00", "__metadata_", "__metadata__"])
            members[i] = (new, info)
            done.append(f"{name} renamed {new!r}")
            continue
        else:  # offsets far out
            info["data_offsets"] = rng.choice([[0, 2**64 - 1], [2**63, 2**63], [len(data), len(data) + 4]])
            done.append(f"{name} offsets {info['data_offsets']}")
        members[i] = (name, info)
    ws = rng.choice(["", "", " ", "\n", "\t", "\r\n"])
    text = render(members, ws)
    tail = rng.choice(["", "", "", " " * rng.randrange(1, 8), "\n", "\x00", "\x0c", "x", "\ufeff"])
    lead = rng.choice(["", "", "", "", " ", "\ufeff", "\n"])
    pad = rng.random() < 0.8
    return "; ".join(done) + f"; ws {ws!r} lead {lead!r} tail {tail!r}", pack(lead + text + tail, data, pad)


def reserialize(rng, blob):
    """Edits that keep the file valid: members reordered, renamed, unknown fields and metadata added, other spacing."""
    header, data = split(blob)
    members = list(header.items())
    rng.shuffle(members)
    if rng.random() < 0.5:
        members = [(k if k == "__metadata__" or rng.random() < 0.7 else k + ".renamed\u00e9", v) for k, v in members]
    if rng.random() < 0.5:
        members = [(k, dict(v, extra=rng.choice([1, None, [1, [2]], {"a": "b"}])) if k != "__metadata__" else v)
                   for k, v in members]
    if rng.random() < 0.5:
        members = [m for m in members if m[0] != "__metadata__"] + [("__metadata__", {"k": "v", "k2": ""})]
    ws = rng.choice(["", " ", "\n  ", "\t"])
    return f"reserialised (ws {ws!r})", pack(render(members, ws), data, pad=rng.random() < 0.7)


MUTATORS = [(flip_header, 5), (flip_data, 1), (cut, 1), (append, 1), (header_length, 1), (edit_header, 7),
            (reserialize, 3)]


def cases(n):
    rng = random.Random(SEED)
    bases = base_files()
    pool = [m for m, w in MUTATORS for _ in range(w)]
    out = [("unchanged", b) for b in bases]
    while len(out) < n:
        base = rng.choice(bases)
        desc, blob = rng.choice(pool)(rng, base)
        intact = len(blob) >= 8 and len(blob) >= 8 + struct.unpack("<Q", blob[:8])[0]
        if intact and rng.random() < 0.1:  # a second, byte-level mutation
            d2, blob = rng.choice([flip_header, flip_data, cut, append])(rng, blob)
            desc += " + " + d2
        out.append((desc, blob))
    return out


def reference_verdict(path):
    try:
        with safe_open(str(path), framework="numpy") as f:
            f.keys()
        return True, ""
    except Exception as e:  # noqa: BLE001 - any failure is a rejection
        return False, f"{type(e).__name__}: {e}"


def test_same_verdicts_as_the_safetensors_package(st_check, tmp_path):
    all_cases = cases(int(os.environ.get("FLASHLITE_DIFF_CASES", "1000")))
    paths = []
    for i, (_, blob) in enumerate(all_cases):
        p = tmp_path / f"case{i:04d}.safetensors"
        p.write_bytes(blob)
        paths.append(p)
    proc = subprocess.run([st_check, *map(str, paths)], capture_output=True, timeout=600)
    assert proc.returncode == 0, f"helper crashed ({proc.returncode}): {proc.stderr.decode(errors='replace')[-2000:]}"
    lines = proc.stdout.decode(errors="replace").splitlines()
    assert len(lines) == len(paths), proc.stderr.decode(errors="replace")[-2000:]
    mismatches, accepted = [], 0
    for (desc, blob), path, line in zip(all_cases, paths, lines):
        assert line.startswith(("ok", "error")), f"{desc}: {line}"
        ours = line.startswith("ok")
        ref, why = reference_verdict(path)
        accepted += ref
        if ours != ref:
            mismatches.append(f"{path.name}: {desc}\n  reference: {'accepts' if ref else 'rejects: ' + why[:200]}\n"
                              f"  flashlite: {line[:300]}")
    assert not mismatches, f"{len(mismatches)} of {len(paths)} verdicts differ (seed {SEED}):\n" + "\n".join(mismatches[:15])
    # Not a vacuous comparison: both verdicts well represented.
    assert 0.15 * len(paths) < accepted < 0.85 * len(paths), f"{accepted} of {len(paths)} accepted"
