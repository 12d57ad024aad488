/* stream_queries.c: why it exists: what a stream says about itself (cuStreamGetCtx and its
 * _v2 with the green context, cuStreamGetGreenCtx, cuStreamGetDevice, flags, priority, id), apart
 * from the streams' work (streams.c). Semantics from cuda.h; the context queries charged as such. */
#include "fakecuda_internal.h"

static CUresult stream_get_ctx(CUstream h, CUcontext *pctx, CUgreenCtx *pgreen)
{
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    FC_STREAM_OR_RETURN(h);
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    *pctx = s->ctx;
    if (pgreen) *pgreen = NULL;
    return CUDA_SUCCESS;
}
FC_DEF(cuStreamGetCtx, 9020, (CUstream hStream, CUcontext *pctx), stream_get_ctx(hStream, pctx, NULL));
FC_DEF(cuStreamGetCtx_ptsz, 9020, (CUstream hStream, CUcontext *pctx), stream_get_ctx(hStream, pctx, NULL));
FC_DEF(cuStreamGetCtx_v2, 12050, (CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx),
       stream_get_ctx(hStream, pCtx, pGreenCtx));
FC_DEF(cuStreamGetCtx_v2_ptsz, 12050, (CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx),
       stream_get_ctx(hStream, pCtx, pGreenCtx));

/* cuda.h, cuStreamGetGreenCtx: the green context a stream was made in, or "*phCtx is set to NULL"
 * for one made in a regular context, the NULL and legacy streams alike: every stream here (no
 * green context exists: green_contexts.c). cuDNN 9.26 looks it up with dlsym. */
static CUresult stream_get_green_ctx(CUstream h, CUgreenCtx *phCtx)
{
    if (!phCtx) return CUDA_ERROR_INVALID_VALUE;
    FC_STREAM_OR_RETURN(h);
    (void)s;
    fc_cost(FC_E_CONTEXT_QUERY, FAKECUDA_CONTEXT_QUERY_HOST_NS);
    *phCtx = NULL;
    return CUDA_SUCCESS;
}
FC_DEF(cuStreamGetGreenCtx, 12040, (CUstream hStream, CUgreenCtx *phCtx), stream_get_green_ctx(hStream, phCtx));

static CUresult stream_get_device(CUstream h, CUdevice *dev)
{
    if (!dev) return CUDA_ERROR_INVALID_VALUE;
    FC_STREAM_OR_RETURN(h);
    *dev = s->device;
    return CUDA_SUCCESS;
}
FC_DEF(cuStreamGetDevice, 12080, (CUstream hStream, CUdevice *device), stream_get_device(hStream, device));
FC_DEF(cuStreamGetDevice_ptsz, 12080, (CUstream hStream, CUdevice *device), stream_get_device(hStream, device));

static CUresult stream_get_flags(CUstream h, unsigned *flags, int *prio, unsigned long long *id)
{
    if (!flags && !prio && !id) return CUDA_ERROR_INVALID_VALUE;
    FC_STREAM_OR_RETURN(h);
    if (flags) *flags = s->flags;
    if (prio) *prio = s->priority;
    if (id) *id = s->id;
    return CUDA_SUCCESS;
}
FC_DEF(cuStreamGetFlags, 5050, (CUstream hStream, unsigned int *flags),
       stream_get_flags(hStream, flags, NULL, NULL));
FC_DEF(cuStreamGetFlags_ptsz, 7000, (CUstream hStream, unsigned int *flags),
       stream_get_flags(hStream, flags, NULL, NULL));
FC_DEF(cuStreamGetPriority, 5050, (CUstream hStream, int *priority),
       stream_get_flags(hStream, NULL, priority, NULL));
FC_DEF(cuStreamGetPriority_ptsz, 7000, (CUstream hStream, int *priority),
       stream_get_flags(hStream, NULL, priority, NULL));
FC_DEF(cuStreamGetId, 12000, (CUstream hStream, unsigned long long *streamId),
       stream_get_flags(hStream, NULL, NULL, streamId));
FC_DEF(cuStreamGetId_ptsz, 12000, (CUstream hStream, unsigned long long *streamId),
       stream_get_flags(hStream, NULL, NULL, streamId));
