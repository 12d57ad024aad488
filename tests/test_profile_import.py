"""pump simulate --profile: reading PyTorch profiler traces (the real A100 ones in
../shared/data/kineto, gzipped and plain) and Nsight Systems SQLite exports, matching their
operators to a generated trace's launches, the scaling rule and its band, and refusing a profile
of another model."""

import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from pump import cli  # noqa: E402
from pump.simulate import constants as K, profile, profile_read, workload  # noqa: E402
from pump.tracegen import generate, user  # noqa: E402

KINETO = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "kineto"
KINETO = KINETO if KINETO.is_dir() else Path("/work/shared/data/kineto")
ALEXNET = KINETO / "critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"
CONTROL = KINETO / "trace_diff__control__control.json.gz"
RANK0 = KINETO / "negative_queue_length_values_check__rank0.json.gz"
needs_kineto = pytest.mark.skipif(not ALEXNET.exists(), reason="../shared/data/kineto is not here")

MLP = '''
import torch
from torch import nn

def mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), torch.empty(8, 16)
'''
# Operators that launch no kernel on CUDA (views, metadata, host-side reads).
NO_KERNEL = {"view", "t", "transpose", "as_strided", "expand", "detach", "detach_", "empty", "empty_like",
             "empty_strided", "item", "_local_scalar_dense", "lift_fresh", "resolve_conj", "to", "_to_copy"}


# --- reading ---------------------------------------------------------------------------------

@needs_kineto
@pytest.mark.parametrize("path,device,kernels,linked", [
    (ALEXNET, "NVIDIA A100-PG509-200", 79, 79),
    (CONTROL, "NVIDIA A100-PG509-200", 8568, 8520),
    (RANK0, "NVIDIA A100-SXM4-80GB", 6080, 5285),   # 795 kernels' launches fall before the trace's window
])
def test_real_a100_traces_link_kernels_to_operators(path, device, kernels, linked):
    p = profile_read.read(str(path))
    assert (p.device, p.kernels, p.linked) == (device, kernels, linked)
    assert profile.source_preset(p.device) == ("a100-80gb" if "80GB" in device else "a100-40gb")
    names = {i.name for i in p.invocations}
    assert {"mm", "add_", "fill_"} & names or {"cudnn_convolution", "relu_"} <= names
    # An operator holds the kernels of the operators inside it: convolution's hold cudnn_convolution's.
    if path == ALEXNET:
        total = {n: sum(i.kernel_ns for i in p.invocations if i.name == n) for n in names}
        assert total["convolution"] >= total["cudnn_convolution"] > 0   # and its bias's add_
        assert all(i.input_bytes is None for i in p.invocations)      # recorded without shapes


@needs_kineto
def test_gzipped_and_plain_read_alike(tmp_path):
    plain = tmp_path / "alexnet.json"
    plain.write_bytes(gzip.decompress(ALEXNET.read_bytes()))
    assert profile_read.read(str(plain)) .invocations == profile_read.read(str(ALEXNET)).invocations


def test_not_a_profile_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(profile_read.ProfileError, match="not a PyTorch profiler trace"):
        profile_read.read(str(bad))


