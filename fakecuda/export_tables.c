/* export_tables.c: why it exists: cuGetExportTable, the driver's private tables that the CUDA
 * runtime (libcudart, and the static copies inside cuBLAS and cuBLASLt) asks for by UUID.
 * Slot 0 of most tables holds the table's size in bytes; the rest are functions.
 *
 * Sources. Where it can be checked, NVIDIA's 535 (CUDA 12.2) and 550 (CUDA 12.4) libcuda.so.1
 * (Debian's libcuda1, scripts/fetch-libcuda), which answer cuGetExportTable without a GPU and
 * before cuInit: which ids they refuse (CUDA_ERROR_INVALID_VALUE, *table NULL), each table's
 * size word, which slots hold a function (tests/test_export_tables.py compares them with
 * fakecuda at the same driver version). Where it cannot, ZLUDA's published reading
 * (github.com/vosen/ZLUDA: dark_api/src/lib.rs, cuda_types/src/dark_api.rs,
 * zluda/src/impl/driver.rs) for what the slots do; the ids and slots the 13.0 runtime uses are
 * issue 26's trace. A slot whose behaviour no source gives is a stub that counts its call
 * (not_found.c, "UUID[slot]"), says so once on stderr and returns CUDA_ERROR_NOT_SUPPORTED: a
 * runtime that needs it fails visibly. An unknown id is refused as the drivers refuse one, and
 * counted. */
#include "fakecuda_internal.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

extern __typeof__(cuModuleLoadData) fcl_cuModuleLoadData __attribute__((visibility("hidden")));

enum { T_CUDART, T_TOOLS_HOOKS, T_TOOLS_TLS, T_CLS, T_CTX_CHECKS, T_INTEGRITY, T_CUBLAS_21318C60, T_COUNT };
#define FC_MAX_SLOTS 88
static const struct {
    const char *uuid; /* as printed: bytes in memory order */
    int has_size;     /* slot 0 is the size in bytes (every table but context-local storage) */
} fc_table_ids[T_COUNT] = {
    [T_CUDART] = {"6bd5fb6c-5bf4-e74a-8987-d93912fd9df9", 1},
    [T_TOOLS_HOOKS] = {"a094798c-2e74-2e74-93f2-0800200c0a66", 1},
    [T_TOOLS_TLS] = {"42d85a81-23f6-cb47-8298-f6e78a3aecdc", 1},
    [T_CLS] = {"c693336e-1121-df11-a8c3-68f355d89593", 0},
    [T_CTX_CHECKS] = {"263e8860-7cd2-6143-92f6-bbd5006dfa7e", 1},
    [T_INTEGRITY] = {"d4082055-bde6-704b-8d34-ba123c66e1f2", 1},
    [T_CUBLAS_21318C60] = {"21318c60-9714-3248-8ca6-41ff7324c8f2", 1},
};

/* Slots per table at a driver version; 0: the id is refused. 535 (12.2) and 550 (12.4) as
 * measured; 13.0 and later as the newest measured, and CUDART_INTERFACE's 13 slots as ZLUDA
 * reads it (slot 12 loads the compilers; the 13.0 runtime calls it). Refused by both drivers,
 * and so here: f8cff951-2146-8b4e-b9e2-fb469e7c0dd9 (which the 13.0 runtime asks for and does
 * without), and 263e8860 by 535. */
static int table_slots(int t, int v)
{
    switch (t) {
    case T_CUDART: return v < 12040 ? 11 : v < 13000 ? 12 : 13;
    case T_TOOLS_HOOKS: return 7;
    case T_TOOLS_TLS: return 3;
    case T_CLS: return 4; /* put, delete, get, NULL (no size word: ZLUDA; 550's slot 3 is NULL) */
    case T_CTX_CHECKS: return v < 12040 ? 0 : 5;
    case T_INTEGRITY: return 3;
    case T_CUBLAS_21318C60: return v < 12040 ? 77 : 86;
    default: return 0;
    }
}

