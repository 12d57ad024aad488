/* green_contexts.c: why it exists: the CUDA 13.2 runtime looks up the green-context counterparts
 * of the context calls at start (its execution-context API: cuGreenCtxGetId,
 * cuGreenCtxGetDevResource, cuGreenCtxRecordEvent, cuGreenCtxWaitEvent) and cuDNN 9.26 looks up
 * cuStreamGetGreenCtx (stream_queries.c). fakecuda makes no green context (cuGreenCtxCreate,
 * cuDevResourceGenerateDesc and the SM splits are not modelled: the real client's ledger names
 * them), so no CUgreenCtx a caller holds is one: each call on one answers CUDA_ERROR_INVALID_CONTEXT
 * (cuda.h lists it for all four), NULL included (cuGreenCtxGetId's NULL means the current context
 * "set to a green context", which no context here is). Checked after initialisation, as every
 * entry point is (FC_ENTRY). */
#include "fakecuda_internal.h"

FC_DEF(cuGreenCtxGetId, 12090, (CUgreenCtx greenCtx, unsigned long long *greenCtxId),
       ((void)greenCtx, (void)greenCtxId, CUDA_ERROR_INVALID_CONTEXT));
FC_DEF(cuGreenCtxGetDevResource, 12040, (CUgreenCtx hCtx, CUdevResource *resource, CUdevResourceType type),
       ((void)hCtx, (void)resource, (void)type, CUDA_ERROR_INVALID_CONTEXT));
FC_DEF(cuGreenCtxRecordEvent, 12040, (CUgreenCtx hCtx, CUevent hEvent),
       ((void)hCtx, (void)hEvent, CUDA_ERROR_INVALID_CONTEXT));
FC_DEF(cuGreenCtxWaitEvent, 12040, (CUgreenCtx hCtx, CUevent hEvent),
       ((void)hCtx, (void)hEvent, CUDA_ERROR_INVALID_CONTEXT));