def _nsys(path, ranges, launches, kernels):
    """An Nsight Systems SQLite export with the real schema's tables and columns (the ones read)."""
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL,
            rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER,
            endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, uint64Value INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL,
            eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL,
            returnValue INTEGER NOT NULL, callchainId INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL,
            correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL,
            shortName INTEGER NOT NULL, gridX INTEGER, blockX INTEGER);
        CREATE TABLE TARGET_INFO_GPU (id INTEGER PRIMARY KEY, name TEXT, busLocation TEXT, totalMemory INTEGER,
            smCount INTEGER, chipName TEXT, memoryBandwidth INTEGER);
        INSERT INTO TARGET_INFO_GPU VALUES (0, 'NVIDIA H100 PCIe', '0000:01:00.0', 85520809984, 114, 'GH100', 0);
    """)
    db.execute("INSERT INTO StringIds VALUES (1, 'cudaLaunchKernel'), (2, 'gemm'), "
               "(3, 'aten::relu, seq = 2, op_id = 3, sizes = [[8, 32]]')")
    for tid, start, end, text, text_id in ranges:
        db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, textId) VALUES (?,?,59,?,?,?)",
                   (start, end, text, tid, text_id))
    for correlation, tid, start in launches:
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?,?,?,?,?,1,0,0)",
                   (start, start + 5, 0, tid, correlation))
    for correlation, start, end in kernels:
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?,?,0,1,7,?,1,2,2,1,1)", (start, end, correlation))
    db.commit()
    db.close()


def test_nsys_sqlite_export(tmp_path):
    path = tmp_path / "run.sqlite"
    _nsys(str(path),
          ranges=[(7, 0, 100, "aten::linear, seq = 1, op_id = 1, sizes = [[8, 16], [32, 16], [32]]", None),
                  (7, 10, 60, "aten::addmm, seq = 1, op_id = 2, sizes = [[32], [8, 16], [16, 32], [], []]", None),
                  (7, 200, 300, None, 3)],          # text in StringIds, as nsys stores repeated strings
          launches=[(11, 7, 20), (12, 7, 250), (13, 7, 150)],   # 13: outside every range
          kernels=[(11, 1000, 1400), (12, 2000, 2100), (13, 3000, 3050)])
    p = profile_read.read(str(path))
    assert (p.kernels, p.linked, profile.source_preset(p.device)) == (3, 2, "h100-pcie")
    got = {(i.name, i.input_bytes, i.kernel_ns) for i in p.invocations}
    assert got == {("linear", 4 * (8 * 16 + 32 * 16 + 32), 400.0), ("addmm", 4 * (32 + 8 * 16 + 16 * 32), 400.0),
                   ("relu", 4 * 8 * 32, 100.0)}


# --- matching against a trace ----------------------------------------------------------------

@pytest.fixture(scope="module")
def mlp_trace(tmp_path_factory):
    d = tmp_path_factory.mktemp("mlp")
    (d / "mlp_model.py").write_text(MLP)
    path = d / "mlp.trace"
    generate.generate(str(path), lambda: user.load(f"{d / 'mlp_model.py'}:mlp"), steps=3)
    return str(path)


def _cuda_profile(path, kernel_us=10.0, device="NVIDIA A100-PG509-200"):
    """A real torch.profiler trace of the MLP's training steps on the CPU, each innermost operator
    that launches a kernel on CUDA given a launch and a kernel of kernel_us, as Kineto writes them."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, foreach=True)
    x = torch.randn(8, 16)
    with torch.profiler.profile(record_shapes=True) as prof:
        for _ in range(2):
            optimizer.zero_grad(set_to_none=True)
            model(x).float().sum().backward()
            optimizer.step()
    prof.export_chrome_trace(str(path))
    doc = json.loads(Path(path).read_text())
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    extra = []
    for n, e in enumerate(ops):
        inner = any(o is not e and o["tid"] == e["tid"] and e["ts"] <= o["ts"] and o["ts"] + o["dur"] <= e["ts"] + e["dur"]
                    for o in ops)
        if inner or e["name"].split("::")[-1] in NO_KERNEL:
            continue
        correlation = 10**6 + n
        extra.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": e["pid"], "tid": e["tid"],
                      "ts": e["ts"], "dur": 0, "args": {"External id": correlation, "correlation": correlation}})
        extra.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": e["ts"] + 1000,
                      "dur": kernel_us, "args": {"External id": correlation, "correlation": correlation}})
    doc["traceEvents"] += extra
    doc["deviceProperties"] = [{"id": 0, "name": device}]
    Path(path).write_text(json.dumps(doc))
    return str(path)


def test_a_profile_of_the_same_model_matches_and_scales(mlp_trace, tmp_path):
    w = workload.load(mlp_trace)
    doc = profile.apply(w, _cuda_profile(tmp_path / "p.json"), K.GPU_PRESETS["h100-pcie"])
    # The rest match by operator alone: an input broadcast from one number (the gradient of a sum)
    # reads 4 bytes, not what its dimensions say.
    assert doc["source_gpu"] == "a100-40gb" and doc["match_rate"] >= 0.75
    assert doc["matched_by_shape"] + doc["matched_by_operator"] == w.launches
    matched = ~np.isnan(w.override_seconds)
    # The MLP's kernels are all memory-bound on both GPUs: 10 us on the A100 scales by the
    # bandwidth ratio (1555 GB/s to 2000 GB/s); a foreach operator's time is shared by its launches.
    single = matched & (w.traffic > 0)
    a100, h100 = K.GPU_PRESETS["a100-40gb"], K.GPU_PRESETS["h100-pcie"]
    ratio = a100.memory_bytes_per_s / h100.memory_bytes_per_s
    assert ratio == pytest.approx(1555 / 2000)
    per_op = {}
    for i in np.flatnonzero(single):
        per_op.setdefault(round(w.override_seconds[i] / ratio * 1e6, 6), 0)
    assert 10.0 in per_op
    low, central, high = doc["band_ms"][0], doc["kernel_ms_per_step"], doc["band_ms"][1]
    assert low <= central <= high and low < high
    # Every kernel took 10 us: the band spans the bandwidth ratio and the FLOPs ratio (19.5 to 51
    # TFLOPS, FP32 units), for each launch alike (rounding aside).
    assert high / low == pytest.approx(ratio / (a100.fp32_flops / h100.fp32_flops), rel=0.01)