/* ---- unmodelled slots: one stub per (table, slot), so the count names both ---- */
static CUresult unmodelled(int t, int slot)
{
    char name[64];
    snprintf(name, sizeof name, "%s[%d]", fc_table_ids[t].uuid, slot);
    fc_not_found(FC_NF_SLOT, name);
    static _Atomic int said[T_COUNT];
    if (!atomic_exchange(&said[t], 1))
        fprintf(stderr, "fakecuda: export table %s: slot %d called, whose behaviour is not modelled "
                        "(CUDA_ERROR_NOT_SUPPORTED; FAKECUDA_STATS \"not_found\" counts each slot)\n",
                fc_table_ids[t].uuid, slot);
    return CUDA_ERROR_NOT_SUPPORTED;
}
#define FC_STUB(t, i) __attribute__((unused)) static CUresult stub_##t##_##i(void) { return unmodelled(t, i); }
#define FC_STUB_ADDR(t, i) (const void *)&stub_##t##_##i,
#define FC_SLOTS_88(X, t)                                                                                    \
    X(t, 0) X(t, 1) X(t, 2) X(t, 3) X(t, 4) X(t, 5) X(t, 6) X(t, 7) X(t, 8) X(t, 9) X(t, 10) X(t, 11)       \
    X(t, 12) X(t, 13) X(t, 14) X(t, 15) X(t, 16) X(t, 17) X(t, 18) X(t, 19) X(t, 20) X(t, 21) X(t, 22)       \
    X(t, 23) X(t, 24) X(t, 25) X(t, 26) X(t, 27) X(t, 28) X(t, 29) X(t, 30) X(t, 31) X(t, 32) X(t, 33)       \
    X(t, 34) X(t, 35) X(t, 36) X(t, 37) X(t, 38) X(t, 39) X(t, 40) X(t, 41) X(t, 42) X(t, 43) X(t, 44)       \
    X(t, 45) X(t, 46) X(t, 47) X(t, 48) X(t, 49) X(t, 50) X(t, 51) X(t, 52) X(t, 53) X(t, 54) X(t, 55)       \
    X(t, 56) X(t, 57) X(t, 58) X(t, 59) X(t, 60) X(t, 61) X(t, 62) X(t, 63) X(t, 64) X(t, 65) X(t, 66)       \
    X(t, 67) X(t, 68) X(t, 69) X(t, 70) X(t, 71) X(t, 72) X(t, 73) X(t, 74) X(t, 75) X(t, 76) X(t, 77)       \
    X(t, 78) X(t, 79) X(t, 80) X(t, 81) X(t, 82) X(t, 83) X(t, 84) X(t, 85) X(t, 86) X(t, 87)
#define FC_STUBS(t) FC_SLOTS_88(FC_STUB, t)
FC_STUBS(T_CUDART) FC_STUBS(T_TOOLS_HOOKS) FC_STUBS(T_TOOLS_TLS) FC_STUBS(T_CLS) FC_STUBS(T_CTX_CHECKS)
FC_STUBS(T_INTEGRITY) FC_STUBS(T_CUBLAS_21318C60)
static const void *const fc_stubs[T_COUNT][FC_MAX_SLOTS] = {
    {FC_SLOTS_88(FC_STUB_ADDR, T_CUDART)},       {FC_SLOTS_88(FC_STUB_ADDR, T_TOOLS_HOOKS)},
    {FC_SLOTS_88(FC_STUB_ADDR, T_TOOLS_TLS)},    {FC_SLOTS_88(FC_STUB_ADDR, T_CLS)},
    {FC_SLOTS_88(FC_STUB_ADDR, T_CTX_CHECKS)},   {FC_SLOTS_88(FC_STUB_ADDR, T_INTEGRITY)},
    {FC_SLOTS_88(FC_STUB_ADDR, T_CUBLAS_21318C60)},
};

/* ---- CUDART_INTERFACE (6bd5fb6c): modules from the runtime's registered fatbins ---- */
/* __fatBinC_Wrapper_t, what nvcc emits for each translation unit (ZLUDA, FatbincWrapper): magic
 * 0x466243B1, version 1 or 2, the fatbin (magic 0xBA55ED50), and a file name or (version 2)
 * prelinked fatbins. */
typedef struct { uint32_t magic, version; const void *data, *filename_or_fatbins; } fc_fatbinc_wrapper;
#define FC_FATBINC_MAGIC 0x466243B1u

/* The fatbin goes to cuModuleLoadData, which takes "a cubin or fatbin or PTX" (cuda.h): what the
 * image holds is that entry point's business. */
