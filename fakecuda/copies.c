/* copies.c: why it exists: the cuMemcpy and cuMemsetD8/D16/D32 families, synchronous and
 * async (with their _ptds/_ptsz forms), on plain and managed memory. Each is an operation on
 * its stream (the legacy or the per-thread default stream for the synchronous forms, which
 * then wait for it). A managed operand accessed from the device side (the device operand of
 * an HtoD/DtoH/DtoD copy, either operand of cuMemcpy/cuMemcpyAsync that is managed memory,
 * which unified addressing tells apart, and the target of a memset) is touched by the stream's
 * device as a kernel touches it: pages not on that device fault and migrate there, counted
 * as GPU faults ("Unified Memory ... pages migrate on demand to the accessing processor",
 * CUDA C++ Programming Guide, Unified Memory Programming); a managed operand on the host side
 * of an HtoD or DtoH copy is read or written by the host, so its pages come back to the host
 * as a CPU access brings them. Each call charges its host time (cost.c). */
#include "fakecuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SIDE_HOST, SIDE_DEVICE, SIDE_BY_ADDRESS }; /* what the call says an operand is */
enum { TOUCH_NONE, TOUCH_DEVICE, TOUCH_HOST };

/* How the stream touches an operand, or -1 when it is not valid for its side. */
static int operand_touch(uintptr_t p, size_t n, int side)
{
    int kind = fc_mem_kind(p, n);
    if (kind < 0) return -1;
    if (side == SIDE_DEVICE && kind == FC_MEM_HOST) return -1; /* not device memory */
    if (kind != FC_MEM_MANAGED) return TOUCH_NONE;
    return side == SIDE_HOST ? TOUCH_HOST : TOUCH_DEVICE;
}

static void touch(uintptr_t p, size_t n, int how)
{
    if (how == TOUCH_DEVICE) fakecuda_touch((const void *)p, n);
    else if (how == TOUCH_HOST) fakecuda_host_touch((const void *)p, n);
}

/* [p, p+n) lies in one page-locked host range (host_memory.c). */
static int pinned(uintptr_t p, size_t n)
{
    fc_alloc_desc d;
    return fc_host_lookup(p, &d) && p + n <= d.base + d.size;
}

/* A memcpy node runs whenever its graph is launched, and reads or writes its host operand then
 * (cuda.h, cuGraphAddMemcpyNode: "When the graph is launched, the node will perform the
 * memcpy"). The host memory it was captured with has been freed or unregistered since: on the
 * driver, a DMA from memory no longer locked (undefined: stale pages or an IOMMU fault); here
 * the process stops, naming it, so that no test passes over it. */
static void check_still_pinned(const fc_copy *c, size_t bytes)
{
    int lost = (c->pinned & FC_PINNED_DST && !pinned(c->dst, bytes)) ||
               (c->pinned & FC_PINNED_SRC && !pinned(c->src, bytes));
    if (!lost) return;
    fprintf(stderr, "fakecuda: a captured copy ran after its page-locked host memory (%#lx, %zu bytes) was freed or "
            "unregistered: undefined on the driver\n",
            (unsigned long)(c->pinned & FC_PINNED_SRC ? c->src : c->dst), bytes);
    abort();
}

