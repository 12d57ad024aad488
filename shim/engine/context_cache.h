/* context_cache.h: the context a launch's stream belongs to, remembered per thread, so a
 * launch asks the driver (cuStreamGetCtx, or cuCtxGetCurrent) only when something may have
 * changed the answer. The default streams' context is the calling thread's current one;
 * another stream's is fixed at its creation, but a destroyed stream's handle may be reused
 * by a stream of another context. So every entry point that changes a thread's current
 * context, or destroys a stream or a context, forgets every thread's answers
 * (hooks_context.c), as does the residency safety net's epoch of launches (residency.h). */
#ifndef PUMP_CONTEXT_CACHE_H
#define PUMP_CONTEXT_CACHE_H

#include "shim.h"

/* The context `stream` belongs to, or NULL when the driver names none. */
PUMP_HIDDEN CUcontext pump_stream_context(CUstream stream);

/* Around a driver call that may change the answers: no answer is remembered from begin to
 * end, and every earlier one is forgotten at the end. */
PUMP_HIDDEN void pump_context_change_begin(void);
PUMP_HIDDEN void pump_context_change_end(void);

#endif
