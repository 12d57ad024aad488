/* um_counters: a CUPTI injection library that counts what Unified Memory moved in one process,
 * for the GPU suite's untimed counter runs (CUPTI's records perturb timing).
 *
 *   CUDA_INJECTION64_PATH=libum_counters.so PUMP_BENCH_CUPTI_OUT=FILE.json COMMAND
 *
 * The driver calls InitializeInjection() at cuInit.  It enables CUPTI's Unified Memory counter
 * activity (bytes host-to-device and device-to-host with their migration cause, CPU and GPU page
 * faults, thrashing, throttling) and sums the records as CUPTI hands them back; at exit it
 * flushes and writes one JSON object to $PUMP_BENCH_CUPTI_OUT: what configuring and enabling
 * answered, the sums per counter, the bytes per migration cause, records and drops.  Nothing is
 * written to the program's stdout.  Built by bench/gpu/cupti.py against the toolkit's CUPTI. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cupti.h>

#if CUPTI_API_VERSION >= 130000
typedef CUpti_ActivityUnifiedMemoryCounter3 um_record;
#else
typedef CUpti_ActivityUnifiedMemoryCounter2 um_record;
#endif

#define BUFFER_BYTES (8u << 20)
#define MAX_KIND 16
#define MAX_CAUSE 8

/* The counters asked for, with the names the JSON gives them. */
static const struct {
    CUpti_ActivityUnifiedMemoryCounterKind kind;
    const char *name;
} COUNTERS[] = {
    {CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD, "bytes_h2d"},
    {CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH, "bytes_d2h"},
    {CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_CPU_PAGE_FAULT_COUNT, "cpu_page_faults"},
    {CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT, "gpu_page_faults"},
    {CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THRASHING, "thrashing"},
    {CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_THROTTLING, "throttling"},
};
#define NCOUNTERS (sizeof COUNTERS / sizeof COUNTERS[0])

static const char *const CAUSES[MAX_CAUSE] = {"unknown", "user", "coherence", "prefetch",
                                              "eviction", "access_counters", "cause6", "cause7"};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t sums[MAX_KIND], records_of[MAX_KIND], h2d_by_cause[MAX_CAUSE], d2h_by_cause[MAX_CAUSE];
static uint64_t records, other_records, dropped;
static const char *configure_result[NCOUNTERS], *enable_result = "not tried";

static const char *result_text(CUptiResult r) {
    const char *s = "unknown CUPTI result";
    cuptiGetResultString(r, &s);
    return s;
}

static void CUPTIAPI request_buffer(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t *buffer, size_t size,
                                      size_t valid) {
    (void)size;
    CUpti_Activity *rec = NULL;
    size_t lost = 0;
    pthread_mutex_lock(&lock);
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER) {
            other_records++;
            continue;
        }
        const um_record *u = (const um_record *)rec;
        unsigned kind = (unsigned)u->counterKind, cause = u->flags < MAX_CAUSE ? u->flags : 0;
        records++;
        if (kind >= MAX_KIND)
            continue;
        sums[kind] += u->value;
        records_of[kind]++;
        if (kind == CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD)
            h2d_by_cause[cause] += u->value;
        else if (kind == CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH)
            d2h_by_cause[cause] += u->value;
    }
    if (cuptiActivityGetNumDroppedRecords(ctx, stream_id, &lost) == CUPTI_SUCCESS)
        dropped += lost;
    pthread_mutex_unlock(&lock);
    free(buffer);
}

static void write_causes(FILE *f, const char *name, const uint64_t *by_cause) {
    fprintf(f, ",\n  \"%s\": {", name);
    for (unsigned c = 0; c < MAX_CAUSE; c++)
        fprintf(f, "%s\"%s\": %llu", c ? ", " : "", CAUSES[c], (unsigned long long)by_cause[c]);
    fputc('}', f);
}

static void write_report(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    const char *path = getenv("PUMP_BENCH_CUPTI_OUT");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (!f) {
        fprintf(stderr, "um_counters: cannot write the report: PUMP_BENCH_CUPTI_OUT=%s\n", path ? path : "(unset)");
        return;
    }
    pthread_mutex_lock(&lock);
    fprintf(f, "{\n  \"cupti_api_version\": %d,\n  \"enable\": \"%s\",\n  \"configure\": {", CUPTI_API_VERSION,
            enable_result);
    for (unsigned i = 0; i < NCOUNTERS; i++)
        fprintf(f, "%s\"%s\": \"%s\"", i ? ", " : "", COUNTERS[i].name, configure_result[i]);
    fprintf(f, "},\n  \"counters\": {");
    for (unsigned i = 0; i < NCOUNTERS; i++)
        fprintf(f, "%s\"%s\": %llu", i ? ", " : "", COUNTERS[i].name, (unsigned long long)sums[COUNTERS[i].kind]);
    fprintf(f, "},\n  \"records_per_counter\": {");
    for (unsigned i = 0; i < NCOUNTERS; i++)
        fprintf(f, "%s\"%s\": %llu", i ? ", " : "", COUNTERS[i].name,
                (unsigned long long)records_of[COUNTERS[i].kind]);
    fputc('}', f);
    write_causes(f, "bytes_h2d_by_cause", h2d_by_cause);
    write_causes(f, "bytes_d2h_by_cause", d2h_by_cause);
    fprintf(f, ",\n  \"records\": %llu,\n  \"other_records\": %llu,\n  \"dropped\": %llu\n}\n",
            (unsigned long long)records, (unsigned long long)other_records, (unsigned long long)dropped);
    pthread_mutex_unlock(&lock);
    fclose(f);
}

/* Configures the counters one by one, so that one the platform lacks leaves the others on. */
static void configure(void) {
    for (unsigned i = 0; i < NCOUNTERS; i++) {
        CUpti_ActivityUnifiedMemoryCounterConfig config = {
            .scope = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_SCOPE_PROCESS_ALL_DEVICES,
            .kind = COUNTERS[i].kind,
            .deviceId = 0,
            .enable = 1,
        };
        configure_result[i] = result_text(cuptiActivityConfigureUnifiedMemoryCounter(&config, 1));
    }
}

int InitializeInjection(void) {
    for (unsigned i = 0; i < NCOUNTERS; i++)
        configure_result[i] = "not tried";
    CUptiResult r = cuptiActivityRegisterCallbacks(request_buffer, buffer_completed);
    if (r != CUPTI_SUCCESS) {
        enable_result = result_text(r);
    } else {
        configure();
        enable_result = result_text(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER));
    }
    atexit(write_report);
    return 1;
}
