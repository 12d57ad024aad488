"""The GPU suite's CUPTI Unified Memory counters without a GPU (bench/cupti/um_counters.c,
bench/gpu/cupti.py, bench/gpu/probes/uvm_counters.py, the table's counter cells): a report of a
process without a GPU, the first H100 run's refused enable read as refused (never as zeros
counted), the probe's exit status, and the library's retry after cuInit against a stand-in
CUPTI."""

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

from helpers import clean_env

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "gpu"
sys.path.insert(0, str(BENCH))
import cupti  # noqa: E402
import table  # noqa: E402


def test_cupti_report_of_a_process_without_a_gpu(tmp_path):
    try:
        library = cupti.build(tmp_path)
    except cupti.Unavailable as exc:
        pytest.skip(f"no CUPTI to build against here: {exc}")
    report = tmp_path / "report.json"
    code = f"import ctypes; assert ctypes.CDLL({library!r}).InitializeInjection() == 1"
    proc = subprocess.run([sys.executable, "-c", code], env=dict(clean_env(), PUMP_BENCH_CUPTI_OUT=str(report)),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(report.read_text())
    assert set(doc["counters"]) == {"bytes_h2d", "bytes_d2h", "cpu_page_faults", "gpu_page_faults", "thrashing",
                                    "throttling"}
    assert set(doc["bytes_h2d_by_cause"]) >= {"user", "coherence", "prefetch", "eviction"}
    assert doc["enable"] != "CUPTI_SUCCESS" and "refused" in cupti.read(str(report))["error"]
    assert doc["enabled_at"] is None and doc["enable_tries"] >= 1
    assert doc["enable_log"][0]["at"] == "InitializeInjection"


def test_cupti_read_says_when_there_is_no_report(tmp_path):
    assert "no CUPTI report" in cupti.read(str(tmp_path / "none.json"))["error"]
    (tmp_path / "bad.json").write_text("{")
    assert "unreadable" in cupti.read(str(tmp_path / "bad.json"))["error"]


H100_RUN = ROOT / "bench" / "results" / "gpu-20261124-nvidia-h100-80gb-hbm3"


def h100_report():
    """What um_counters wrote on the first H100 run (driver 580.159.04, CUPTI 130001): every
    configure CUPTI_SUCCESS, the enable CUPTI_ERROR_NOT_READY, every counter 0."""
    doc = json.loads((H100_RUN / "preflight.json").read_text())["probes"]["uvm_counters"]["result"]["report"]
    doc.pop("error", None)   # what cupti.read added
    assert doc["enable"] == "CUPTI_ERROR_NOT_READY" and not any(doc["counters"].values())
    return doc


def accepted_report():
    return {"enable": "CUPTI_SUCCESS", "enabled_at": "cuDevicePrimaryCtxRetain enter", "enable_tries": 2,
            "counters": {"bytes_h2d": 0, "bytes_d2h": 0, "gpu_page_faults": 0}, "bytes_h2d_by_cause": {"user": 0}}


def test_cupti_read_calls_the_h100_reports_zeros_refused(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps(h100_report()))
    doc = cupti.read(str(report))
    assert doc["error"].startswith("CUPTI refused the Unified Memory counters: CUPTI_ERROR_NOT_READY")
    assert cupti.refused(doc) and not cupti.refused(cupti.read(str(tmp_path / "none.json")))
    report.write_text(json.dumps(accepted_report()))
    assert "error" not in cupti.read(str(report)) and not cupti.refused(cupti.read(str(report)))


def test_table_never_shows_an_erroneous_reports_zeros_as_counted(tmp_path):
    (tmp_path / "refused.json").write_text(json.dumps(h100_report()))
    (tmp_path / "counted.json").write_text(json.dumps(accepted_report()))
    step = {"step_ms": table.summarize([40])}
    case = {"case": "a", "variants": {
        "ideal": dict(step, cupti=cupti.read(str(tmp_path / "counted.json"))),
        "naive": dict(step, cupti=cupti.read(str(tmp_path / "refused.json"))),
        "launch": dict(step, cupti=cupti.read(str(tmp_path / "none.json"))),
        "lookahead": dict(step, cupti={"error": "CUPTI unavailable: no CUPTI here"})}}
    cells = {r[1]: r[8:] for r in table.rows([case])}
    assert cells["ideal"] == ["0.00", "0.00", "0", "-"]          # counted: a zero is a measurement
    assert cells["naive"] == ["refused"] * 4                     # refused: nothing was counted
    assert cells["launch"] == cells["lookahead"] == ["-"] * 4    # no report, no CUPTI
    text = table.render([case])
    assert "| a | naive | 40.00 | 0.0% | - | - | - | - | refused | refused | refused | refused |" in text
    assert [e.split(":")[0] for e in table.counter_errors([case])] == ["case a, naive", "case a, launch",
                                                                      "case a, lookahead"]


def uvm_probe(monkeypatch, report, fake=False, rc=0):
    """bench/gpu/probes/uvm_counters.py's main() with its counter run faked: the run writes
    `report` (None: writes nothing) where the injection library would, and exits with rc."""
    pytest.importorskip("cuda.bindings", reason="the probes import cudrv (cuda-python)")
    monkeypatch.syspath_prepend(str(BENCH / "probes"))
    spec = importlib.util.spec_from_file_location("uvm_counters_probe", BENCH / "probes" / "uvm_counters.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module.cupti, "build", lambda work: str(pathlib.Path(work) / "libum_counters.so"))
    monkeypatch.setattr(module, "on_fakecuda", lambda: fake)

    def run(argv, env, **kw):
        assert env["CUDA_INJECTION64_PATH"].endswith("libum_counters.so")
        if report is not None:
            pathlib.Path(env["PUMP_BENCH_CUPTI_OUT"]).write_text(json.dumps(report))
        return subprocess.CompletedProcess(argv, rc, "", "boom" if rc else "")
    monkeypatch.setattr(module.subprocess, "run", run)
    return module


def test_uvm_counters_probe_fails_when_cupti_refuses(monkeypatch, tmp_path, capsys):
    module = uvm_probe(monkeypatch, h100_report())
    assert module.main(["--work", str(tmp_path)]) == 1
    line = json.loads(capsys.readouterr().out)
    assert "CUPTI_ERROR_NOT_READY" in line["failure"] and line["report"]["error"]


def test_uvm_counters_probe_fails_without_a_report_on_a_driver(monkeypatch, tmp_path, capsys):
    (tmp_path / "report.json").write_text(json.dumps(accepted_report()))   # an earlier run's
    module = uvm_probe(monkeypatch, None)
    assert module.main(["--work", str(tmp_path)]) == 1
    assert "no CUPTI report" in json.loads(capsys.readouterr().out)["failure"]


def test_uvm_counters_probe_passes_counted_counters_and_findings(monkeypatch, tmp_path, capsys):
    assert uvm_probe(monkeypatch, accepted_report()).main(["--work", str(tmp_path / "a")]) == 0
    line = json.loads(capsys.readouterr().out)
    assert "failure" not in line and line["report"]["enabled_at"] == "cuDevicePrimaryCtxRetain enter"
    # fakecuda loads no injection library: no report there is a finding (the dry run passes).
    assert uvm_probe(monkeypatch, None, fake=True).main(["--work", str(tmp_path / "b")]) == 0
    assert "on fakecuda" in json.loads(capsys.readouterr().out)["finding"]
    # ...but a refusal is a failure wherever it comes from, and a failed run fails.
    assert uvm_probe(monkeypatch, h100_report(), fake=True).main(["--work", str(tmp_path / "c")]) == 1
    capsys.readouterr()
    assert uvm_probe(monkeypatch, accepted_report(), rc=1).main(["--work", str(tmp_path / "d")]) == 1
    capsys.readouterr()
    # No CUPTI at all is a finding, as before.
    module = uvm_probe(monkeypatch, None)

    def unavailable(work):
        raise cupti.Unavailable("no CUPTI (cupti.h beside a libcupti.so) in /nowhere")
    monkeypatch.setattr(module.cupti, "build", unavailable)
    assert module.main(["--work", str(tmp_path / "e")]) == 0
    assert json.loads(capsys.readouterr().out)["finding"].startswith("CUPTI unavailable")


# A stand-in libcupti for um_counters.c: its enable answers CUPTI_ERROR_NOT_READY until the test
# says the driver is initialised, as NVIDIA's did inside cuInit on the H100; it keeps the
# subscriber's callback so the test can play driver API calls and context creations, and hands
# back one Unified Memory record per stub_record() at the flush.
STUB_CUPTI = r"""
#include <stdlib.h>
#include <string.h>
#include <cupti.h>
#if CUPTI_API_VERSION >= 130000
typedef CUpti_ActivityUnifiedMemoryCounter3 um_record;
#else
typedef CUpti_ActivityUnifiedMemoryCounter2 um_record;
#endif
static CUpti_BuffersCallbackRequestFunc want;
static CUpti_BuffersCallbackCompleteFunc done;
static CUpti_CallbackFunc callback;
static int ready, enabled, driver_on, context_on, configured, enables;
static um_record pending[16];
static int npending;
CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult r, const char **s) {
    *s = r == CUPTI_SUCCESS ? "CUPTI_SUCCESS" : r == CUPTI_ERROR_NOT_READY ? "CUPTI_ERROR_NOT_READY" : "CUPTI_ERROR_UNKNOWN";
    return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc r, CUpti_BuffersCallbackCompleteFunc c) {
    want = r; done = c; return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI cuptiActivityConfigureUnifiedMemoryCounter(CUpti_ActivityUnifiedMemoryCounterConfig *c, uint32_t n) {
    (void)c; configured += (int)n; return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI cuptiActivityEnable(CUpti_ActivityKind kind) {
    enables++;
    if (kind != CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER) return CUPTI_ERROR_UNKNOWN;
    if (!ready) return CUPTI_ERROR_NOT_READY;
    enabled = 1; return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI cuptiSubscribe(CUpti_SubscriberHandle *s, CUpti_CallbackFunc f, void *u) {
    (void)u; callback = f; *s = (CUpti_SubscriberHandle)&callback; return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI cuptiEnableCallback(uint32_t on, CUpti_SubscriberHandle s, CUpti_CallbackDomain d, CUpti_CallbackId id) {
    (void)s;
    if (d != CUPTI_CB_DOMAIN_RESOURCE || id != CUPTI_CBID_RESOURCE_CONTEXT_CREATED) return CUPTI_ERROR_UNKNOWN;
    context_on = (int)on; return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI cuptiEnableDomain(uint32_t on, CUpti_SubscriberHandle s, CUpti_CallbackDomain d) {
    (void)s;
    if (d != CUPTI_CB_DOMAIN_DRIVER_API) return CUPTI_ERROR_UNKNOWN;
    driver_on = (int)on; return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI cuptiActivityFlushAll(uint32_t flag) {
    (void)flag;
    if (!npending || !want) return CUPTI_SUCCESS;
    uint8_t *buffer; size_t size, max;
    want(&buffer, &size, &max);
    memcpy(buffer, pending, npending * sizeof(um_record));
    done(NULL, 0, buffer, size, npending * sizeof(um_record));
    npending = 0;
    return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, CUpti_Activity **record) {
    uint8_t *next = *record ? (uint8_t *)*record + sizeof(um_record) : buffer;
    if (next + sizeof(um_record) > buffer + valid) return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *record = (CUpti_Activity *)next; return CUPTI_SUCCESS;
}
CUptiResult CUPTIAPI cuptiActivityGetNumDroppedRecords(CUcontext c, uint32_t s, size_t *dropped) {
    (void)c; (void)s; *dropped = 0; return CUPTI_SUCCESS;
}
void stub_ready(int r) { ready = r; }
int stub_state(int which) {
    int v[] = {enabled, driver_on, context_on, configured, enables};
    return v[which];
}
void stub_driver_call(const char *name) {
    CUpti_CallbackData d;
    memset(&d, 0, sizeof d);
    d.functionName = name;
    for (int site = 0; site < 2 && driver_on && callback; site++) {
        d.callbackSite = site ? CUPTI_API_EXIT : CUPTI_API_ENTER;
        callback(NULL, CUPTI_CB_DOMAIN_DRIVER_API, 1, &d);
    }
}
void stub_context_created(void) {
    CUpti_ResourceData r;
    memset(&r, 0, sizeof r);
    if (context_on && callback) callback(NULL, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_CREATED, &r);
}
void stub_record(int kind, unsigned long long value, int cause) {
    if (!enabled || npending == 16) return;
    um_record *u = &pending[npending++];
    memset(u, 0, sizeof *u);
    u->kind = CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER;
    u->counterKind = (CUpti_ActivityUnifiedMemoryCounterKind)kind;
    u->value = value;
    u->flags = (uint32_t)cause;
}
"""

# The process the stand-in runs in: InitializeInjection (inside cuInit on a driver), then what
# the test plays, one step a line, then exit (the report is written at exit).
STUB_RUN = r"""
import ctypes, sys
stub = ctypes.CDLL(sys.argv[1])
injection = ctypes.CDLL(sys.argv[2])
assert injection.InitializeInjection() == 1
for step in sys.argv[3:]:
    what, _, arg = step.partition(":")
    if what == "ready":
        stub.stub_ready(1)
    elif what == "call":
        stub.stub_driver_call(arg.encode())
    elif what == "context":
        stub.stub_context_created()
    elif what == "record":
        kind, value, cause = map(int, arg.split(","))
        stub.stub_record(kind, ctypes.c_ulonglong(value), cause)
    elif what == "expect":
        which, value = map(int, arg.split(","))
        assert stub.stub_state(which) == value, (step, stub.stub_state(which))
"""


@pytest.fixture
def stub_cupti(tmp_path):
    """(run, build dir): um_counters.c built with cupti.py's own command (C11, -Wall -Wextra
    -Werror) against the toolkit's cupti.h and the stand-in libcupti; run(*steps) plays the
    steps and returns cupti.read's report."""
    try:
        inc, _, extra = cupti.find()
        cc = cupti.compiler()
    except cupti.Unavailable as exc:
        pytest.skip(f"no cupti.h to build against here: {exc}")
    (tmp_path / "stub_cupti.c").write_text(STUB_CUPTI)
    stub = tmp_path / "libstub_cupti.so"
    subprocess.run([cc, "-std=c11", "-shared", "-fPIC", f"-I{inc}", *(f"-I{d}" for d in extra),
                    str(tmp_path / "stub_cupti.c"), "-o", str(stub)], check=True, capture_output=True, text=True)
    library = tmp_path / "libum_counters.so"
    proc = subprocess.run(cupti.command(cc, inc, extra, tmp_path, stub.name, library), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "run.py").write_text(STUB_RUN)

    def run(*steps):
        report = tmp_path / "report.json"
        report.unlink(missing_ok=True)
        proc = subprocess.run([sys.executable, str(tmp_path / "run.py"), str(stub), str(library), *steps],
                              env=dict(clean_env(), PUMP_BENCH_CUPTI_OUT=str(report)), capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return cupti.read(str(report))
    return run


H2D, GPU_FAULT, USER, COHERENCE = 1, 4, 1, 2
ENABLED, DRIVER_ON, CONTEXT_ON = 0, 1, 2


def test_um_counters_enables_after_cuinit_when_refused_inside_it(stub_cupti):
    doc = stub_cupti("expect:0,0", "expect:1,1", "expect:2,1",       # refused at init: retries set up
                     "call:cuInit", "ready", "call:cuDeviceGetCount", "expect:0,1", "expect:1,0", "expect:2,0",
                     "record:1,2097152,1", "record:1,4096,2", "record:4,3,0")
    assert "error" not in doc, doc
    assert doc["enable"] == "CUPTI_SUCCESS" and doc["enabled_at"] == "cuDeviceGetCount enter"
    assert [t["at"] for t in doc["enable_log"]] == ["InitializeInjection", "cuInit enter", "cuInit exit",
                                                    "cuDeviceGetCount enter"]
    assert doc["enable_log"][0]["result"] == "CUPTI_ERROR_NOT_READY" and doc["enable_tries"] == 4
    assert doc["subscribe"] == "CUPTI_SUCCESS" and doc["retry_callbacks"] == "CUPTI_SUCCESS"
    assert set(doc["configure"].values()) == {"CUPTI_SUCCESS"}
    assert doc["counters"]["bytes_h2d"] == 2097152 + 4096 and doc["counters"]["gpu_page_faults"] == 3
    assert doc["bytes_h2d_by_cause"]["user"] == 2097152 and doc["bytes_h2d_by_cause"]["coherence"] == 4096
    assert doc["records"] == 3 and doc["dropped"] == 0


def test_um_counters_enables_at_a_context_creation(stub_cupti):
    doc = stub_cupti("ready", "context", "expect:0,1", "expect:1,0", "expect:2,0")
    assert doc["enable"] == "CUPTI_SUCCESS" and doc["enabled_at"] == "context created" and doc["enable_tries"] == 2


def test_um_counters_says_when_the_enable_never_takes(stub_cupti):
    doc = stub_cupti("call:cuInit", "context", "call:cuMemAllocManaged", "expect:1,1")
    assert doc["enable"] == "CUPTI_ERROR_NOT_READY" and doc["enabled_at"] is None and doc["enable_tries"] == 6
    assert cupti.refused(doc) and "6 tries" in doc["error"] and "InitializeInjection" in doc["error"]
    assert not any(doc["counters"].values())
    assert table.counter_cells(doc) == ["refused"] * 4


