/* launch_uses.c: why it exists: a real program's kernels (an image's, with no C body) touch
 * nothing on fakecuda, so its faults and bytes would mean nothing. FAKECUDA_LAUNCH_USES names
 * a file recorded in an earlier run of the same program (a recorder reading each operator's
 * tensors, tests/real_client/operator_uses.py): for each launch, its operands. Each accepted
 * launch takes the next position of its thread, and a launch at a recorded position touches
 * its operands when it runs, as a test's kernel calls fakecuda_touch.
 *
 * Positions are (thread, launch): threads numbered by their first launch, launches counted on
 * each thread, so that two threads launching at once still meet their own lines. Addresses
 * differ from run to run, so an operand is named where this run's launch will point:
 * - @WORD:DELTA:BYTES:MODE, from the pointer in the launch's own arguments: DELTA (signed)
 *   bytes from the value of the 8-byte word at byte WORD of its argument buffer. A caching
 *   allocator hands a tensor whichever cached block is free when it asks, which depends on
 *   when its streams' events complete: under pump, with a budget, GPT-2 small's softmax wrote
 *   a 196 MiB block other than its recording's, and the replay touched that recording's block
 *   (3,136 faults a launch on memory the kernel did not point to, while pump had prefetched
 *   the one it did). Following the argument touches what the kernel is given.
 * - ORDINAL:OFFSET:BYTES:MODE, for an operand no argument points into (an operator's tensor a
 *   kernel of it is not given): an allocation by the order it was made
 *   (fakecuda_allocation_of), which a deterministic program's allocations keep.
 * A line naming another kernel, an argument word past the kernel's arguments, or memory this
 * run does not hold there is a mismatch, counted in launch_uses_mismatched: the recording was
 * of another program or another configuration.
 *
 * The file, text: a first line "fakecuda-launch-uses 1", then one line per recorded launch:
 *     THREAD LAUNCH KERNEL N OPERAND ... (N operands, each of the forms above; MODE r, w or rw)
 * A malformed file stops the process at its first launch, naming the line (a test tool). */
#include "fakecuda_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { THREADS_MAX = 64 };

/* by_argument: `word` is the argument word's byte offset and `delta` the operand's start from its
 * value; else `ordinal` and `offset` name an allocation and a place in it. */
typedef struct recorded_use {
    int by_argument, write, reads;
    uint64_t ordinal, offset, word, bytes;
    int64_t delta;
} recorded_use;
typedef struct recorded_launch {
    char *kernel;          /* NULL: no line for this position */
    size_t n;
    recorded_use *uses;
} recorded_launch;
typedef struct thread_lines { recorded_launch *at; size_t n; } thread_lines;

static thread_lines fc_recorded[THREADS_MAX];
static int fc_recording_loaded;          /* a file was named and read */
static pthread_once_t fc_load_once = PTHREAD_ONCE_INIT;
static _Atomic int fc_launch_threads;    /* threads that have launched */
static _Thread_local int fc_tls_thread = -1;
static _Thread_local uint64_t fc_tls_launches;

static _Noreturn void refuse(const char *path, size_t line, const char *what)
{
    fprintf(stderr, "fakecuda: FAKECUDA_LAUNCH_USES=%s line %zu: %s (expected \"THREAD LAUNCH KERNEL N "
            "OPERAND ...\", each operand ORDINAL:OFFSET:BYTES:r|w|rw or @WORD:DELTA:BYTES:r|w|rw, after a first line "
            "\"fakecuda-launch-uses 1\")\n", path, line, what);
    exit(2);
}

static uint64_t number(const char **p, const char *path, size_t line, const char *what)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(*p, &end, 10);
    if (end == *p || errno || **p == '-') refuse(path, line, what);
    *p = end;
    return v;
}

static void parse_use(const char **p, recorded_use *u, const char *path, size_t line)
{
    while (**p == ' ') (*p)++;
    u->by_argument = **p == '@';
    if (u->by_argument) {
        (*p)++;
        u->word = number(p, path, line, "an operand's argument word is not a number");
        if (*(*p)++ != ':') refuse(path, line, "an operand lacks its delta");
        int negative = **p == '-';
        if (negative || **p == '+') (*p)++;
        uint64_t delta = number(p, path, line, "an operand's delta is not a number");
        if (delta > INT64_MAX) refuse(path, line, "an operand's delta is past 2^63");
        u->delta = negative ? -(int64_t)delta : (int64_t)delta;
    } else {
        u->ordinal = number(p, path, line, "an operand's allocation ordinal is not a number");
        if (*(*p)++ != ':') refuse(path, line, "an operand lacks its offset");
        u->offset = number(p, path, line, "an operand's offset is not a number");
    }
    if (*(*p)++ != ':') refuse(path, line, "an operand lacks its bytes");
    u->bytes = number(p, path, line, "an operand's bytes are not a number");
    if (*(*p)++ != ':') refuse(path, line, "an operand lacks its mode");
    if (!strncmp(*p, "rw", 2)) { u->write = u->reads = 1; *p += 2; }
    else if (**p == 'w') { u->write = 1; u->reads = 0; (*p)++; }
    else if (**p == 'r') { u->write = 0; u->reads = 1; (*p)++; }
    else refuse(path, line, "an operand's mode is not r, w or rw");
    if (**p && **p != ' ' && **p != '\n') refuse(path, line, "an operand has more than four fields");
}

