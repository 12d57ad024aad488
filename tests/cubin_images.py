"""Kernel images for fakecuda's tests (tests/test_fakecuda_images.py): small cubins and fatbin
containers written here in the layouts fakecuda reads (fakecuda/fatbin.c, cubin.c), and
an independent reader of real ones (PyTorch's), so that what fakecuda answers can be checked
against a second reading of the same bytes. Compression uses the system's libzstd.so.1 and
liblz4.so.1 through ctypes (None where they are missing)."""

import ctypes
import struct

EM_CUDA = 190
FATBIN_MAGIC = 0xBA55ED50
WRAPPER_MAGIC = 0x466243B1
KIND_PTX, KIND_CUBIN = 1, 2
FLAG_LZ4, FLAG_ZSTD = 0x2000, 0x8000
EIATTR_KPARAM_INFO, EIATTR_CBANK_PARAM_SIZE, EIATTR_KPARAM_INFO_V2 = 0x17, 0x19, 0x45


def kparam_v1(ordinal, offset, size):
    return struct.pack("<BBHIHHI", 4, EIATTR_KPARAM_INFO, 12, 0, ordinal, offset, (size << 18) | 0x1F000)


def kparam_v2(ordinal, offset, size):
    return struct.pack("<BBHIHHHH", 4, EIATTR_KPARAM_INFO_V2, 12, 0, ordinal, offset, size, 0)


def cbank(size):
    return struct.pack("<BBH", 3, EIATTR_CBANK_PARAM_SIZE, size)


def nv_info(params, v2=False, space=None):
    """A kernel's .nv.info records: params as (ordinal, offset, size), the parameter space
    (default: the last parameter's end), and two records fakecuda must walk past."""
    rec = kparam_v2 if v2 else kparam_v1
    end = max((o + s for _, o, s in params), default=0)
    body = struct.pack("<BBH", 1, 0x50, 0) + struct.pack("<BBHI", 4, 0x1C, 4, 0x160)
    body += b"".join(rec(*p) for p in reversed(params))  # nvcc writes the last ordinal first
    return body + cbank(end if space is None else space)


def cubin(kernels, globals_=(), sm=90, abi=8, accel=False, machine=EM_CUDA):
    """An ELF cubin. kernels: (name, .nv.info bytes or None); globals_: (name, size)."""
    names = [b""]

    def shname(s):
        names.append(s.encode())
        return sum(len(n) + 1 for n in names[:-1])

    strtab = bytearray(b"\0")

    def sym_name(s):
        off = len(strtab)
        strtab.extend(s.encode() + b"\0")
        return off

    # sections: (name, type, data, link, info, entsize); index 0 is the null section
    sections = [None, (".shstrtab", 3, None, 0, 0, 0), (".strtab", 3, None, 0, 0, 0),
                (".symtab", 2, None, 2, 1, 24), (".nv.global", 8, b"", 0, 0, 0)]
    syms = [bytes(24)]
    gsize = 0
    for name, size in globals_:
        syms.append(struct.pack("<IBBHQQ", sym_name(name), 0x11, 0, 4, gsize, size))
        gsize += (size + 7) & ~7
    for name, info in kernels:
        text = len(sections)
        sections.append((".text." + name, 1, bytes(16), 3, 0, 0))
        syms.append(struct.pack("<IBBHQQ", sym_name(name), 0x12, 0x10, text, 0, 16))
        if info is not None:
            sections.append((".nv.info." + name, 0x70000000, info, 3, text, 0))
    out = bytearray(64)
    headers = [bytes(64)]
    shn = [shname(s[0]) if s else 0 for s in sections]
    shstr = b"\0".join(names) + b"\0"
    for i, s in enumerate(sections[1:], 1):
        name, typ, data, link, info, entsize = s
        data = {1: shstr, 2: bytes(strtab), 3: b"".join(syms)}.get(i, data)
        while len(out) % 8:
            out.append(0)
        size = gsize if typ == 8 else len(data)
        headers.append(struct.pack("<IIQQQQIIQQ", shn[i], typ, 0, 0, len(out), size, link, info, 8, entsize))
        if typ != 8:
            out.extend(data)
    while len(out) % 8:
        out.append(0)
    shoff = len(out)
    out.extend(b"".join(headers))
    flags = (0x6000000 | sm << 8 | 2 | (0x8 if accel else 0)) if abi >= 8 else (0x500 | sm | (0x800 if accel else 0))
    ident = b"\x7fELF" + bytes([2, 1, 1, 0x41, abi]) + bytes(7)
    out[0:64] = ident + struct.pack("<HHIQQQIHHHHHH", 2, machine, 1, 0, 0, shoff, flags, 64, 0, 0, 64,
                                    len(headers), 1)
    return bytes(out)