static CUresult module_from_wrapper(CUmodule *module, const fc_fatbinc_wrapper *w)
{
    if (!module || !w) return CUDA_ERROR_INVALID_VALUE;
    if (w->magic != FC_FATBINC_MAGIC || (w->version != 1 && w->version != 2) || !w->data)
        return CUDA_ERROR_INVALID_IMAGE;
    return fcl_cuModuleLoadData(module, w->data);
}
/* Slot 1 (module, wrapper); 6 (module, wrapper, arg3, arg4, arg5) and 8 (fatbin header, module,
 * arg3, arg4, arg5), whose extra arguments no source explains: with any set, refused as ZLUDA
 * does (CUDA_ERROR_NOT_SUPPORTED), never guessed at. */
static CUresult cudart_module_from_wrapper(CUmodule *module, const fc_fatbinc_wrapper *w)
{
    return module_from_wrapper(module, w);
}
static CUresult cudart_module_from_wrapper_ext(CUmodule *module, const fc_fatbinc_wrapper *w, void *a3, void *a4,
                                               unsigned a5)
{
    if (a3 || a4 || a5) return unmodelled(T_CUDART, 6);
    return module_from_wrapper(module, w);
}
static CUresult cudart_module_from_fatbin(const void *fatbin, CUmodule *module, void *a3, void *a4, unsigned a5)
{
    if (a3 || a4 || a5) return unmodelled(T_CUDART, 8);
    if (!module || !fatbin) return CUDA_ERROR_INVALID_VALUE;
    return fcl_cuModuleLoadData(module, fatbin);
}
/* Slot 2: a device's primary context, without retaining or activating it (ZLUDA's test
 * cudart_interface_fn2_creates_inactive_primary_ctx). */
static CUresult cudart_primary_ctx(CUcontext *pctx, CUdevice dev)
{
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!atomic_load(&fc_initialized)) return CUDA_ERROR_NOT_INITIALIZED;
    if (dev < 0 || dev >= fc_cfg.ndevices) return CUDA_ERROR_INVALID_DEVICE;
    *pctx = fc_primary_ctx(dev);
    return CUDA_SUCCESS;
}
static void cudart_slot7(size_t arg) { (void)arg; } /* ZLUDA: does nothing observable */
/* Slot 12: loads the PTX compiler, libnvvm and tileir (ZLUDA). No JIT is modelled: nothing
 * to load, and a PTX image is refused when it is loaded (the JIT's error). */
static CUresult cudart_load_compilers(void) { return CUDA_SUCCESS; }

/* ---- TOOLS_RUNTIME_CALLBACK_HOOKS (a094798c): slots 2 and 6 hand out buffers of 1024 and 14
 * u32 that the runtime fills (ZLUDA); no tool reads them here. ---- */
static uint32_t fc_tools_buf1[1024], fc_tools_buf2[14];
static void tools_buffer1(void **p, size_t *n) { *p = fc_tools_buf1; *n = 1024; }
static void tools_buffer2(void **p, size_t *n) { *p = fc_tools_buf2; *n = 14; }

/* ---- TOOLS_TLS (42d85a81): slot 2, called by cuBLAS, answers the calling thread's innermost
 * tools id: none is ever pushed here (no tools layer), so 0. As the 550 driver answers when
 * called: CUDA_ERROR_NOT_INITIALIZED before cuInit. ---- */
static CUresult tools_tls_top(uint64_t *out)
{
    if (!atomic_load(&fc_initialized)) return CUDA_ERROR_NOT_INITIALIZED;
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    *out = 0;
    return CUDA_SUCCESS;
}

/* ---- CONTEXT_CHECKS (263e8860): slot 2 context_check(ctx, u32 *, void **) sets *u32 0, slot 3
 * answers 0 (ZLUDA: "bits that are never observably set"). ---- */
static CUresult ctx_check(CUcontext ctx, uint32_t *r1, const void **r2)
{
    (void)ctx; (void)r2;
    if (r1) *r1 = 0;
    return CUDA_SUCCESS;
}
static uint32_t ctx_check3(void) { return 0; }

/* ---- 21318c60 (cuBLAS calls slot 4): with its out pointer NULL, the 550 driver answers
 * CUDA_ERROR_UNKNOWN; otherwise it zeroes *out and, for an object it does not know, answers
 * CUDA_SUCCESS: fakecuda knows none, so that is its answer. ---- */