static void parse_line(const char *text, const char *path, size_t line)
{
    const char *p = text;
    uint64_t thread = number(&p, path, line, "the thread is not a number");
    uint64_t launch = number(&p, path, line, "the launch is not a number");
    if (thread >= THREADS_MAX) refuse(path, line, "the thread is past fakecuda's 64");
    if (launch >= (1u << 26)) refuse(path, line, "the launch is past 2^26");
    while (*p == ' ') p++;
    size_t name_len = strcspn(p, " \n");
    if (!name_len) refuse(path, line, "the kernel's name is missing");
    const char *name = p;
    p += name_len;
    uint64_t n = number(&p, path, line, "the operand count is not a number");
    if (n > 1u << 16) refuse(path, line, "more than 65536 operands");
    thread_lines *t = &fc_recorded[thread];
    if (launch >= t->n) {
        size_t cap = launch + 1 > 2 * t->n ? launch + 1 : 2 * t->n;
        recorded_launch *grown = realloc(t->at, cap * sizeof *grown);
        if (!grown) refuse(path, line, "out of memory");
        memset(grown + t->n, 0, (cap - t->n) * sizeof *grown);
        t->at = grown;
        t->n = cap;
    }
    recorded_launch *r = &t->at[launch];
    if (r->kernel) refuse(path, line, "a second line for this thread and launch");
    r->kernel = strndup(name, name_len);
    r->uses = n ? calloc(n, sizeof *r->uses) : NULL;
    if (!r->kernel || (n && !r->uses)) refuse(path, line, "out of memory");
    r->n = n;
    for (size_t i = 0; i < n; i++) parse_use(&p, &r->uses[i], path, line);
    while (*p == ' ') p++;
    if (*p && *p != '\n') refuse(path, line, "more operands than its count");
}

static void load(void)
{
    const char *path = getenv("FAKECUDA_LAUNCH_USES");
    if (!path || !*path) return;
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "fakecuda: FAKECUDA_LAUNCH_USES=%s: %s\n", path, strerror(errno));
        exit(2);
    }
    char *text = NULL;
    size_t cap = 0, line = 0;
    while (getline(&text, &cap, f) >= 0) {
        line++;
        if (line == 1) {
            if (strcmp(text, "fakecuda-launch-uses 1\n") && strcmp(text, "fakecuda-launch-uses 1"))
                refuse(path, line, "not a launch-uses file of version 1");
            continue;
        }
        parse_line(text, path, line);
    }
    if (line == 0) refuse(path, 1, "the file is empty");
    free(text);
    fclose(f);
    fc_recording_loaded = 1;
}

FC_EXPORT void fakecuda_launch_position(int *thread, uint64_t *launches)
{
    if (thread) *thread = fc_tls_thread;
    if (launches) *launches = fc_tls_launches;
}

/* Where use u lies in this run, given the launch's argument buffer: false where it cannot be
 * placed (an argument word past the buffer, memory this run does not hold there). */
static int place(const recorded_use *u, const fc_kdef *def, const unsigned char *args, uintptr_t *start)
{
    uintptr_t base;
    size_t size;
    if (!u->by_argument) {
        if (!fc_alloc_by_ordinal(u->ordinal, &base, &size) || u->offset > size || u->bytes > size - u->offset) return 0;
        *start = base + u->offset;
        return 1;
    }
    uint64_t value;
    if (u->word > def->argsize || def->argsize - u->word < sizeof value) return 0;
    memcpy(&value, args + u->word, sizeof value);
    *start = (uintptr_t)(value + (uint64_t)u->delta);
    fc_alloc_desc a; /* holding *start: a.base <= *start < a.base + a.size */
    return u->bytes > 0 && fc_alloc_lookup(*start, &a) && u->bytes <= a.size - (*start - a.base);
}

/* The recorded operands at this position, as this run's addresses; counts what did not match. */
static size_t resolve(const recorded_launch *r, const fc_kdef *def, const unsigned char *args, fc_use **uses)
{
    if (strcmp(r->kernel, def->name)) {
        FC_COUNT(launch_uses_mismatched, 1);
        return 0;
    }
    fc_use *out = r->n ? malloc(r->n * sizeof *out) : NULL;
    size_t n = 0;
    int mismatched = r->n && !out;
    for (size_t i = 0; out && i < r->n; i++) {
        uintptr_t start = 0;
        if (!place(&r->uses[i], def, args, &start)) {
            mismatched = 1;
            continue;
        }
        /* Only an operand the launch's own argument points into is read where this run's
         * kernel reads: one named by allocation lies where the recording's allocator put it. */
        out[n++] = (fc_use){ start, r->uses[i].bytes, r->uses[i].write, r->uses[i].reads && r->uses[i].by_argument,
                              r->uses[i].by_argument, r->uses[i].write && !r->uses[i].reads };
    }
    FC_COUNT(launches_given_uses, 1);
    if (mismatched) FC_COUNT(launch_uses_mismatched, 1);
    if (!n) {
        free(out);
        out = NULL;
    }
    *uses = out;
    return n;
}

size_t fc_launch_uses_take(const fc_kdef *def, const unsigned char *args, fc_use **uses, fc_launch_position *at)
{
    *uses = NULL;
    if (fc_tls_thread < 0) fc_tls_thread = atomic_fetch_add(&fc_launch_threads, 1);
    uint64_t launch = fc_tls_launches++;
    *at = (fc_launch_position){ fc_tls_thread, launch };
    pthread_once(&fc_load_once, load);
    if (!fc_recording_loaded) return 0;
    const thread_lines *t = fc_tls_thread < THREADS_MAX ? &fc_recorded[fc_tls_thread] : NULL;
    if (!t || launch >= t->n || !t->at[launch].kernel) {
        FC_COUNT(launch_uses_missing, 1);
        return 0;
    }
    return resolve(&t->at[launch], def, args, uses);
}