def test_a_profile_of_another_model_is_refused(mlp_trace, tmp_path):
    w = workload.load(mlp_trace)
    path = _cuda_profile(tmp_path / "p.json")
    doc = json.loads(Path(path).read_text())
    for e in doc["traceEvents"]:          # the same operators at other sizes: another model
        if "Input Dims" in e.get("args", {}):
            e["args"]["Input Dims"] = [[d * 3 for d in dims] if isinstance(dims, list) else dims
                                       for dims in e["args"]["Input Dims"]]
    Path(path).write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"% of .*mlp.trace's \d+ launches match its operators by operator and "
                                         r"shapes \(at least 50% needed\): a profile of another model"):
        profile.apply(w, path, K.GPU_PRESETS["h100-pcie"])


def test_elementwise_grids_give_the_elements_a_launch_covered():
    name = ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)::"
            "launch_clamp_scalar(...)::{lambda()#1}>(int, ...)")
    assert profile_read.kernel_elements(name, [48400, 1, 1], [128, 1, 1]) == 48400 * 512
    assert profile_read.kernel_elements("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl>",
                                        [96800, 1, 1], [128, 1, 1]) == 96800 * 256
    assert profile_read.kernel_elements("void at::native::unrolled_elementwise_kernel<add>", [10, 1, 1],
                                        [128, 1, 1]) == 10 * 512
    assert profile_read.kernel_elements("ampere_sgemm_32x32_sliced1x4_tn", [128, 4, 1], [128, 1, 1]) is None
    assert profile_read.kernel_elements(name, [3, 2, 1], [128, 1, 1]) is None
    assert profile_read.kernel_elements(name, None, None) is None


ALEXNET_MODEL = Path(__file__).resolve().parents[1] / "examples" / "alexnet.py"


@pytest.fixture(scope="module")
def alexnet_traces(tmp_path_factory):
    """examples/alexnet.py's forward passes at the profile's batch (128) and at 64, and its training steps."""
    d, traces = tmp_path_factory.mktemp("alexnet"), {}
    for key, callable_, inference in (("128", "alexnet", True), ("64", "alexnet_batch_64", True),
                                      ("train", "alexnet", False)):
        traces[key] = str(d / f"{key}.trace")
        generate.generate(traces[key], lambda c=callable_: user.load(f"{ALEXNET_MODEL}:{c}"), steps=2,
                          inference=inference)
    return traces


@needs_kineto
def test_the_alexnet_profile_fits_its_models_forward_passes(alexnet_traces):
    w = workload.load(alexnet_traces["128"])
    doc = profile.apply(w, str(ALEXNET), K.GPU_PRESETS["a100-40gb"])
    assert doc["match_rate"] == 1.0 and doc["matched_by_operator"] == w.launches == 38
    assert profile.batch_ratio(profile_read.read(str(ALEXNET)), profile.trace_operators(w.path)) == (1.0, ["relu_"])


@needs_kineto
def test_a_profile_without_shapes_at_another_batch_is_refused(alexnet_traces):
    """Every operator matches by name at batch 64, as a V100 ResNet-50 profile at batch 32 matched
    59% of a batch-64 trace and was accepted: the grids tell the batch apart."""
    w = workload.load(alexnet_traces["64"])
    with pytest.raises(ValueError, match=r"recorded without shapes, and its elementwise kernels' grids \(relu_\) "
                                         r"cover 2\.00x the elements .*: a profile at about batch 128 "
                                         r"\(the trace: batch 64\); generate the trace at the profile's batch"):
        profile.apply(w, str(ALEXNET), K.GPU_PRESETS["a100-40gb"])


@needs_kineto
def test_a_forward_only_profile_against_training_steps_says_so(alexnet_traces):
    w = workload.load(alexnet_traces["train"])
    with pytest.raises(ValueError, match=r"the profile holds forward passes only \(no backward operator\) and the "
                                         r"trace training steps; .* pump trace generate --inference"):
        profile.apply(w, str(ALEXNET), K.GPU_PRESETS["a100-40gb"])


@needs_kineto
def test_the_alexnet_profile_does_not_fit_an_mlp(mlp_trace):
    w = workload.load(mlp_trace)
    with pytest.raises(ValueError, match="match its operators by operator "):
        profile.apply(w, str(ALEXNET), K.GPU_PRESETS["a100-40gb"])


def test_cli_simulates_with_the_profile(mlp_trace, tmp_path, capsys):
    path = _cuda_profile(tmp_path / "p.json", device="Tesla T4")
    try:
        rc = cli.main(["simulate", mlp_trace, "--capacity", "100%", "--policy", "ideal", "--profile", path])
    except SystemExit as exc:
        rc = exc.code
    assert rc == 1 and "Tesla T4" in capsys.readouterr().err
    gz = tmp_path / "p.json.gz"
    with open(path, "rb") as f, gzip.open(gz, "wb") as out:
        shutil.copyfileobj(f, out)
    rc = cli.main(["simulate", mlp_trace, "--capacity", "100%", "--policy", "ideal", "--gpu", "l4",
                   "--profile", str(gz), "--profile-gpu", "v100", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["profile"]["source_gpu"] == "v100" and doc["profile"]["match_rate"] >= 0.75
