"""fakecuda's cuGetExportTable (fakecuda/export_tables.c) against NVIDIA's real 535 and 550
libcuda.so.1 (scripts/fetch-libcuda; both answer cuGetExportTable without a GPU, before cuInit):
the same ids refused (CUDA_ERROR_INVALID_VALUE, table NULL), the same size word in slot 0 and
the same slots holding a function, with FAKECUDA_DRIVER_VERSION set to the driver's CUDA
version. And the integrity check (d4082055 slot 1) recomputed here, independently, as HMAC-MD2
(RFC 2104 over RFC 1319) over the inputs ZLUDA's reading names, from fakecuda's own ids."""

import ctypes
import os
import pathlib
import struct
import subprocess
import sys
import textwrap

import pytest

from helpers import clean_env

ROOT = pathlib.Path(__file__).resolve().parent.parent
LIBCUDA = ROOT / "build" / "libcuda"
# (suite, the driver's CUDA version): Debian's libcuda1 in bookworm (535, 12.2) and trixie (550, 12.4)
DRIVERS = [("bookworm", 12020), ("trixie", 12040)]
IDS = [
    "6bd5fb6c-5bf4-e74a-8987-d93912fd9df9", "a094798c-2e74-2e74-93f2-0800200c0a66",
    "42d85a81-23f6-cb47-8298-f6e78a3aecdc", "c693336e-1121-df11-a8c3-68f355d89593",
    "263e8860-7cd2-6143-92f6-bbd5006dfa7e", "d4082055-bde6-704b-8d34-ba123c66e1f2",
    "21318c60-9714-3248-8ca6-41ff7324c8f2", "f8cff951-2146-8b4e-b9e2-fb469e7c0dd9",
    "00000000-0000-0000-0000-000000000000",
]
# The tables whose slots after slot 0 are all known (a longer table's slots past its end are
# whatever memory follows, so only these are compared slot by slot).
SIZED = {"6bd5fb6c", "a094798c", "42d85a81", "263e8860", "d4082055", "21318c60"}

PROBE = textwrap.dedent(r"""
    import ctypes, json, sys
    lib = ctypes.CDLL(sys.argv[1])
    get = lib.cuGetExportTable
    get.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
    out = {}
    for text in sys.argv[2:]:
        table = ctypes.c_void_p(1)
        rc = get(ctypes.byref(table), bytes.fromhex(text.replace("-", "")))
        entry = {"rc": rc, "null": not table.value}
        if rc == 0 and table.value:
            words = (ctypes.c_uint64 * 96).from_address(table.value)
            size = words[0] // 8 if text[:8] != "c693336e" else 4
            entry["size"] = words[0] if text[:8] != "c693336e" else None
            entry["slots"] = [bool(words[i]) for i in range(1, min(size, 96))]
        out[text] = entry
    null_out = get(None, bytes(16))
    print(json.dumps({"tables": out, "null_out": null_out}))
""")