static CUresult cublas_slot4(const void *obj, uint64_t *out)
{
    (void)obj;
    if (!out) return CUDA_ERROR_UNKNOWN;
    *out = 0;
    return CUDA_SUCCESS;
}

/* ---- the tables ---- */
static const void *fc_tables[T_COUNT][FC_MAX_SLOTS];
static pthread_once_t fc_tables_once = PTHREAD_ONCE_INIT;
static const void *modelled_slot(int t, int i);

static void build_tables(void)
{
    for (int t = 0; t < T_COUNT; t++) {
        int n = table_slots(t, fc_cfg.driver_version);
        for (int i = 0; i < n; i++) {
            const void *f = modelled_slot(t, i);
            fc_tables[t][i] = f ? f : fc_stubs[t][i];
        }
        if (t == T_CUDART) fc_tables[t][10] = NULL; /* NULL in both drivers' CUDART_INTERFACE */
        if (n && fc_table_ids[t].has_size) fc_tables[t][0] = (const void *)(uintptr_t)(n * sizeof(void *));
        else if (n) fc_tables[t][n - 1] = NULL; /* context-local storage ends with NULL (550) */
    }
}

CUresult fc_cls_put(CUcontext c, void *key, void *value, void (*dtor)(CUcontext, void *, void *));
CUresult fc_cls_delete(CUcontext c, void *key);
CUresult fc_cls_get(void **value, CUcontext c, void *key);
CUresult fc_integrity_check(unsigned version, uint64_t unix_seconds, uint64_t result[2]);

static const void *modelled_slot(int t, int i)
{
#define S(tt, ii, fn) if (t == (tt) && i == (ii)) return (const void *)&(fn);
    S(T_CUDART, 1, cudart_module_from_wrapper) S(T_CUDART, 2, cudart_primary_ctx)
    S(T_CUDART, 6, cudart_module_from_wrapper_ext) S(T_CUDART, 7, cudart_slot7)
    S(T_CUDART, 8, cudart_module_from_fatbin) S(T_CUDART, 12, cudart_load_compilers)
    S(T_TOOLS_HOOKS, 2, tools_buffer1) S(T_TOOLS_HOOKS, 6, tools_buffer2)
    S(T_TOOLS_TLS, 2, tools_tls_top)
    S(T_CLS, 0, fc_cls_put) S(T_CLS, 1, fc_cls_delete) S(T_CLS, 2, fc_cls_get)
    S(T_CTX_CHECKS, 2, ctx_check) S(T_CTX_CHECKS, 3, ctx_check3)
    S(T_INTEGRITY, 1, fc_integrity_check)
    S(T_CUBLAS_21318C60, 4, cublas_slot4)
#undef S
    return NULL;
}

/* The integrity check's inputs name two tables and its own function (integrity.c). */
const void *fc_export_table(int which) { pthread_once(&fc_tables_once, build_tables); return fc_tables[which]; }
const void *fc_integrity_table(void) { return fc_export_table(T_INTEGRITY); }
const void *fc_cudart_table(void) { return fc_export_table(T_CUDART); }

static void uuid_text(const CUuuid *id, char out[37])
{
    const unsigned char *b = (const unsigned char *)id->bytes;
    snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
             b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

/* Answered before cuInit, as both drivers do; a NULL argument or an unknown id:
 * CUDA_ERROR_INVALID_VALUE with *ppExportTable NULL (both drivers). */
FC_EXPORT CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
    FC_ENTRY_NOINIT(cuGetExportTable, 3000);
    if (!ppExportTable) return CUDA_ERROR_INVALID_VALUE;
    *ppExportTable = NULL;
    if (!pExportTableId) return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&fc_tables_once, build_tables);
    char text[37];
    uuid_text(pExportTableId, text);
    for (int t = 0; t < T_COUNT; t++) {
        if (strcmp(text, fc_table_ids[t].uuid) != 0) continue;
        if (!table_slots(t, fc_cfg.driver_version)) break;
        *ppExportTable = fc_tables[t];
        return CUDA_SUCCESS;
    }
    fc_not_found(FC_NF_TABLE, text);
    return CUDA_ERROR_INVALID_VALUE;
}
FC_ALIAS(cuGetExportTable);
