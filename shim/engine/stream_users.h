/* stream_users.h: which streams may still use memory that pump's allocator for PyTorch
 * (torch_allocator.c) is asked to free, and whether a dead tensor may be discarded. */
#ifndef PUMP_STREAM_USERS_H
#define PUMP_STREAM_USERS_H

#include "ranges.h"

/* From now on, note the streams of launches (pump's allocator handed out its first tensor:
 * no earlier launch can name one). */
PUMP_HIDDEN void pump_stream_users_start(void);
/* A kernel launch on `stream` named ranges[0 .. n) (a graph replay: n = 0). */
PUMP_HIDDEN void pump_stream_users_note(CUstream stream, struct pump_range *const *ranges, uint32_t n);
/* The program destroys `stream`: pump names it no more. */
PUMP_HIDDEN void pump_stream_users_forget(CUstream stream);
/* Before memory dies on `stream`: makes `stream` wait (on the GPU, never the host) for all
 * that every other stream pump saw a launch on has been given so far. True when the memory
 * at `range` may also be discarded there: a launch named it, and pump saw no launch on any
 * other stream and made every wait it needed (see stream_users.c for what pump cannot see). */
PUMP_HIDDEN bool pump_stream_users_order_free(CUstream stream, const struct pump_range *range);

#endif