void fc_run_copy(const fc_op *op, int device)
{
    uintptr_t dst = op->u.copy.dst, src = op->u.copy.src;
    unsigned elem = op->u.copy.elem, v = op->u.copy.value;
    size_t n = op->u.copy.n, bytes = elem ? n * elem : n;
    if (op->u.copy.pinned) check_still_pinned(&op->u.copy, bytes);
    fc_tls_kernel_device = device;
    if (!elem && op->u.copy.src_dev != TOUCH_NONE) fc_pages_read(src, bytes);
    if (!elem) touch(src, bytes, op->u.copy.src_dev);
    touch(dst, bytes, op->u.copy.dst_dev);
    fc_tls_kernel_device = -1;
    if (!elem) memmove((void *)dst, (const void *)src, bytes);
    else if (elem == 1) memset((void *)dst, (int)(v & 0xff), n);
    else if (elem == 2) for (size_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = (uint16_t)v;
    else for (size_t i = 0; i < n; i++) ((uint32_t *)dst)[i] = v;
    fc_pay_debt(0); /* the copy ends once its faults are serviced */
}

/* A copy (elem 0: n bytes from src) or a memset (n elements of elem bytes of value) on stream
 * h; sync: the call returns when it has run. */
static CUresult enqueue_copy(uintptr_t dst, int dst_side, uintptr_t src, int src_side, size_t n, unsigned elem,
                             unsigned value, CUstream h, int sync)
{
    fc_cost(elem ? FC_E_MEMSET : FC_E_MEMCPY, elem ? FAKECUDA_MEMSET_HOST_NS : FAKECUDA_MEMCPY_HOST_NS);
    size_t bytes = elem ? n * elem : n;
    if (elem && bytes / elem != n) return CUDA_ERROR_INVALID_VALUE;
    if (dst + bytes < dst || (!elem && src + bytes < src)) return CUDA_ERROR_INVALID_VALUE;
    int dst_touch = operand_touch(dst, bytes, dst_side);
    int src_touch = elem ? TOUCH_NONE : operand_touch(src, bytes, src_side);
    if (dst_touch < 0 || src_touch < 0) return CUDA_ERROR_INVALID_VALUE;
    CUresult err = CUDA_SUCCESS;
    CUstream s = fc_resolve_stream(h, &err);
    if (!s) return err;
    fc_copy copy = { dst, src, n, elem, value, dst_touch, src_touch, 0 };
    if (fc_stream_capturing(s)) {
        /* An async copy or memset becomes a memcpy or memset node (cuda.h, cuStreamBeginCapture:
         * operations pushed into a capturing stream "will not be executed, but will instead be
         * captured into a graph"; cuBLASLt clears its workspace with cuMemsetD8Async inside
         * PyTorch's captures), which runs, reading its source, at each launch of the graph. What
         * the capture refuses, invalidating it (CUDA Programming Guide, stream capture,
         * "Prohibited and Unhandled Operations": synchronous APIs, which use the legacy stream,
         * and synchronising a capturing stream are invalid): a synchronous form; a copy between
         * two host operands ("fully synchronous with respect to the host", CUDA Driver API, API
         * synchronization behavior, Memcpy, Asynchronous 2); and a copy with a pageable host
         * operand ("If pageable memory must first be staged to pinned memory, the driver may
         * synchronize with the stream", item 3: "may", taken as will, the stricter side; PyTorch
         * refuses it itself: "Cannot copy between CPU and CUDA tensors during CUDA graph capture
         * unless the CPU tensor is pinned"). A page-locked host operand (cuMemHostAlloc,
         * cuMemHostRegister; "For all other transfers, the function should be fully
         * asynchronous", item 4) is captured: clip_grad_norm_ copies from one in PyTorch 2.15. */
        int host_dst = fc_mem_kind(dst, bytes) == FC_MEM_HOST, host_src = !elem && fc_mem_kind(src, bytes) == FC_MEM_HOST;
        copy.pinned = (host_dst && pinned(dst, bytes) ? FC_PINNED_DST : 0) |
                      (host_src && pinned(src, bytes) ? FC_PINNED_SRC : 0);
        int pageable = (host_dst && !(copy.pinned & FC_PINNED_DST)) || (host_src && !(copy.pinned & FC_PINNED_SRC));
        if (sync || (host_dst && host_src) || pageable) {
            fc_capture_invalidate(s);
            return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
        int r = bytes == 0 ? CUDA_SUCCESS : fc_capture_add_copy(s, &copy);
        if (r != FC_NOT_CAPTURING) return (CUresult)r; /* else the capture just ended: run it */
    }
    if (bytes == 0) return CUDA_SUCCESS;
    fc_op *op = calloc(1, sizeof *op);
    if (!op) return CUDA_ERROR_OUT_OF_MEMORY;
    op->kind = FC_OP_COPY;
    op->u.copy = copy;
    fc_enqueue(s, op);
    if (sync) fc_stream_wait_idle(s);
    return CUDA_SUCCESS;
}

#define P(x) ((uintptr_t)(x))
/* copies: (name, version, params, dst, dst side, src, src side, n, stream, sync) */
#define FC_COPY(name, ver, params, dst, dside, src, sside, n, h, sync) \
    FC_DEF(name, ver, params, enqueue_copy(P(dst), dside, P(src), sside, n, 0, 0, h, sync))
FC_COPY(cuMemcpy, 4000, (CUdeviceptr dst, CUdeviceptr src, size_t n), dst, SIDE_BY_ADDRESS, src, SIDE_BY_ADDRESS, n,
        NULL, 1);
FC_COPY(cuMemcpy_ptds, 7000, (CUdeviceptr dst, CUdeviceptr src, size_t n), dst, SIDE_BY_ADDRESS, src,
        SIDE_BY_ADDRESS, n, NULL, 1);
FC_COPY(cuMemcpyAsync, 4000, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h), dst, SIDE_BY_ADDRESS, src,
        SIDE_BY_ADDRESS, n, h, 0);
FC_COPY(cuMemcpyAsync_ptsz, 7000, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h), dst, SIDE_BY_ADDRESS,
        src, SIDE_BY_ADDRESS, n, h, 0);