def _lib(name):
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def compress(data, how):
    """zstd or lz4 (a raw LZ4 block) of data, or None where the system library is missing."""
    if how == "zstd":
        z = _lib("libzstd.so.1")
        if z is None:
            return None
        z.ZSTD_compressBound.restype = ctypes.c_size_t
        z.ZSTD_compress.restype = ctypes.c_size_t
        cap = z.ZSTD_compressBound(ctypes.c_size_t(len(data)))
        buf = ctypes.create_string_buffer(cap)
        n = z.ZSTD_compress(buf, ctypes.c_size_t(cap), data, ctypes.c_size_t(len(data)), 3)
        return buf.raw[:n]
    lz = _lib("liblz4.so.1")
    if lz is None:
        return None
    cap = lz.LZ4_compressBound(len(data))
    buf = ctypes.create_string_buffer(cap)
    n = lz.LZ4_compress_default(data, buf, len(data), cap)
    return buf.raw[:n]


def entry(kind, arch, payload, how=None):
    """One fatbin entry: a 64-byte header, then the payload (compressed with how), 8-aligned."""
    flags, csize, dsize = 0x11, 0, 0
    if how:
        data = compress(payload, how)
        if data is None:
            return None
        flags |= FLAG_ZSTD if how == "zstd" else FLAG_LZ4
        csize, dsize = len(data), len(payload)
        payload = data
    padded = payload + bytes(-len(payload) % 8)
    header = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x101, 64, len(padded), csize, 0, 8 if kind == KIND_CUBIN else 3,
                         1 if kind == KIND_CUBIN else 9, arch, 0, 0, flags, 0, dsize)
    return header + padded


def fatbin(entries, claim=None):
    """A container of entries (claim: the byte count its header states, default the truth)."""
    body = b"".join(entries)
    return struct.pack("<IHHQ", FATBIN_MAGIC, 1, 16, len(body) if claim is None else claim) + body


# ---- reading real images (an implementation independent of fakecuda's) ----

def elf_section(path, name):
    """The bytes of section name of the ELF file at path, or None."""
    with open(path, "rb") as f:
        head = f.read(64)
        shoff, = struct.unpack_from("<Q", head, 0x28)
        _, shnum, shstrndx = struct.unpack_from("<HHH", head, 0x3A)
        f.seek(shoff)
        table = f.read(64 * shnum)
        secs = [struct.unpack_from("<IIQQQQIIQQ", table, 64 * i) for i in range(shnum)]
        f.seek(secs[shstrndx][4])
        names = f.read(secs[shstrndx][5])
        for s in secs:
            if names[s[0]:names.index(b"\0", s[0])].decode() == name:
                f.seek(s[4])
                return f.read(s[5])
    return None


def containers(section):
    """(offset, bytes) of each fatbin container in a .nv_fatbin section."""
    off = 0
    while off + 16 <= len(section):
        magic, _, hs, size = struct.unpack_from("<IHHQ", section, off)
        if magic != FATBIN_MAGIC:
            break
        yield off, section[off:off + hs + size]
        off += hs + size


