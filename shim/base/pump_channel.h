/* pump_channel.h: the channels between a job's shim and pumpd, the one
 * layout both sides read (the shim in C, pumpd through cffi and numpy).
 *
 * Three channels per process:
 *  - the socket: framed messages (struct pump_msg_header + a JSON object),
 *    used to attach, to resume after a daemon restart, and by pump-run and
 *    `pump status`. Rare, never on a launch's path.
 *  - the event ring, shim -> pumpd: fixed-size records in shared memory that
 *    pumpd creates (a sealed memfd passed over the socket). Many producer
 *    threads, one consumer; written without locks or system calls; when full
 *    the shim drops the record and counts it, it never waits.
 *  - the plan, pumpd -> shim: shared memory pumpd writes and the shim reads
 *    under a sequence counter, without ever waiting on it.
 *
 * cffi parses this header: no macros, no #include beyond the guard below.
 * Fields read by both sides across the processes are accessed in C with
 * __atomic builtins; cffi sees plain integers.
 */
#ifndef PUMP_CHANNEL_H
#define PUMP_CHANNEL_H
#include <stdint.h>

enum {
    PUMP_PROTOCOL_VERSION = 1,
    PUMP_KEY_BASES = 64,               /* allocation bases a launch key hashes (the plan) */
    PUMP_MSG_MAGIC = 0x47534d50,       /* "PMSG" little-endian */
    PUMP_MSG_PAYLOAD_MAX = 65536,      /* bytes of JSON after the header */
    PUMP_RING_MAGIC = 0x474e5250,      /* "PRNG" */
    PUMP_PLAN_MAGIC = 0x4e4c5050,      /* "PPLN" */
    PUMP_RING_RECORDS_MIN = 1024,      /* a ring holds a power of two records */
    PUMP_RING_RECORDS_MAX = 4194304,
    PUMP_FUNCTION_NAME_MAX = 1024,     /* longer kernel names are cut here */
    PUMP_PLAN_VERSION = 2,             /* the plan's layout below */
    PUMP_PLAN_SLOTS = 16384,           /* trigger hash slots, a power of two */
    PUMP_PLAN_SLOT_BITS = 14,          /* log2(PUMP_PLAN_SLOTS) */
    PUMP_PLAN_PROBES = 8,              /* a trigger sits within this many slots of its hash */
    PUMP_PLAN_RANGES = 65536,          /* address ranges all triggers name, in total */
    PUMP_TRACE_VERSION = 2,            /* trace files; version 1 (no kinds past COUNTERS) is read too */
    PUMP_TRACE_MAGIC = 0x43525450,     /* "PTRC" */
    PUMP_TRACE_BLOCK_MAGIC = 0x4b4c4254, /* "TBLK" */
    PUMP_LINK_INTERVAL_NS = 50000000,  /* a context's prefetches are timed (LINK) at most once in this,
                                          after its first four */
    PUMP_KERNEL_FIRST_SAMPLES = 3,     /* a launch key's first launches timed (KERNEL)... */
    PUMP_KERNEL_KEY_INTERVAL_NS = 1000000000 /* ... then at most one in this */
};

/* ---- the socket ----
 * Every message: this header, then `length` bytes (at most
 * PUMP_MSG_PAYLOAD_MAX) of a UTF-8 JSON object. A request carries "op";
 * a reply "ok": true and the op's fields, an error "error": "text".
 * A reply to op "attach" carries two file descriptors (SCM_RIGHTS): the
 * ring, then the plan; a request with op "resume" carries the same two back.
 * A peer that breaks the framing is disconnected; the daemon serves on. */
enum pump_msg_type {
    PUMP_MSG_REQUEST = 1,
    PUMP_MSG_REPLY = 2,
    PUMP_MSG_ERROR = 3
};

struct pump_msg_header {
    uint32_t magic;                    /* PUMP_MSG_MAGIC */
    uint16_t version;                  /* PUMP_PROTOCOL_VERSION */
    uint16_t type;                     /* enum pump_msg_type */
    uint32_t length;                   /* payload bytes */
    uint32_t reserved;                 /* 0 */
};

