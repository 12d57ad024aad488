/* um_counters: a CUPTI injection library that counts what Unified Memory moved in one process,
 * for the GPU suite's untimed counter runs (CUPTI's records perturb timing).
 *
 *   CUDA_INJECTION64_PATH=libum_counters.so PUMP_BENCH_CUPTI_OUT=FILE.json COMMAND
 *
 * The driver calls InitializeInjection() from inside cuInit.  It enables CUPTI's Unified Memory
 * counter activity (bytes host-to-device and device-to-host with their migration cause, CPU and
 * GPU page faults, thrashing, throttling) and sums the records as CUPTI hands them back; at exit
 * it flushes and writes one JSON object to $PUMP_BENCH_CUPTI_OUT: what configuring and enabling
 * answered, where and after how many tries the enable took, the sums per counter, the bytes per
 * migration cause, records and drops.  Nothing is written to the program's stdout.  Built by
 * bench/gpu/cupti.py against the toolkit's CUPTI.
 *
 * When to enable.  cupti_activity.h says of cuptiActivityConfigureUnifiedMemoryCounter "The API
 * should be called after CUDA driver initialization", and NVIDIA's CUPTI sample unified_memory
 * (extras/CUPTI/samples/unified_memory/unified_memory.cu) configures and enables the kind only
 * after cuInit and cuDeviceGetCount have returned.  InitializeInjection runs inside cuInit, before
 * the driver is initialised: on the H100 (driver 580.159.04, CUPTI API 130001) every configure
 * answered CUPTI_SUCCESS there but cuptiActivityEnable answered CUPTI_ERROR_NOT_READY ("the object
 * is not yet ready to perform the requested operation", cupti_result.h) and no counter came.  So
 * the enable is tried there first and, refused, again (configure, then enable) from CUPTI
 * callbacks once cuInit has returned: at every driver API call (enter and exit, cuInit's own exit
 * included, up to MAX_TRIES) and at every context creation (CUPTI_CBID_RESOURCE_CONTEXT_CREATED,
 * always), until it takes; then the callbacks are turned off.  Enabling activities from a CUPTI
 * callback is what NVIDIA's cupti_trace_injection sample does (on cuProfilerStart).  Managed
 * memory moves only inside a context, so an enable at the first context's creation misses
 * nothing.  If it never takes, "enable" keeps the last refusal and the report says so. */
#include <pthread.h>
#include <stdatomic.h>
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
#define MAX_TRIES 4096 /* enables tried at driver API calls before those callbacks are turned off */
#define LOG_TRIES 8    /* tries the report lists, the first ones */
#define AT_CHARS 96

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

/* The enable's state, under enable_lock (taken before lock where both are). */
static pthread_mutex_t enable_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int enabled;
static _Thread_local int trying; /* this thread is inside a try: CUPTI's own calls do not retry */
static CUpti_SubscriberHandle subscriber;
static const char *configure_result[NCOUNTERS], *enable_result = "not tried", *register_result = "not tried",
                  *subscribe_result = "not needed", *callbacks_result = "not needed";
static char enabled_at[AT_CHARS];
static unsigned tries;
static struct {
    char at[AT_CHARS];
    const char *result;
} tried[LOG_TRIES];

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

/* s as a JSON string (CUPTI's function names and result names need no escaping, but be safe). */
static void write_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", (unsigned)(unsigned char)*s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
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
    pthread_mutex_lock(&enable_lock);
    pthread_mutex_lock(&lock);
    fprintf(f, "{\n  \"cupti_api_version\": %d,\n  \"register\": \"%s\",\n  \"enable\": \"%s\",\n  \"enabled_at\": ",
            CUPTI_API_VERSION, register_result, enable_result);
    if (atomic_load(&enabled))
        write_string(f, enabled_at);
    else
        fputs("null", f);
    fprintf(f, ",\n  \"enable_tries\": %u,\n  \"enable_log\": [", tries);
    for (unsigned i = 0; i < tries && i < LOG_TRIES; i++) {
        fputs(i ? ", {\"at\": " : "{\"at\": ", f);
        write_string(f, tried[i].at);
        fprintf(f, ", \"result\": \"%s\"}", tried[i].result);
    }
    fprintf(f, "],\n  \"subscribe\": \"%s\",\n  \"retry_callbacks\": \"%s\",\n  \"configure\": {", subscribe_result,
            callbacks_result);
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
    pthread_mutex_unlock(&enable_lock);
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

/* One try, at `at`: configure, then enable.  With enable_lock held. */
static int try_enable(const char *at) {
    configure();
    CUptiResult r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER);
    enable_result = result_text(r);
    if (tries < LOG_TRIES) {
        snprintf(tried[tries].at, sizeof tried[tries].at, "%s", at);
        tried[tries].result = enable_result;
    }
    tries++;
    if (r != CUPTI_SUCCESS)
        return 0;
    snprintf(enabled_at, sizeof enabled_at, "%s", at);
    atomic_store(&enabled, 1);
    return 1;
}

/* The retries once InitializeInjection's try was refused: at driver API calls (up to MAX_TRIES)
 * and at context creations; the callbacks go off once the enable takes. */
static void CUPTIAPI on_callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                 const void *cbdata) {
    (void)userdata;
    if (atomic_load(&enabled) || trying)
        return;
    char at[AT_CHARS];
    if (domain == CUPTI_CB_DOMAIN_RESOURCE && cbid == CUPTI_CBID_RESOURCE_CONTEXT_CREATED) {
        snprintf(at, sizeof at, "context created");
    } else if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
        const CUpti_CallbackData *d = cbdata;
        snprintf(at, sizeof at, "%s %s", d && d->functionName ? d->functionName : "driver call",
                 d && d->callbackSite == CUPTI_API_ENTER ? "enter" : "exit");
    } else {
        return;
    }
    trying = 1;
    pthread_mutex_lock(&enable_lock);
    if (!atomic_load(&enabled) && (domain == CUPTI_CB_DOMAIN_RESOURCE || tries < MAX_TRIES)) {
        int on = try_enable(at);
        if (on || tries >= MAX_TRIES)
            cuptiEnableDomain(0, subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
        if (on)
            cuptiEnableCallback(0, subscriber, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_CREATED);
    }
    pthread_mutex_unlock(&enable_lock);
    trying = 0;
}

int InitializeInjection(void) {
    for (unsigned i = 0; i < NCOUNTERS; i++)
        configure_result[i] = "not tried";
    atexit(write_report);
    CUptiResult r = cuptiActivityRegisterCallbacks(request_buffer, buffer_completed);
    register_result = result_text(r);
    if (r != CUPTI_SUCCESS) {
        enable_result = register_result;
        return 1;
    }
    pthread_mutex_lock(&enable_lock);
    trying = 1;
    if (!try_enable("InitializeInjection")) {
        r = cuptiSubscribe(&subscriber, on_callback, NULL);
        subscribe_result = result_text(r);
        if (r == CUPTI_SUCCESS) {
            r = cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_CONTEXT_CREATED);
            if (r == CUPTI_SUCCESS)
                r = cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
            callbacks_result = result_text(r);
        }
    }
    trying = 0;
    pthread_mutex_unlock(&enable_lock);
    return 1;
}
