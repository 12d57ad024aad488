/* captures.h: whether any stream of the process may be being captured into a graph, so that
 * a launch asks the driver about its stream only while a capture is open (prefetch.h,
 * pump_stream_capturing). pump adds nothing to a capturing stream; asked at every launch
 * under a budget, that query was a driver call per launch on the launching thread, in jobs
 * that capture nothing or once. The hooks of every way to begin and end a capture
 * (hooks_capture.c) keep the count; a way to begin one that passes pump by turns it off. */
#ifndef PUMP_CAPTURES_H
#define PUMP_CAPTURES_H

#include "shim.h"

/* Before the driver is asked to begin a capture (raised first: a launch on another thread
 * never misses it); pump_captures_ended() when it refused. */
PUMP_HIDDEN void pump_captures_begun(void);
/* A capture ended (the driver ended it, or refused to begin it). */
PUMP_HIDDEN void pump_captures_ended(void);
/* A capture may begin where pump does not see it (`why` says how): from now on, every
 * launch asks. Says so once. */
PUMP_HIDDEN void pump_captures_untracked(const char *why);
/* True when no stream of the process can be being captured now. */
PUMP_HIDDEN bool pump_captures_none(void);
/* Whether `symbol` names a way to begin a capture (cuStreamBeginCapture*,
 * cuStreamBeginRecapture*, any version or stream flavour). */
PUMP_HIDDEN bool pump_captures_begin_name(const char *symbol);

#endif