/* ---- the event ring ---- */
enum pump_event_kind {
    PUMP_EVENT_ALLOC = 1,         /* arg0 base, arg1 size, arg2 cuMemAllocManaged flags; a tensor of
                                     PyTorch's caching allocator goes by its name instead
                                     (shim/lookup/names.h: an address from 2^62 up, the same
                                     step after step), arg3 its real address (0: arg0 is) */
    PUMP_EVENT_FREE = 2,          /* arg0 base (or name), arg1 size */
    PUMP_EVENT_LAUNCH = 3,        /* arg0 function, arg1 stream, arg2..4 the first
                                     allocation bases; count: allocations in all (at most
                                     256: a wider launch's first ones, channel.c) */
    PUMP_EVENT_LAUNCH_MORE = 4,   /* follows a LAUNCH: arg0..4 more bases; count: in this record */
    PUMP_EVENT_FUNCTION = 5,      /* once per function: arg0 function; count: name bytes
                                     in all; arg1..4 the first 32 bytes of the name */
    PUMP_EVENT_NAME = 6,          /* follows a FUNCTION: count bytes of the name in arg0..4 */
    PUMP_EVENT_SYNC = 7,          /* a synchronisation returned: arg0 the new epoch */
    PUMP_EVENT_COUNTERS = 8,      /* the shim's own accounting, sent by its worker about
                                     twice a second: arg0 launches, arg1 launches on managed
                                     memory, arg2 bytes prefetched, arg3 bytes believed
                                     resident on GPUs, arg4 bytes evicted */
    /* The kinds below come from what knows more than a kernel's arguments: the trace
     * generator (pump trace generate) and, later, framework allocator integration. */
    PUMP_EVENT_EXTENT = 9,        /* follows a LAUNCH (after its MOREs): byte ranges the
                                     launch reads or writes, exactly. count: ranges in this
                                     record (1 or 2): arg0 address, arg1 bytes, arg2 address,
                                     arg3 bytes; arg4 bit i set: range i is written */
    PUMP_EVENT_COST = 10,         /* follows a LAUNCH: arg0 floating-point operations,
                                     arg1 bytes of device-memory traffic, arg2 the kernel's
                                     measured time in ns (0: unknown) */
    PUMP_EVENT_BLOCK_ALLOC = 11,  /* the framework's allocator handed out arg1 bytes at
                                     arg0, inside a managed allocation */
    PUMP_EVENT_BLOCK_FREE = 12,   /* the framework's allocator took back arg1 bytes at arg0:
                                     the contents are dead until handed out again */
    PUMP_EVENT_STEP = 13,         /* the program begins training step arg0, counted from 0
                                     (the trace generator's, at each step; the shim's, after
                                     each optimizer step of pump's allocator for PyTorch: a
                                     marker for people and tools; the policy finds steps
                                     itself) */
    /* Which GPU is which: CUDA ordinals differ between processes (CUDA_VISIBLE_DEVICES)
     * and from NVML's indices; the UUID names the GPU. */
    PUMP_EVENT_DEVICE = 14,       /* the process works on device `device` (its CUDA ordinal,
                                     0..63): written once per device, when the shim sets up
                                     its first context there (never on a launch's path after
                                     that), and again after it resumes with a restarted
                                     pumpd. count: 16; arg0, arg1: the 16 bytes of the
                                     device's UUID (cuDeviceGetUuid_v2), in memory order */
    PUMP_EVENT_BUDGET = 15,       /* pump's own budget on device `device` (its default above
                                     the device: the device's free memory less a margin,
                                     shim/policy/budget.c), which pumpd's plans keep to when the job
                                     has no budget of its own: arg0 bytes. Written when first
                                     read and at each change, and again to a restarted pumpd
                                     (a repeat says nothing new) */
    /* The link pump's prefetches cross, as the GPU timed one of them (shim/engine/link_rate.c):
     * pumpd plans transfers at the rate measured, not at a figure it assumes. */
    PUMP_EVENT_LINK = 16,         /* a prefetch to device `device` of arg0 bytes took arg1
                                     nanoseconds on the GPU (timing events recorded on pump's
                                     prefetch stream before and after it). count: 2. After
                                     a context's first four, at most one a
                                     PUMP_LINK_INTERVAL_NS per context */
    /* How long kernels run, as the GPU timed a few launches of each launch key
     * (shim/engine/kernel_time.c): pumpd plans on the kernels' clock, not the launch calls'. */
    PUMP_EVENT_KERNEL = 17        /* a launch with launch key arg0 ran arg1 nanoseconds on
                                     device `device` (timing events recorded on its stream
                                     just before and after it). count: 2. The first
                                     PUMP_KERNEL_FIRST_SAMPLES launches of a key, then at most
                                     one a PUMP_KERNEL_KEY_INTERVAL_NS per key */
};

/* 64 bytes. A record is complete once `seq` holds its ring position + 1
 * (stored last, with release order); records of one launch or one name are
 * reserved together, so they are contiguous in the ring. */
struct pump_event {
    uint64_t seq;
    uint16_t kind;                /* enum pump_event_kind */
    uint16_t count;
    int32_t device;               /* CUDA ordinal, -1 where unknown */
    uint64_t time_ns;             /* CLOCK_MONOTONIC less the writing thread's time in
                                     pump's own driver calls so far (kernel time for pumpd) */
    uint64_t arg[5];
};

/* The ring's first 256 bytes; `capacity` records follow. head and tail are
 * positions that only grow (a record's slot is its position modulo
 * capacity). The shim writes head, written and dropped; pumpd writes tail
 * and trusts nothing it reads here beyond what it checks. */