def probe(lib, env):
    proc = subprocess.run([sys.executable, "-c", PROBE, str(lib), *IDS], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    import json
    return json.loads(proc.stdout)


@pytest.mark.parametrize("suite,version", DRIVERS)
def test_tables_match_the_real_driver(c_build, suite, version):
    real = LIBCUDA / suite / "libcuda.so.1"
    if not real.exists():
        pytest.skip(f"{real} missing: run scripts/fetch-libcuda")
    want = probe(real, clean_env())
    env = clean_env()
    env["FAKECUDA_DRIVER_VERSION"] = str(version)
    got = probe(c_build / "plain" / "libcuda.so.1", env)
    assert got["null_out"] == want["null_out"] == 1
    for text in IDS:
        w, g = want["tables"][text], got["tables"][text]
        assert (g["rc"], g["null"]) == (w["rc"], w["null"]), (suite, text, g, w)
        if w["rc"] == 0 and text[:8] in SIZED:
            assert g["size"] == w["size"], (suite, text, g["size"], w["size"])
            assert g["slots"] == w["slots"], (suite, text)


# ---- the integrity check, recomputed ----


def _md2_table():
    """RFC 1319's S table, checked against the RFC's test vectors below before it is used."""
    # Build it from the RFC's decimal listing (as fakecuda's integrity.c holds it) to stay
    # independent of that file: pi digits are not recomputed here.
    text = (ROOT / "fakecuda" / "integrity.c").read_text()
    body = text[text.index("md2_s[256] = {") + 14:text.index("};", text.index("md2_s[256] = {"))]
    table = bytes(int(x) for x in body.replace("\n", " ").split(",") if x.strip())
    assert sorted(table) == list(range(256)), "S is a permutation"
    return table


def md2(data, s_table):
    data = bytes(data)
    pad = 16 - len(data) % 16
    data += bytes([pad]) * pad
    c, last = bytearray(16), 0
    for i in range(0, len(data), 16):
        for j in range(16):
            c[j] ^= s_table[data[i + j] ^ last]
            last = c[j]
    data += bytes(c)
    x = bytearray(48)
    for i in range(0, len(data), 16):
        block = data[i:i + 16]
        for j in range(16):
            x[16 + j] = block[j]
            x[32 + j] = x[j] ^ block[j]
        t = 0
        for j in range(18):
            for k in range(48):
                x[k] ^= s_table[t]
                t = x[k]
            t = (t + j) % 256
    return bytes(x[:16])


def test_md2_is_rfc_1319():
    s = _md2_table()
    assert md2(b"", s).hex() == "8350e5a3e24c153df2275c9f80692773"
    assert md2(b"abc", s).hex() == "da853b0d3f88d99b30283a69e6ded6bb"
    assert md2(b"message digest", s).hex() == "ab4f496bfb2a530b219ff33031fe06b0"


KEY = bytes.fromhex("146addae53a9a752aa0841360bf55a9f")

CHECK = textwrap.dedent(r"""
    import ctypes, json, os, sys
    lib = ctypes.CDLL(sys.argv[1])
    assert lib.cuInit(0) == 0
    get = lib.cuGetExportTable
    get.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
    tables = {}
    for name, text in (("integrity", "d4082055bde6704b8d34ba123c66e1f2"), ("cudart", "6bd5fb6c5bf4e74a8987d93912fd9df9")):
        t = ctypes.c_void_p()
        assert get(ctypes.byref(t), bytes.fromhex(text)) == 0
        tables[name] = t.value
    fn_addr = ctypes.c_void_p.from_address(tables["integrity"] + 8).value
    check = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint64 * 2))(fn_addr)
    libc = ctypes.CDLL(None)
    libc.pthread_self.restype = ctypes.c_ulong
    devices = []
    n = ctypes.c_int()
    lib.cuDeviceGetCount(ctypes.byref(n))
    for d in range(n.value):
        uuid = (ctypes.c_ubyte * 16)()
        lib.cuDeviceGetUuid_v2(uuid, d)
        ids = []
        for attr in (50, 33, 34):  # PCI_DOMAIN_ID, PCI_BUS_ID, PCI_DEVICE_ID
            v = ctypes.c_int()
            lib.cuDeviceGetAttribute(ctypes.byref(v), attr, d)
            ids.append(v.value)
        devices.append([bytes(uuid).hex(), ids])
    out = {}
    for version in (13000, 13001, 13002, 12345):
        result = (ctypes.c_uint64 * 2)()
        rc = check(version, 1700000000, ctypes.byref(result))
        out[version] = [rc, list(result)]
    ver = ctypes.c_int()
    lib.cuDriverGetVersion(ctypes.byref(ver))
    print(json.dumps({"pid": os.getpid(), "thread": libc.pthread_self() & 0xffffffff, "tables": tables,
                      "fn": fn_addr, "devices": devices, "driver": ver.value, "out": out}))
""")


@pytest.mark.parametrize("persona,devices", [("h100-sxm-80gb", 1), ("a100-pcie-40gb", 2), ("", 1)])
def test_integrity_check_is_computed_from_the_personas_ids(c_build, persona, devices):
    import json
    s = _md2_table()
    env = clean_env()
    env.update(FAKECUDA_PERSONA=persona, FAKECUDA_DEVICES=str(devices))
    proc = subprocess.run([sys.executable, "-c", CHECK, str(c_build / "plain" / "libcuda.so.1")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert len(r["devices"]) == devices
    # version % 10 of 0 or 1: ZLUDA's fixed pairs
    assert r["out"]["13000"] == [0, [0x3341181C03CB675C, 0x8ED383AA1F4CD1E8]]
    assert r["out"]["13001"] == [0, [0x1841181C03CB675C, 0x8ED383AA1F4CD1E8]]
    for version in ("13002", "12345"):
        record = struct.pack("<IIIIQQQQ", r["driver"], int(version), r["pid"], r["thread"], r["tables"]["cudart"],
                             r["tables"]["integrity"], r["fn"], 1700000000)
        for uuid, (domain, bus, device) in r["devices"]:
            record += bytes.fromhex(uuid) + struct.pack("<iii", domain, bus, device)
        inner = md2(bytes(k ^ 0x36 for k in KEY) + record, s)
        outer = md2(bytes(k ^ 0x5C for k in KEY) + inner, s)
        assert r["out"][version] == [0, list(struct.unpack("<QQ", outer))], version