def cubin_entry(container, arch):
    """The decompressed cubin for arch in a container, or None."""
    hs, = struct.unpack_from("<H", container, 6)
    p = hs
    while p + 64 <= len(container):
        kind, _, ehs, size, csize = struct.unpack_from("<HHIQI", container, p)
        earch, = struct.unpack_from("<I", container, p + 28)
        flags, _, dsize = struct.unpack_from("<QQQ", container, p + 40)
        if kind == KIND_CUBIN and earch == arch:
            data = container[p + ehs:p + ehs + size]
            if flags & FLAG_ZSTD:
                z = ctypes.CDLL("libzstd.so.1")
                z.ZSTD_decompress.restype = ctypes.c_size_t
                out = ctypes.create_string_buffer(dsize)
                n = z.ZSTD_decompress(out, ctypes.c_size_t(dsize), data[:csize], ctypes.c_size_t(csize))
                assert n == dsize, (n, dsize)
                return out.raw
            return data
        p += ehs + size
    return None


def kernel_layouts(elf):
    """{kernel: (params as [(offset, size)] by ordinal, CBANK_PARAM_SIZE or None, "V1"/"V2"/"")}."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    _, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    secs = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + 64 * i) for i in range(shnum)]
    names_at = secs[shstrndx][4]

    def name(o):
        return elf[o:elf.index(b"\0", o)].decode()

    secnames = [name(names_at + s[0]) for s in secs]
    symtab = next(s for s in secs if s[1] == 2)
    strs = secs[symtab[6]][4]
    out = {}
    for i in range(1, symtab[5] // 24):
        st_name, st_info, st_other, shndx, _, _ = struct.unpack_from("<IBBHQQ", elf, symtab[4] + 24 * i)
        kname = name(strs + st_name)
        if st_info & 0xF != 2 or not st_other & 0x10 or secnames[shndx] != ".text." + kname:
            continue
        params, space, kind = {}, None, ""
        if ".nv.info." + kname in secnames:
            s = secs[secnames.index(".nv.info." + kname)]
            data, at = elf[s[4]:s[4] + s[5]], 0
            while at < len(data):
                fmt, attr = data[at], data[at + 1]
                n = struct.unpack_from("<H", data, at + 2)[0] if fmt == 4 else 0
                v = data[at + 4:at + 4 + n] if fmt == 4 else data[at + 2:at + 4]
                if attr == EIATTR_KPARAM_INFO:
                    _, ordinal, offset, flags = struct.unpack("<IHHI", v)
                    params[ordinal], kind = (offset, (flags >> 18) & 0x3FFF), "V1"
                elif attr == EIATTR_KPARAM_INFO_V2:
                    _, ordinal, offset, size, _ = struct.unpack("<IHHHH", v)
                    params[ordinal], kind = (offset, size), "V2"
                elif attr == EIATTR_CBANK_PARAM_SIZE:
                    space, = struct.unpack("<H", v)
                at += 4 + n
        out[kname] = ([params[i] for i in sorted(params)], space, kind, sorted(params))
    return out


def main(argv):
    """python3 tests/cubin_images.py PROBE LIBRARY...: each library's fatbin containers loaded
    through fakecuda (PROBE: build/tests/plain/fakecuda_image_probe), eagerly; prints how many
    load, how many are refused and why, their kernels, and the probe's time."""
    import collections
    import json
    import os
    import subprocess
    import tempfile
    import time
    probe, libs = argv[0], argv[1:]
    for lib in libs:
        with tempfile.TemporaryDirectory() as d:
            files = []
            for i, (_, c) in enumerate(containers(elf_section(lib, ".nv_fatbin") or b"")):
                files.append(os.path.join(d, f"c{i:05d}.fatbin"))
                with open(files[-1], "wb") as f:
                    f.write(c)
            t = time.monotonic()
            run = subprocess.run([probe, *files], capture_output=True, text=True,
                                 env=dict(os.environ, CUDA_MODULE_LOADING="EAGER"), check=True)
            took = time.monotonic() - t
        results = [json.loads(line) for line in run.stdout.splitlines()][:-1]
        codes = collections.Counter(r["result"] for r in results)
        kernels = sum(len(r["kernels"]) for r in results)
        print(f"{os.path.basename(lib)}: {len(results)} containers, {codes[0]} loaded ({kernels} kernels), refused "
              f"{dict((c, n) for c, n in codes.items() if c)} (CUresult: count), {took:.1f} s")


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