FC_COPY(cuMemcpyHtoD_v2, 3020, (CUdeviceptr dst, const void *src, size_t n), dst, SIDE_DEVICE, src, SIDE_HOST, n,
        NULL, 1);
FC_COPY(cuMemcpyHtoD_v2_ptds, 7000, (CUdeviceptr dst, const void *src, size_t n), dst, SIDE_DEVICE, src, SIDE_HOST,
        n, NULL, 1);
FC_COPY(cuMemcpyDtoH_v2, 3020, (void *dst, CUdeviceptr src, size_t n), dst, SIDE_HOST, src, SIDE_DEVICE, n, NULL, 1);
FC_COPY(cuMemcpyDtoH_v2_ptds, 7000, (void *dst, CUdeviceptr src, size_t n), dst, SIDE_HOST, src, SIDE_DEVICE, n,
        NULL, 1);
FC_COPY(cuMemcpyDtoD_v2, 3020, (CUdeviceptr dst, CUdeviceptr src, size_t n), dst, SIDE_DEVICE, src, SIDE_DEVICE, n,
        NULL, 1);
FC_COPY(cuMemcpyDtoD_v2_ptds, 7000, (CUdeviceptr dst, CUdeviceptr src, size_t n), dst, SIDE_DEVICE, src,
        SIDE_DEVICE, n, NULL, 1);
FC_COPY(cuMemcpyHtoDAsync_v2, 3020, (CUdeviceptr dst, const void *src, size_t n, CUstream h), dst, SIDE_DEVICE, src,
        SIDE_HOST, n, h, 0);
FC_COPY(cuMemcpyHtoDAsync_v2_ptsz, 7000, (CUdeviceptr dst, const void *src, size_t n, CUstream h), dst, SIDE_DEVICE,
        src, SIDE_HOST, n, h, 0);
FC_COPY(cuMemcpyDtoHAsync_v2, 3020, (void *dst, CUdeviceptr src, size_t n, CUstream h), dst, SIDE_HOST, src,
        SIDE_DEVICE, n, h, 0);
FC_COPY(cuMemcpyDtoHAsync_v2_ptsz, 7000, (void *dst, CUdeviceptr src, size_t n, CUstream h), dst, SIDE_HOST, src,
        SIDE_DEVICE, n, h, 0);
FC_COPY(cuMemcpyDtoDAsync_v2, 3020, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h), dst, SIDE_DEVICE, src,
        SIDE_DEVICE, n, h, 0);
FC_COPY(cuMemcpyDtoDAsync_v2_ptsz, 7000, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h), dst, SIDE_DEVICE,
        src, SIDE_DEVICE, n, h, 0);

/* memsets: (name, version, value type, element bytes, stream parameter or nothing, stream, sync) */
#define FC_MEMSET(name, ver, type, elem, h, sync, ...) \
    FC_DEF(name, ver, (CUdeviceptr dst, type value, size_t n __VA_ARGS__), \
           enqueue_copy(P(dst), SIDE_DEVICE, 0, SIDE_HOST, n, elem, value, h, sync))
FC_MEMSET(cuMemsetD8_v2, 3020, unsigned char, 1, NULL, 1);
FC_MEMSET(cuMemsetD8_v2_ptds, 7000, unsigned char, 1, NULL, 1);
FC_MEMSET(cuMemsetD16_v2, 3020, unsigned short, 2, NULL, 1);
FC_MEMSET(cuMemsetD16_v2_ptds, 7000, unsigned short, 2, NULL, 1);
FC_MEMSET(cuMemsetD32_v2, 3020, unsigned int, 4, NULL, 1);
FC_MEMSET(cuMemsetD32_v2_ptds, 7000, unsigned int, 4, NULL, 1);
FC_MEMSET(cuMemsetD8Async, 3020, unsigned char, 1, h, 0, , CUstream h);
FC_MEMSET(cuMemsetD8Async_ptsz, 7000, unsigned char, 1, h, 0, , CUstream h);
FC_MEMSET(cuMemsetD16Async, 3020, unsigned short, 2, h, 0, , CUstream h);
FC_MEMSET(cuMemsetD16Async_ptsz, 7000, unsigned short, 2, h, 0, , CUstream h);
FC_MEMSET(cuMemsetD32Async, 3020, unsigned int, 4, h, 0, , CUstream h);
FC_MEMSET(cuMemsetD32Async_ptsz, 7000, unsigned int, 4, h, 0, , CUstream h);
