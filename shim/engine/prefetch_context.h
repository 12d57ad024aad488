/* prefetch_context.h: the migration engine's per-context slot, shared by the files of the
 * engine that keep its event rings: prefetch.c (streams, prefetch and use events) and
 * discard_marks.c (discard marks). Not for the rest of the shim, which sees struct
 * pump_context only through prefetch.h. */
#ifndef PUMP_PREFETCH_CONTEXT_H
#define PUMP_PREFETCH_CONTEXT_H

#include <pthread.h>

#include "kernel_time.h"
#include "link_rate.h"
#include "prefetch_worker.h"
#include "shim.h"

#define PUMP_CONTEXTS_MAX 64
#define PUMP_EVENTS_PER_CONTEXT 64   /* prefetch events, recycled in turn; see pump_prefetch_wait */
#define PUMP_USE_EVENTS 1024         /* use events per context (a power of two) */
#define PUMP_DISCARD_MARKS 256       /* discard marks per context */

/* A use slot: a launching thread waits on and records its event, or pump's worker readies it. */
enum { USE_FREE, USE_RECORDING, USE_READYING };


/* A ring of events, made on its first use. */
struct ring {
    bool ready, broken;  /* made; or, for good, not makeable (logged once per context) */
    bool making;         /* a thread is making its events, outside use_lock */
};

struct pump_context {
    CUcontext ctx;       /* the fast path's key: set (release) once the rest is ready */
    CUcontext key;       /* the context of the slot from its claim on (under context_lock) */
    bool setting_up;     /* under context_lock: a thread sets it up, outside the lock */
    uint32_t forgets;    /* atomic: how many times its context went (written under both locks) */
    CUdevice device;
    uint32_t index;
    bool usable;
    bool gone;           /* atomic: the context went; set up again at its next use */
    uint64_t use_base;   /* atomic: tokens of a sequence up to this are from before it went */
    uint64_t mark_base;  /* atomic: marks of a sequence below this are from before it went */
    CUstream stream;     /* prefetches */
    CUstream evict_stream;
    CUevent events[PUMP_EVENTS_PER_CONTEXT];
    uint32_t next_event; /* atomic */
    CUevent evicted;     /* recorded on the eviction stream only: waits for what it was given so far */
    struct pump_link_probe link;  /* times a prefetch now and then, for pumpd */
    struct pump_kernel_probes kernels;  /* times launches of each key, for pumpd */
    pthread_mutex_t use_lock;  /* guards the rings' bookkeeping (never held across a driver call) */
    struct ring use_ring;
    uint64_t use_count;  /* use event slots taken so far */
    uint8_t use_busy[PUMP_USE_EVENTS];  /* atomic: USE_RECORDING, USE_READYING or USE_FREE */
    CUevent use_events[PUMP_USE_EVENTS];
    uint64_t use_recorded[PUMP_USE_EVENTS];  /* atomic: the use sequence each slot last recorded */
    uint64_t use_prepared;   /* under use_lock: uses below this need no wait before their record */
    bool use_preparing;      /* under use_lock: pump's worker has use_prepare */
    bool use_prepare_off;    /* under use_lock: the worker refused it (none): never asked again */
    struct pump_job use_prepare;
    struct ring mark_ring;
    /* Made at their first use (discard_marks.c): a stream whose discards are made in the legacy
     * default stream's order, where the driver refuses one on the legacy stream itself: each
     * waits for legacy_reached, recorded on the legacy stream before it, and the legacy stream
     * waits for its mark; and a stream that populates memory discarded there, each populate
     * after its discard, so that the prefetch stream never waits for one. Both non-blocking. */
    struct ring peer_ring;
    CUstream legacy_peer;
    CUevent legacy_reached;  /* recorded on the legacy stream only, by the thread discarding */
    CUstream populate_stream;
    CUevent populated;   /* recorded on populate_stream only */
    bool discarding;     /* a thread discards in this context, outside the lock */
    uint64_t mark_count; /* discards marked so far (atomic: read without the lock) */
    CUevent marks[PUMP_DISCARD_MARKS];  /* each recorded after its discard, */
    struct {
        uint64_t first, end;
        bool on_peer;                   /* atomic: made on legacy_peer */
    } marked[PUMP_DISCARD_MARKS];       /* of this memory */
};

/* The slots, claimed in order: the first pump_context_count (atomic) are in use. */
extern PUMP_HIDDEN struct pump_context pump_contexts[PUMP_CONTEXTS_MAX];
extern PUMP_HIDDEN uint32_t pump_context_count;

/* Makes a ring's driver objects, called with no lock held: false when they cannot be made. */
typedef bool (*pump_ring_maker)(struct pump_context *c);
/* Whether a ring's objects are made, making them with `make` at its first use (prefetch.c says
 * how). Called, and returns, with c's use_lock held. */
PUMP_HIDDEN bool pump_ring_ready(struct pump_context *c, struct ring *r, pump_ring_maker make, const char *without);
/* Creates n events (timing off) in c's context, from any thread. */
PUMP_HIDDEN bool pump_events_create_in(struct pump_context *c, CUevent *events, int n);
/* Makes `stream` wait (on the GPU) for the event's latest record. */
PUMP_HIDDEN void pump_stream_wait(CUstream stream, CUevent event);

#endif
