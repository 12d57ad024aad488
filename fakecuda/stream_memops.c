/* stream_memops.c: why it exists: the stream memory operations cuBLAS links by name
 * (cuStreamWaitValue32, cuStreamWriteValue32, cuStreamBatchMemOp, CUDA 11.7's _v2 ABI and the
 * 8.0 one) and the 2D asynchronous copy (cuMemcpy2DAsync_v2). Each is an operation in stream
 * order, run by the stream's worker as a host function is (streams.c): a wait spins until its
 * condition holds, as the GPU's front end does (a value never written hangs the stream, as it
 * would on a GPU); a write stores its value. Memory is plain host memory here, so the address
 * is read and written directly. Costs: a memory operation is charged as a launch (no trace has
 * them; FAKECUDA_LAUNCH_HOST_NS), a 2D copy as one memcpy (FAKECUDA_MEMCPY_HOST_NS). A 2D copy
 * moves its rows in stream order; it does not touch managed pages' residency (not modelled). */
#include "fakecuda_internal.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

extern __typeof__(cuLaunchHostFunc) fcl_cuLaunchHostFunc __attribute__((visibility("hidden")));
extern __typeof__(cuLaunchHostFunc_ptsz) fcl_cuLaunchHostFunc_ptsz __attribute__((visibility("hidden")));

typedef struct { int write, bits64; uintptr_t addr; uint64_t value; unsigned flags; } fc_memop;

static int wait_done(const fc_memop *m)
{
    uint64_t v = m->bits64 ? __atomic_load_n((uint64_t *)m->addr, __ATOMIC_ACQUIRE)
                           : __atomic_load_n((uint32_t *)m->addr, __ATOMIC_ACQUIRE);
    switch (m->flags & 0x3) { /* CU_STREAM_WAIT_VALUE_GEQ 0, EQ 1, AND 2, NOR 3 (cuda.h) */
    case CU_STREAM_WAIT_VALUE_GEQ: return m->bits64 ? (int64_t)(v - m->value) >= 0 : (int32_t)((uint32_t)v - (uint32_t)m->value) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return v == m->value;
    case CU_STREAM_WAIT_VALUE_AND: return (v & m->value) != 0;
    default: return ~(v | m->value) != 0 && (m->bits64 ? ~(v | m->value) : (uint32_t)~(v | m->value)) != 0;
    }
}

static void run_memop(void *ud)
{
    fc_memop *m = ud;
    if (m->write) {
        if (m->bits64) __atomic_store_n((uint64_t *)m->addr, m->value, __ATOMIC_RELEASE);
        else __atomic_store_n((uint32_t *)m->addr, (uint32_t)m->value, __ATOMIC_RELEASE);
    } else {
        while (!wait_done(m)) sched_yield();
    }
    free(m);
}

/* cuda.h: the address must be device-accessible memory (here: memory an allocation covers)
 * aligned to the value's size; flags only the wait's or write's documented ones. */
static CUresult enqueue(CUstream s, const fc_memop *op)
{
    size_t n = op->bits64 ? 8 : 4;
    if (!op->addr || op->addr % n || fc_mem_kind(op->addr, n) == FC_MEM_HOST) return CUDA_ERROR_INVALID_VALUE;
    fc_memop *m = malloc(sizeof *m);
    if (!m) return CUDA_ERROR_OUT_OF_MEMORY;
    *m = *op;
    fc_cost(FC_E_LAUNCH, FAKECUDA_LAUNCH_HOST_NS);
    CUresult r = fc_tls_ptsz ? fcl_cuLaunchHostFunc_ptsz(s, run_memop, m) : fcl_cuLaunchHostFunc(s, run_memop, m);
    if (r != CUDA_SUCCESS) free(m);
    return r;
}

static CUresult wait_value(CUstream s, CUdeviceptr addr, uint64_t value, unsigned flags, int bits64)
{
    if (flags & ~(unsigned)(0x3 | CU_STREAM_WAIT_VALUE_FLUSH)) return CUDA_ERROR_INVALID_VALUE;
    fc_memop m = {0, bits64, (uintptr_t)addr, value, flags};
    return enqueue(s, &m);
}
static CUresult write_value(CUstream s, CUdeviceptr addr, uint64_t value, unsigned flags, int bits64)
{
    if (flags & ~(unsigned)CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER) return CUDA_ERROR_INVALID_VALUE;
    fc_memop m = {1, bits64, (uintptr_t)addr, value, flags};
    return enqueue(s, &m);
}
/* The 8.0 (64-bit: 9.0) ABI and 11.7's _v2, each with its _ptsz twin: the drivers answer both
 * (tests/test_real_libcuda.py), with the same arguments. */