struct pump_ring_header {
    uint32_t magic;               /* PUMP_RING_MAGIC */
    uint32_t version;             /* PUMP_PROTOCOL_VERSION */
    uint32_t record_size;         /* sizeof(struct pump_event) */
    uint32_t capacity;            /* records */
    uint64_t session;             /* pumpd's id for this process */
    char job[32];                 /* pumpd's id of the job (NUL-terminated), read back on resume */
    uint8_t pad0[8];
    uint64_t head;                /* next position a producer reserves */
    uint8_t pad1[56];
    uint64_t tail;                /* next position pumpd reads */
    uint8_t pad2[56];
    uint64_t written;             /* records written */
    uint64_t dropped;             /* records not written: the ring was full */
    uint8_t pad3[48];
};

/* ---- the plan ---- */
/* A launch's key names the kernel and what it is given (DeepUM's execution
 * id): with K = 0x9E3779B97F4A7C15 and arithmetic mod 2^64,
 *     h = function * K;  for each of the first PUMP_KEY_BASES allocation bases b, in
 *     the LAUNCH record's order: h = (h ^ b) * K;  h ^= h >> 32;  key = h, or 1 where h is 0.
 * (A wide launch's bases past those, a by-value list's unset slots among them, vary from step
 * to step more often than they name the step's tensors: the record carries them, the key not.)
 * A trigger for key k sits in slot k >> (64 - PUMP_PLAN_SLOT_BITS) or one of
 * the PUMP_PLAN_PROBES - 1 slots after it (wrapping around); key 0 marks an
 * empty slot. The trigger's ranges follow each other from range[first]:
 * `need`, then `prefetch`, then `evict` of them. When a launch with that key
 * is made, the shim
 *  - before the kernel, makes sure of the `need` ranges (the blocks this
 *    launch touches): those not believed resident are prefetched, and the
 *    kernel waits on the GPU for them and for planned prefetches of them still
 *    in flight; they replace the launch rule's whole allocations;
 *  - after enqueuing the kernel, evicts to the host the `evict` ranges,
 *    ordered after the kernel (their last user),
 *  - then prefetches the `prefetch` ranges to the launch's device, for the
 *    launches that follow.
 * Ranges are whole pages inside the job's managed allocations; the shim
 * checks each against its own table and skips what is not. */
struct pump_plan_trigger {
    uint64_t key;
    uint32_t first;
    uint16_t need;
    uint16_t prefetch;
    uint16_t evict;
    uint16_t reserved0;
    uint32_t reserved1;
};

struct pump_plan_range {
    uint64_t address;
    uint64_t bytes;
};

/* pumpd makes `generation` odd, writes, then makes it even again; the shim
 * reads it before and after copying what it needs and ignores the plan for
 * this launch if the two differ or are odd. It never waits for the daemon. */
struct pump_plan {
    uint32_t magic;               /* PUMP_PLAN_MAGIC */
    uint32_t version;             /* PUMP_PLAN_VERSION */
    uint64_t generation;
    uint64_t budget_bytes;        /* cap on GPU-resident managed bytes per device; 0: none */
    uint32_t trigger_count;       /* slots in use */
    uint32_t range_count;         /* entries of range[] in use */
    uint32_t order;               /* enum pump_plan_order: how the shim picks victims
                                     when the budget is reached between planned evictions */
    uint8_t pad0[28];
    struct pump_plan_trigger trigger[16384];  /* PUMP_PLAN_SLOTS, 24 bytes each */
    struct pump_plan_range range[65536];      /* PUMP_PLAN_RANGES */
};

enum pump_plan_order {
    PUMP_ORDER_MIGRATED = 0,      /* least recently migrated first: what the driver does */
    PUMP_ORDER_USED = 1           /* freed tensors' blocks, then least recently used by a launch first */
};

/* ---- trace files (pump-run --trace FILE, pump trace generate) ----
 * pumpd writes what it ingests for a job: a struct pump_trace_header, then
 * blocks, each a struct pump_trace_block followed by `records` struct
 * pump_event exactly as one process's shim wrote them (in ring order; times
 * are that machine's CLOCK_MONOTONIC). Versioned by the header: version 2
 * added the kinds EXTENT..STEP, which generated traces carry. DEVICE came
 * later within version 2: a reader skips (and counts) a kind it does not
 * know, so a new kind needs no new version; a changed layout does. */
struct pump_trace_header {
    uint32_t magic;               /* PUMP_TRACE_MAGIC */
    uint32_t version;             /* PUMP_TRACE_VERSION */
    uint32_t record_size;         /* sizeof(struct pump_event) */
    uint32_t reserved;
    uint64_t start_ns;            /* CLOCK_MONOTONIC when the trace began */
    char job[32];                 /* pumpd's id of the job */
    char name[64];                /* the job's name */
};

struct pump_trace_block {
    uint32_t magic;               /* PUMP_TRACE_BLOCK_MAGIC */
    int32_t pid;                  /* the process whose records follow */
    uint64_t records;
};

#endif
