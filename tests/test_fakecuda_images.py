"""fakecuda loads real kernel images (fakecuda/fatbin.c, cubin.c, images.c): fatbin
containers (plain, zstd, lz4), the runtime's fatbin wrapper and bare cubins; it picks the cubin
the modelled GPU (compute capability 9.0) runs, as the driver does; each kernel's parameters
come from its .nv.info; malformed images are refused with a reason, never read past (ASan).
The images are written by tests/cubin_images.py, and, where PyTorch's CUDA build is installed,
taken from its libtorch_cuda.so and checked against a second, independent reading."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import cubin_images as ci  # noqa: E402
from helpers import clean_env  # noqa: E402

SUCCESS, INVALID_VALUE, NOT_FOUND, INVALID_IMAGE, NO_BINARY_FOR_GPU = 0, 1, 500, 200, 209
JIT_COMPILER_NOT_FOUND, FILE_NOT_FOUND, NOT_SUPPORTED = 221, 301, 801

SAXPY = ("saxpy", ci.nv_info([(0, 0, 4), (1, 8, 8), (2, 16, 8)]))
BIG = ("big", ci.nv_info([(0, 0, 1024), (1, 1024, 1), (2, 1032, 24)], v2=True))
NOARGS = ("noargs", None)
KERNELS = [SAXPY, BIG, NOARGS]
EXPECTED = {"saxpy": [[0, 4], [8, 8], [16, 8]], "big": [[0, 1024], [1024, 1], [1032, 24]], "noargs": []}


def probe(c_build, tmp_path, images, *args, variant="plain", env=None):
    """Runs fakecuda_image_probe on images (bytes); returns (per-image JSON, loading mode, stderr)."""
    files = []
    for i, data in enumerate(images):
        f = tmp_path / f"image{i}.bin"
        f.write_bytes(data)
        files.append(str(f))
    run = subprocess.run([str(c_build / variant / "fakecuda_image_probe"), *args, *files], cwd=tmp_path,
                         env=dict(clean_env(), **(env or {})), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "ERROR: AddressSanitizer" not in run.stderr and "runtime error" not in run.stderr, run.stderr
    lines = [json.loads(line) for line in run.stdout.splitlines()]
    return lines[:-1], lines[-1]["loading_mode"], run.stderr


def layouts(result):
    assert result["result"] == SUCCESS and result["enumerate"] == SUCCESS, result
    return {k["name"]: k["params"] for k in result["kernels"]}


def sm90_fatbin(how=None):
    """sm_80 and sm_90 cubins and sm_90 PTX: the sm_90 cubin is the one a 9.0 device runs."""
    e = ci.entry(ci.KIND_CUBIN, 90, ci.cubin(KERNELS, [("counter", 12)]), how)
    if e is None:
        pytest.skip(f"the system's {'libzstd.so.1' if how == 'zstd' else 'liblz4.so.1'} is missing: nothing "
                    f"to compress the fixture with")
    old = ci.cubin([("old_kernel", ci.nv_info([(0, 0, 8)]))], sm=80)
    ptx = ci.entry(ci.KIND_PTX, 90, b".version 9.0\n.target sm_90\n.address_size 64\n\0")
    return ci.fatbin([ci.entry(ci.KIND_CUBIN, 80, old), e, ptx])


@pytest.mark.parametrize("how", [None, "zstd", "lz4"])
@pytest.mark.parametrize("mode", [[], ["--library"], ["--fatbinary"], ["--wrapper"]])
def test_layouts_from_a_fatbin(c_build, tmp_path, how, mode):
    results, _, _ = probe(c_build, tmp_path, [sm90_fatbin(how)], "--global", "counter", *mode)
    (r,) = results
    assert layouts(r) == EXPECTED  # the sm_90 cubin's kernels, not the sm_80 one's
    for k in r["kernels"]:
        assert k["same"] == 1  # asked again by name: the same handle
        assert k["other_kind"] == INVALID_VALUE  # cuFuncGetParamInfo on a CUkernel, and the reverse
    assert r["global"] == [SUCCESS, 12, 1, 12]  # a device allocation of the symbol's size
    assert r["not_found"] == (SUCCESS if mode == ["--library"] else NOT_FOUND)


@pytest.mark.parametrize("variant", ["asan", "tsan"])
def test_images_under_sanitizers(c_build, tmp_path, variant):
    images = [sm90_fatbin(), ci.cubin(KERNELS, [("counter", 12)])] + [sm90_fatbin(how) for how in ("zstd", "lz4")
                                                    if ci.compress(b"x", how) is not None]
    results, _, err = probe(c_build, tmp_path, images, "--launch", "big", "--global", "counter", "--capture",
                            variant=variant)
    assert all(layouts(r) == EXPECTED and r["global"][0] == SUCCESS for r in results)
    assert "WARNING: ThreadSanitizer" not in err, err


def test_bare_cubin_and_its_sm(c_build, tmp_path):
    results, _, err = probe(c_build, tmp_path, [ci.cubin(KERNELS), ci.cubin(KERNELS, sm=80),
                                                ci.cubin(KERNELS, accel=True), ci.cubin(KERNELS, abi=7),
                                                ci.cubin(KERNELS, sm=90, abi=7, accel=True)])
    assert layouts(results[0]) == EXPECTED
    assert results[1]["result"] == NO_BINARY_FOR_GPU and "sm_80 does not run on compute capability 9.0" in err
    assert layouts(results[2]) == EXPECTED  # sm_90a on 9.0 itself
    assert layouts(results[3]) == EXPECTED and layouts(results[4]) == EXPECTED  # the pre-CUDA-13 e_flags


def test_module_load_reads_the_file(c_build, tmp_path):
    files, _, _ = probe(c_build, tmp_path, [sm90_fatbin(), ci.cubin(KERNELS)], "--path")
    assert [layouts(r) for r in files] == [EXPECTED, EXPECTED]
    run = subprocess.run([str(c_build / "plain" / "fakecuda_image_probe"), "--path", str(tmp_path / "absent")],
                         env=clean_env(), capture_output=True, text=True, timeout=60)
    assert json.loads(run.stdout.splitlines()[0])["result"] == FILE_NOT_FOUND


def test_entry_choice_as_the_driver(c_build, tmp_path):
    ptx80 = ci.entry(ci.KIND_PTX, 80, b".version 8.0\n.target sm_80\n\0")
    ptx100 = ci.entry(ci.KIND_PTX, 100, b".version 9.0\n.target sm_100\n\0")
    cub = {sm: ci.entry(ci.KIND_CUBIN, sm, ci.cubin(KERNELS, sm=sm)) for sm in (80, 86, 100)}
    results, _, err = probe(c_build, tmp_path, [
        ci.fatbin([cub[80], cub[86], cub[100]]),  # no 9.x cubin, no PTX
        ci.fatbin([cub[80], ptx80]),              # PTX the driver would JIT
        ci.fatbin([cub[100], ptx100]),            # PTX only for a newer architecture
        ci.fatbin([ci.entry(ci.KIND_CUBIN, 90, ci.cubin(KERNELS, sm=90, accel=True))]),
    ])
    assert [r["result"] for r in results] == [NO_BINARY_FOR_GPU, JIT_COMPILER_NOT_FOUND, NO_BINARY_FOR_GPU, SUCCESS]
    assert "would JIT-compile the compute_80 PTX, which fakecuda does not model" in err


def test_compressed_images_without_the_libraries(c_build, tmp_path):
    images = [sm90_fatbin("zstd"), sm90_fatbin("lz4"), sm90_fatbin()]
    results, _, err = probe(c_build, tmp_path, images, env={"FAKECUDA_DECOMPRESS": "none"})
    assert [r["result"] for r in results] == [NOT_SUPPORTED, NOT_SUPPORTED, SUCCESS]
    assert "a zstd-compressed image needs libzstd.so.1" in err and "an lz4-compressed image needs liblz4.so.1" in err


def bad_images():
    """(name, image, what stderr must say) of images fakecuda must refuse as invalid."""
    good = ci.cubin(KERNELS)
    e = ci.entry(ci.KIND_CUBIN, 90, good)
    overlap = ci.cubin([("k", ci.nv_info([(0, 0, 8), (1, 4, 8)]))])
    repeated = ci.cubin([("k", ci.nv_info([(0, 0, 8), (0, 8, 8)]))])
    past = ci.cubin([("k", ci.nv_info([(0, 0, 8), (1, 8, 8)], space=12))])
    bad_format = ci.cubin([("k", ci.nv_info([(0, 0, 8)]) + bytes([9, 0x17, 0, 0]))])
    sval_past = ci.cubin([("k", ci.nv_info([(0, 0, 8)]) + bytes([4, 0x1C, 0xFF, 0x00]))])
    no_space = ci.cubin([("k", ci.kparam_v1(0, 0, 8))])
    zstd = ci.entry(ci.KIND_CUBIN, 90, good, "zstd")
    images = [
        ("container claims more than its entry", ci.fatbin([e], claim=len(e) + 32), "cut short"),
        ("entry payload past its container", ci.fatbin([e[:200]]), "runs past its container"),
        ("section table past the cubin", ci.fatbin([ci.entry(ci.KIND_CUBIN, 90, good[:len(good) - 100])]),
         "outside the"),
        ("host ELF", ci.cubin(KERNELS, machine=62), "is not EM_CUDA"),
        ("overlapping parameters", overlap, "overlap"),
        ("repeated ordinal", repeated, "repeated or outside"),
        ("parameter past the parameter space", past, "ends past the 12-byte parameter space"),
        ("unknown .nv.info format", bad_format, "format 0x9"),
        ("attribute past its section", sval_past, "runs past its section"),
        ("parameters without a parameter space", no_space, "without EIATTR_CBANK_PARAM_SIZE"),
        ("entry names another SM", ci.fatbin([ci.entry(ci.KIND_CUBIN, 90, ci.cubin(KERNELS, sm=89))]),
         "names another SM"),
    ]
    if zstd is not None:
        corrupt = bytearray(zstd)
        corrupt[64 + 10:64 + 40] = bytes(30)
        images.append(("corrupt zstd", ci.fatbin([bytes(corrupt)]), "does not decompress"))
    return images


@pytest.mark.parametrize("variant", ["plain", "asan"])
def test_malformed_images_are_refused(c_build, tmp_path, variant):
    bad = bad_images()
    results, _, err = probe(c_build, tmp_path, [img for _, img, _ in bad], variant=variant,
                            env={"CUDA_MODULE_LOADING": "EAGER"})
    for (name, _, said), r in zip(bad, results):
        assert r["result"] in (INVALID_IMAGE, NO_BINARY_FOR_GPU) and r["kernels"] == [], (name, r)
        assert said in err, (name, err)


def test_lazy_loading_refuses_a_malformed_kernel_at_first_use(c_build, tmp_path):
    image = ci.cubin([SAXPY, ("k", ci.nv_info([(0, 0, 8), (1, 4, 8)]))])
    eager, mode_e, _ = probe(c_build, tmp_path, [image], env={"CUDA_MODULE_LOADING": "EAGER"})
    lazy, mode_l, err = probe(c_build, tmp_path, [image], env={"CUDA_MODULE_LOADING": "LAZY"})
    default, mode_d, _ = probe(c_build, tmp_path, [image])
    old, mode_o, _ = probe(c_build, tmp_path, [image], env={"FAKECUDA_DRIVER_VERSION": "12010"})
    assert (mode_e, mode_l, mode_d, mode_o) == (1, 2, 2, 1)  # CU_MODULE_EAGER_LOADING 1, LAZY 2
    assert eager[0]["result"] == INVALID_IMAGE and old[0]["result"] == INVALID_IMAGE
    assert lazy[0]["result"] == SUCCESS and lazy[0]["enumerate"] == INVALID_IMAGE and "overlap" in err
    assert default[0]["result"] == SUCCESS


@pytest.mark.parametrize("library", [False, True])
def test_launch_log_names_every_pointer_word(c_build, tmp_path, library):
    log = tmp_path / "launches.jsonl"
    results, _, _ = probe(c_build, tmp_path, [sm90_fatbin()], "--launch", "big", *(["--library"] if library else []),
                          env={"FAKECUDA_LAUNCH_LOG": str(log)})
    big = next(k for k in results[0]["kernels"] if k["name"] == "big")
    rc, sync, kernels_run, by_function, by_kernel = big["launch"]
    assert (rc, sync, kernels_run) == (SUCCESS, SUCCESS, 1)  # ran, as a no-op, on its stream
    assert (by_function, by_kernel) == ((0, 1) if library else (1, 0))
    (rec,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert rec["kernel"] == "big" and rec["handle"] == ("CUkernel" if library else "CUfunction")
    assert rec["captured"] is False and rec["stream"] > 0  # the legacy stream's id
    # every 8-aligned word of the 1,024-byte by-value struct and of the 24-byte one (the 1-byte
    # parameter holds none): 128 + 3, each inside the managed allocation
    words = [(p[0], p[1]) for p in rec["pointers"]]
    assert words == [(0, w) for w in range(0, 1024, 8)] + [(2, w) for w in (1032, 1040, 1048)]
    assert all(p[3] == big["managed"] and p[5] is True for p in rec["pointers"])
    assert rec["params"] == [[0, 1024], [1024, 1], [1032, 24]]  # the layout: none a pointer of its own


def test_captured_image_kernel_replays(c_build, tmp_path):
    log = tmp_path / "launches.jsonl"
    results, _, _ = probe(c_build, tmp_path, [sm90_fatbin()], "--launch", "saxpy", "--capture",
                          env={"FAKECUDA_LAUNCH_LOG": str(log)})
    saxpy = next(k for k in results[0]["kernels"] if k["name"] == "saxpy")
    assert saxpy["launch"][:3] == [SUCCESS, SUCCESS, 2]  # the graph's node ran at each of 2 replays
    (rec,) = [json.loads(line) for line in log.read_text().splitlines()]  # recorded once, at capture
    assert rec["captured"] is True and [(p[0], p[1]) for p in rec["pointers"]] == [(1, 8), (2, 16)]


def torch_cuda_library():
    """libtorch_cuda.so of PyTorch's CUDA build: $PUMP_TORCH_CUDA_LIB, or this Python's torch."""
    path = os.environ.get("PUMP_TORCH_CUDA_LIB")
    if not path:
        spec = importlib.util.find_spec("torch")
        path = spec and spec.origin and str(pathlib.Path(spec.origin).parent / "lib" / "libtorch_cuda.so")
    return path if path and os.path.exists(path) else None


def test_pytorch_images_layouts(c_build, tmp_path):
    """A sample of PyTorch's sm_90 images, every 40th container and the first that has
    KPARAM_INFO_V2 kernels: fakecuda's layouts are an independent reading's, and every one keeps
    the rules (ordinals 0..n-1, no overlap, the last parameter ends at CBANK_PARAM_SIZE)."""
    lib = torch_cuda_library()
    if lib is None:
        pytest.skip("PyTorch's CUDA build is not here (no libtorch_cuda.so; set PUMP_TORCH_CUDA_LIB)")
    if ci.compress(b"x", "zstd") is None:
        pytest.skip("the system's libzstd.so.1 is missing: PyTorch's entries are zstd-compressed")
    section = ci.elf_section(lib, ".nv_fatbin")
    sample, expected, v2_seen = [], [], False
    for i, (_, container) in enumerate(ci.containers(section)):
        elf = ci.cubin_entry(container, 90)
        if elf is None:
            continue
        found = ci.kernel_layouts(elf)
        has_v2 = any(kind == "V2" for _, _, kind, _ in found.values())
        if i % 40 == 0 or (has_v2 and not v2_seen):
            v2_seen |= has_v2
            sample.append(container)
            expected.append(found)
    assert v2_seen and len(sample) >= 10, (v2_seen, len(sample))
    results, _, _ = probe(c_build, tmp_path, sample)
    kernels = 0
    for found, r in zip(expected, results):
        got = layouts(r)
        assert got.keys() == found.keys()
        for name, (params, space, kind, ordinals) in found.items():
            assert got[name] == [list(p) for p in params], name
            assert ordinals == list(range(len(params))), name
            ends = sorted(params)
            assert all(a[0] + a[1] <= b[0] for a, b in zip(ends, ends[1:])), name
            assert not params or ends[-1][0] + ends[-1][1] == space, (name, space)
            kernels += 1
    assert kernels > 300, kernels