#define FC_VALUE_OPS(suffix, ver32, ver64)                                                                           \
    FC_DEF(cuStreamWaitValue32##suffix, ver32, (CUstream s, CUdeviceptr a, cuuint32_t v, unsigned int f), wait_value(s, a, v, f, 0)); \
    FC_DEF(cuStreamWaitValue64##suffix, ver64, (CUstream s, CUdeviceptr a, cuuint64_t v, unsigned int f), wait_value(s, a, v, f, 1)); \
    FC_DEF(cuStreamWriteValue32##suffix, ver32, (CUstream s, CUdeviceptr a, cuuint32_t v, unsigned int f), write_value(s, a, v, f, 0)); \
    FC_DEF(cuStreamWriteValue64##suffix, ver64, (CUstream s, CUdeviceptr a, cuuint64_t v, unsigned int f), write_value(s, a, v, f, 1));
FC_VALUE_OPS(, 8000, 9000)
FC_VALUE_OPS(_ptsz, 8000, 9000)
FC_VALUE_OPS(_v2, 11070, 11070)
FC_VALUE_OPS(_v2_ptsz, 11070, 11070)

/* cuda.h: count at most 256 operations, each a wait or a write of 32 or 64 bits (the flush and
 * barrier operations are accepted and do nothing here); flags 0. */
static CUresult batch(CUstream s, unsigned count, CUstreamBatchMemOpParams *ops, unsigned flags)
{
    if (!ops || count == 0 || count > 256 || flags) return CUDA_ERROR_INVALID_VALUE;
    for (unsigned i = 0; i < count; i++) {
        CUstreamBatchMemOpParams *o = &ops[i];
        CUresult r;
        switch (o->operation) {
        case CU_STREAM_MEM_OP_WAIT_VALUE_32: case CU_STREAM_MEM_OP_WAIT_VALUE_64:
            r = wait_value(s, o->waitValue.address, o->operation == CU_STREAM_MEM_OP_WAIT_VALUE_64 ? o->waitValue.value64 : o->waitValue.value,
                           o->waitValue.flags, o->operation == CU_STREAM_MEM_OP_WAIT_VALUE_64);
            break;
        case CU_STREAM_MEM_OP_WRITE_VALUE_32: case CU_STREAM_MEM_OP_WRITE_VALUE_64:
            r = write_value(s, o->writeValue.address, o->operation == CU_STREAM_MEM_OP_WRITE_VALUE_64 ? o->writeValue.value64 : o->writeValue.value,
                            o->writeValue.flags, o->operation == CU_STREAM_MEM_OP_WRITE_VALUE_64);
            break;
        case CU_STREAM_MEM_OP_FLUSH_REMOTE_WRITES: case CU_STREAM_MEM_OP_BARRIER: r = CUDA_SUCCESS; break;
        default: r = CUDA_ERROR_INVALID_VALUE;
        }
        if (r != CUDA_SUCCESS) return r;
    }
    return CUDA_SUCCESS;
}
FC_DEF(cuStreamBatchMemOp, 8000, (CUstream s, unsigned int count, CUstreamBatchMemOpParams *p, unsigned int flags),
       batch(s, count, p, flags));
FC_DEF(cuStreamBatchMemOp_ptsz, 8000, (CUstream s, unsigned int count, CUstreamBatchMemOpParams *p, unsigned int flags),
       batch(s, count, p, flags));
FC_DEF(cuStreamBatchMemOp_v2, 11070, (CUstream s, unsigned int count, CUstreamBatchMemOpParams *p, unsigned int flags),
       batch(s, count, p, flags));
FC_DEF(cuStreamBatchMemOp_v2_ptsz, 11070, (CUstream s, unsigned int count, CUstreamBatchMemOpParams *p, unsigned int flags),
       batch(s, count, p, flags));

/* ---- 2D copies: host and device (and unified) memory, which are all host memory here; arrays
 * are not modelled (CUDA_ERROR_NOT_SUPPORTED). cuda.h: WidthInBytes at most each pitch. ---- */
typedef struct { CUDA_MEMCPY2D c; } fc_copy2d;
static uintptr_t side(CUmemorytype t, const void *host, CUdeviceptr dev)
{
    return t == CU_MEMORYTYPE_HOST ? (uintptr_t)host : (uintptr_t)dev;
}
static void run_copy2d(void *ud)
{
    fc_copy2d *k = ud;
    const CUDA_MEMCPY2D *c = &k->c;
    uintptr_t src = side(c->srcMemoryType, c->srcHost, c->srcDevice) + c->srcY * c->srcPitch + c->srcXInBytes;
    uintptr_t dst = side(c->dstMemoryType, c->dstHost, c->dstDevice) + c->dstY * c->dstPitch + c->dstXInBytes;
    for (size_t row = 0; row < c->Height; row++)
        memmove((void *)(dst + row * c->dstPitch), (const void *)(src + row * c->srcPitch), c->WidthInBytes);
    free(k);
}
static CUresult copy2d(const CUDA_MEMCPY2D *c, CUstream s)
{
    if (!c) return CUDA_ERROR_INVALID_VALUE;
    if (c->srcMemoryType == CU_MEMORYTYPE_ARRAY || c->dstMemoryType == CU_MEMORYTYPE_ARRAY) return CUDA_ERROR_NOT_SUPPORTED;
    if (c->Height && ((c->Height > 1 && (c->WidthInBytes + c->srcXInBytes > c->srcPitch ||
                                         c->WidthInBytes + c->dstXInBytes > c->dstPitch)) ||
                      !side(c->srcMemoryType, c->srcHost, c->srcDevice) || !side(c->dstMemoryType, c->dstHost, c->dstDevice)))
        return CUDA_ERROR_INVALID_VALUE;
    fc_copy2d *k = malloc(sizeof *k);
    if (!k) return CUDA_ERROR_OUT_OF_MEMORY;
    k->c = *c;
    fc_cost(FC_E_MEMCPY, FAKECUDA_MEMCPY_HOST_NS);
    CUresult r = fc_tls_ptsz ? fcl_cuLaunchHostFunc_ptsz(s, run_copy2d, k) : fcl_cuLaunchHostFunc(s, run_copy2d, k);
    if (r != CUDA_SUCCESS) free(k);
    return r;
}
FC_DEF(cuMemcpy2DAsync_v2, 3020, (const CUDA_MEMCPY2D *c, CUstream s), copy2d(c, s));
FC_DEF(cuMemcpy2DAsync_v2_ptsz, 7000, (const CUDA_MEMCPY2D *c, CUstream s), copy2d(c, s));
