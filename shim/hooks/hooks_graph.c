/* hooks_graph.c: CUDA graphs. A replay (cuGraphLaunch) is one call that runs
 * many kernels, none of which pump sees. So at instantiation pump walks the
 * graph (child graphs included), scans each kernel node's arguments with the
 * launch scan, and keeps per executable graph the managed allocations its
 * kernels use, by base address (looked up again at each replay: an
 * allocation freed since is skipped). Before each replay under policy
 * launch, those allocations take the launch rule as if one kernel used them
 * all: their prefetch is enqueued and the replay's stream waits for it on the
 * GPU. Graphs have no prefetch node, so a working set larger than the budget
 * is left to faults (said once, counted). An exec whose nodes pump could not
 * read, or whose update it could not follow, is passed through (counted).
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"
#include "handles.h"
#include "hooks_common.h"
#include "locks.h"
#include "residency.h"
#include "stream_users.h"

/* Child graphs deeper than this are not walked: the exec is unknown. */
#define CHILD_DEPTH_MAX 8
#define EXEC_BUCKETS 1024 /* power of two */

struct node_use {
    CUgraphNode node;     /* the kernel node (an exec update names it) */
    uint32_t count;
    uint64_t *base;       /* its allocations' base addresses */
};

struct graph_exec {
    struct graph_exec *next;  /* in its bucket */
    CUgraphExec exec;
    bool unknown;             /* pump could not read it: replays pass through */
    int device;               /* of the context it was instantiated in; -1: not known */
    uint32_t nodes, nodes_size;
    struct node_use *node;
    uint32_t count;           /* distinct allocations of all its kernels */
    uint64_t *base;           /* sorted */
};

static pthread_rwlock_t execs_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct graph_exec *bucket[EXEC_BUCKETS];

static struct graph_exec **slot_of(CUgraphExec exec)
{
    uintptr_t key = (uintptr_t)exec;
    struct graph_exec **slot = &bucket[((key >> 4) * 0x9E3779B97F4A7C15ull >> 54) & (EXEC_BUCKETS - 1)];
    while (*slot != NULL && (*slot)->exec != exec)
        slot = &(*slot)->next;
    return slot;
}

/* Forgets what g's kernels use. */
static void clear(struct graph_exec *g)
{
    for (uint32_t i = 0; i < g->nodes; i++)
        free(g->node[i].base);
    free(g->node);
    free(g->base);
    g->node = NULL;
    g->base = NULL;
    g->nodes = g->nodes_size = g->count = 0;
}

static void exec_free(struct graph_exec *g)
{
    if (g != NULL)
        clear(g);
    free(g);
}

/* ---- what the kernels use ---- */

/* The allocations one kernel's arguments point into. */
static bool scan_kernel(struct node_use *use, CUfunction f, CUkernel kernel, void **params, void **extra,
                        unsigned grid_x)
{
    struct pump_scan scan;
    if (f == NULL && kernel != NULL)
        pump_handle_note(kernel, PUMP_HANDLE_KERNEL, NULL); /* the node's `kern`: a CUkernel, as cuda.h types it */
    pump_scan_launch(f != NULL ? f : (CUfunction)kernel, params, extra, grid_x, &scan);
    if (scan.unscanned)
        return false;
    use->count = 0;
    use->base = scan.own > 0 ? malloc(scan.own * sizeof *use->base) : NULL;
    if (scan.own > 0 && use->base == NULL)
        return false;
    for (uint32_t r = 0; r < scan.own; r++)
        use->base[use->count++] = __atomic_load_n(&scan.range[r]->base, __ATOMIC_RELAXED);
    return true;
}

static bool add_node(struct graph_exec *g, CUgraphNode node, CUgraphNode kernel_node)
{
    CUDA_KERNEL_NODE_PARAMS params;
    memset(&params, 0, sizeof params);
    if (pump_driver.graph_kernel_node_get_params == NULL ||
        pump_driver.graph_kernel_node_get_params(kernel_node, &params) != CUDA_SUCCESS)
        return false;
    if (g->nodes == g->nodes_size) {
        uint32_t size = g->nodes_size ? 2 * g->nodes_size : 16;
        struct node_use *grown = realloc(g->node, size * sizeof *grown);
        if (grown == NULL)
            return false;
        g->node = grown;
        g->nodes_size = size;
    }
    struct node_use *use = &g->node[g->nodes];
    use->node = node;
    if (!scan_kernel(use, params.func, params.kern, params.kernelParams, params.extra, params.gridDimX))
        return false;
    g->nodes++;
    return true;
}

/* Records the kernel nodes of `graph` and of its child graphs; false when
 * some could not be read. */
static bool walk(struct graph_exec *g, CUgraph graph, int depth)
{
    size_t n = 0;
    if (pump_driver.graph_get_nodes(graph, NULL, &n) != CUDA_SUCCESS)
        return false;
    CUgraphNode *nodes = malloc((n > 0 ? n : 1) * sizeof *nodes);
    bool ok = nodes != NULL && pump_driver.graph_get_nodes(graph, nodes, &n) == CUDA_SUCCESS;
    for (size_t i = 0; ok && i < n; i++) {
        CUgraphNodeType type;
        CUgraph child;
        ok = pump_driver.graph_node_get_type(nodes[i], &type) == CUDA_SUCCESS;
        if (!ok)
            break;
        if (type == CU_GRAPH_NODE_TYPE_KERNEL)
            ok = add_node(g, nodes[i], nodes[i]);
        else if (type == CU_GRAPH_NODE_TYPE_GRAPH)
            ok = depth < CHILD_DEPTH_MAX && pump_driver.graph_child_graph != NULL &&
                 pump_driver.graph_child_graph(nodes[i], &child) == CUDA_SUCCESS && walk(g, child, depth + 1);
        else if (type == CU_GRAPH_NODE_TYPE_CONDITIONAL)
            ok = false;  /* its bodies' kernels are out of sight */
        /* other nodes (copies, sets, host functions, events, graph memory) run no kernel */
    }
    free(nodes);
    return ok;
}

static int by_address(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* The exec's allocations: the distinct ones of all its kernels. */
static bool gather(struct graph_exec *g)
{
    uint64_t total = 0;
    for (uint32_t i = 0; i < g->nodes; i++)
        total += g->node[i].count;
    uint64_t *base = total > 0 ? malloc(total * sizeof *base) : NULL;
    if (total > 0 && base == NULL)
        return false;
    uint32_t n = 0;
    for (uint32_t i = 0; i < g->nodes; i++)
        for (uint32_t k = 0; k < g->node[i].count; k++)
            base[n++] = g->node[i].base[k];
    qsort(base, n, sizeof *base, by_address);
    uint32_t distinct = 0;
    for (uint32_t i = 0; i < n; i++)
        if (distinct == 0 || base[distinct - 1] != base[i])
            base[distinct++] = base[i];
    free(g->base);
    g->base = base;
    g->count = distinct;
    return true;
}

/* A fresh record of `graph`'s kernels for exec (unknown when unreadable). */
static struct graph_exec *scan_graph(CUgraphExec exec, CUgraph graph, int device)
{
    struct graph_exec *g = calloc(1, sizeof *g);
    if (g == NULL)
        return NULL;
    g->exec = exec;
    g->device = device;
    bool ok = pump_driver.graph_get_nodes != NULL && pump_driver.graph_node_get_type != NULL &&
              walk(g, graph, 0) && gather(g);
    if (!ok) {
        clear(g);
        g->unknown = true;
        pump_log_once("a CUDA graph's kernel nodes could not all be read: its replays are not prefetched");
    }
    return g;
}

/* Puts g in place of exec's record (NULL: forgets it). */
static void replace(CUgraphExec exec, struct graph_exec *g)
{
    pump_rwlock_wrlock(&execs_lock);
    struct graph_exec **slot = slot_of(exec), *old = *slot;
    if (g != NULL) {
        g->next = old != NULL ? old->next : NULL;
        *slot = g;
    } else if (old != NULL) {
        *slot = old->next;
    }
    pump_rwlock_unlock(&execs_lock);
    exec_free(old);
}

static int current_device(void)
{
    CUdevice device;
    return pump_driver.ctx_get_device != NULL && pump_driver.ctx_get_device(&device) == CUDA_SUCCESS ? device : -1;
}

static void instantiated(CUresult r, CUgraphExec *exec, CUgraph graph)
{
    if (r != CUDA_SUCCESS || exec == NULL || *exec == NULL || !pump_active())
        return;
    struct graph_exec *g = scan_graph(*exec, graph, current_device());
    if (g == NULL)
        return;
    if (!g->unknown)
        PUMP_COUNT(graph_execs_scanned, 1);
    replace(*exec, g);
}

/* ---- instantiation, update, destruction ---- */

#define PUMP_GRAPH_INSTANTIATE_HOOK(id)                                                                    \
    CUresult pump_##id(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node, char *log, size_t log_size) \
    {                                                                                                      \
        PUMP_REAL_OR_RETURN(id, real);                                                                     \
        CUresult r = real(exec, graph, error_node, log, log_size);                                        \
        instantiated(r, exec, graph);                                                                      \
        return r;                                                                                          \
    }
PUMP_GRAPH_INSTANTIATE_HOOK(graph_instantiate)
PUMP_GRAPH_INSTANTIATE_HOOK(graph_instantiate_v2)

CUresult pump_graph_instantiate_with_flags(CUgraphExec *exec, CUgraph graph, unsigned long long flags)
{
    PUMP_REAL_OR_RETURN(graph_instantiate_with_flags, real);
    CUresult r = real(exec, graph, flags);
    instantiated(r, exec, graph);
    return r;
}

#define PUMP_GRAPH_INSTANTIATE_WITH_PARAMS_HOOK(id)                                              \
    CUresult pump_##id(CUgraphExec *exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS *params) \
    {                                                                                            \
        PUMP_REAL_OR_RETURN(id, real);                                                           \
        CUresult r = real(exec, graph, params);                                                  \
        instantiated(r, exec, graph);                                                            \
        return r;                                                                                \
    }
PUMP_GRAPH_INSTANTIATE_WITH_PARAMS_HOOK(graph_instantiate_with_params)
PUMP_GRAPH_INSTANTIATE_WITH_PARAMS_HOOK(graph_instantiate_with_params_ptsz)

/* A whole-graph update: the exec now runs `graph`'s parameters. */
static void updated(CUresult r, CUgraphExec exec, CUgraph graph)
{
    if (r != CUDA_SUCCESS || !pump_active())
        return;
    PUMP_COUNT(graph_exec_updates, 1);
    pump_rwlock_rdlock(&execs_lock);
    struct graph_exec *old = *slot_of(exec);
    int device = old != NULL ? old->device : current_device();
    pump_rwlock_unlock(&execs_lock);
    /* NULL (out of memory) forgets the exec: its replays count as unknown */
    replace(exec, scan_graph(exec, graph, device));
}

CUresult pump_graph_exec_update(CUgraphExec exec, CUgraph graph, CUgraphNode *error_node,
                                CUgraphExecUpdateResult *result)
{
    PUMP_REAL_OR_RETURN(graph_exec_update, real);
    CUresult r = real(exec, graph, error_node, result);
    updated(r, exec, graph);
    return r;
}

CUresult pump_graph_exec_update_v2(CUgraphExec exec, CUgraph graph, CUgraphExecUpdateResultInfo *result)
{
    PUMP_REAL_OR_RETURN(graph_exec_update_v2, real);
    CUresult r = real(exec, graph, result);
    updated(r, exec, graph);
    return r;
}

/* One kernel node's new parameters: that node is scanned again; a node pump
 * does not know (or cannot scan; no kernel given: a child graph swapped)
 * makes the exec unknown. */
static void kernel_node_set(CUresult r, CUgraphExec exec, CUgraphNode node, CUfunction f, CUkernel kernel,
                            void **params, void **extra, unsigned grid_x)
{
    if (r != CUDA_SUCCESS || !pump_active())
        return;
    PUMP_COUNT(graph_exec_updates, 1);
    struct node_use fresh = {.node = node};
    bool scanned = (f != NULL || kernel != NULL) && scan_kernel(&fresh, f, kernel, params, extra, grid_x);
    pump_rwlock_wrlock(&execs_lock);
    struct graph_exec *g = *slot_of(exec);
    struct node_use *use = NULL;
    for (uint32_t i = 0; g != NULL && !g->unknown && i < g->nodes && use == NULL; i++)
        if (g->node[i].node == node)
            use = &g->node[i];
    if (use != NULL && scanned) {
        free(use->base);
        *use = fresh;
        fresh.base = NULL;
    }
    if (g != NULL && (use == NULL || !scanned || !gather(g))) {
        g->unknown = true;
        pump_log_once("a CUDA graph's kernel node changed in a way pump cannot follow: its replays are not prefetched");
    }
    pump_rwlock_unlock(&execs_lock);
    free(fresh.base);
}

CUresult pump_graph_exec_kernel_node_set_params(CUgraphExec exec, CUgraphNode node,
                                                const CUDA_KERNEL_NODE_PARAMS_v1 *p)
{
    PUMP_REAL_OR_RETURN(graph_exec_kernel_node_set_params, real);
    CUresult r = real(exec, node, p);
    if (p != NULL)
        kernel_node_set(r, exec, node, p->func, NULL, p->kernelParams, p->extra, p->gridDimX);
    return r;
}

CUresult pump_graph_exec_kernel_node_set_params_v2(CUgraphExec exec, CUgraphNode node,
                                                   const CUDA_KERNEL_NODE_PARAMS_v2 *p)
{
    PUMP_REAL_OR_RETURN(graph_exec_kernel_node_set_params_v2, real);
    CUresult r = real(exec, node, p);
    if (p != NULL)
        kernel_node_set(r, exec, node, p->func, p->kern, p->kernelParams, p->extra, p->gridDimX);
    return r;
}

CUresult pump_graph_exec_node_set_params(CUgraphExec exec, CUgraphNode node, CUgraphNodeParams *p)
{
    PUMP_REAL_OR_RETURN(graph_exec_node_set_params, real);
    CUresult r = real(exec, node, p);
    if (p != NULL && p->type == CU_GRAPH_NODE_TYPE_KERNEL)
        kernel_node_set(r, exec, node, p->kernel.func, p->kernel.kern, p->kernel.kernelParams, p->kernel.extra,
                        p->kernel.gridDimX);
    else if (p != NULL && p->type == CU_GRAPH_NODE_TYPE_GRAPH)
        kernel_node_set(r, exec, node, NULL, NULL, NULL, NULL, 0);
    return r;
}

CUresult pump_graph_exec_destroy(CUgraphExec exec)
{
    PUMP_REAL_OR_RETURN(graph_exec_destroy, real);
    if (pump_active())
        replace(exec, NULL);
    return real(exec);
}

/* ---- replays ---- */

/* One replay's state between the two steps (on the hook's stack). */
struct replay {
    struct pump_context *context; /* non-NULL: the step after the replay has work */
    CUstream stream;
    struct pump_range **range;    /* the exec's live allocations */
    uint32_t n;
    uint64_t budget;
};

/* Looks up exec's allocations that are still live; false when pump knows
 * nothing (usable) of it. */
static bool live_ranges(CUgraphExec exec, struct replay *r, int *device)
{
    pump_rwlock_rdlock(&execs_lock);
    struct graph_exec *g = *slot_of(exec);
    bool known = g != NULL && !g->unknown;
    if (known && g->count > 0) {
        r->range = malloc(g->count * sizeof *r->range);
        for (uint32_t i = 0; r->range != NULL && i < g->count; i++) {
            struct pump_range *range = pump_ranges_find(g->base[i]);
            if (range != NULL && __atomic_load_n(&range->base, __ATOMIC_RELAXED) == g->base[i])
                r->range[r->n++] = range;
        }
    }
    *device = known ? g->device : -1;
    pump_rwlock_unlock(&execs_lock);
    return known;
}

static uint64_t working_set(const struct replay *r)
{
    uint64_t bytes = 0;  /* an allocation's blocks hold exactly its bytes */
    for (uint32_t i = 0; i < r->n; i++)
        bytes += __atomic_load_n(&r->range[i]->size, __ATOMIC_RELAXED);
    return bytes;
}

static void over_budget_notice(uint64_t bytes, uint64_t budget)
{
    pump_notice_once("a CUDA graph uses %llu MiB of managed memory, more than the budget of %llu MiB; graphs have "
                     "no prefetch node, so its replays are left to page faults (counted in "
                     "graph_launches_over_budget)",
                     (unsigned long long)(bytes >> 20), (unsigned long long)(budget >> 20));
}

static void before_replay(struct replay *r, CUgraphExec exec, CUstream stream)
{
    r->context = NULL;
    r->range = NULL;
    r->n = 0;
    PUMP_COUNT(graph_launches, 1);
    if (PUMP_UNLIKELY(!pump_active()))
        return;
    pump_stream_users_note(stream, NULL, 0);  /* its tensors are never discarded: only its stream counts */
    if (pump_ranges_empty() || !pump_driver.can_prefetch)
        return;
    bool launch_rule = pump_config.policy == PUMP_POLICY_LAUNCH;
    if (!launch_rule && !pump_budget_possible())
        return;
    int device;
    if (!live_ranges(exec, r, &device)) {
        PUMP_COUNT(graph_launches_unknown, 1);
        return;
    }
    struct pump_context *c = r->n > 0 ? pump_context_of(stream) : NULL;
    if (c == NULL || pump_stream_capturing(stream))
        return;  /* nothing is added to a stream being captured */
    if (device >= 0 && device != pump_context_device(c)) {
        pump_log_once("a CUDA graph replayed on another device than it was instantiated on: not prefetched");
        PUMP_COUNT(graph_launches_unknown, 1);
        return;
    }
    r->budget = pump_budget_for(c);
    if (!launch_rule && r->budget != 0) {
        int capturing = 0;
        pump_residency_off_launch(c, stream, &capturing);
    }
    if (launch_rule) {
        uint64_t bytes = working_set(r);
        if (r->budget != 0 && bytes > r->budget) {
            over_budget_notice(bytes, r->budget);
            PUMP_COUNT(graph_launches_over_budget, 1);
        } else {
            pump_residency_graph_launch(c, stream, r->range, r->n, r->budget);
            PUMP_COUNT(graph_launches_prefetched, 1);
        }
    }
    if (r->budget != 0) {
        r->context = c;
        r->stream = stream;
    }
}

static void after_replay(struct replay *r, CUresult result)
{
    if (r->context != NULL && result == CUDA_SUCCESS) {
        struct pump_stats *record = atomic_load_explicit(&pump_stats_record, memory_order_relaxed);
        uint64_t tick = __atomic_load_n(&record->launches_managed, __ATOMIC_RELAXED);
        pump_residency_after_graph_launch(r->context, r->stream, r->range, r->n, r->budget, tick);
    }
    free(r->range);
}

#define PUMP_GRAPH_LAUNCH_HOOK(id, per_thread)                     \
    CUresult pump_##id(CUgraphExec exec, CUstream stream)          \
    {                                                              \
        PUMP_REAL_OR_RETURN(id, real);                             \
        struct replay r;                                           \
        before_replay(&r, exec, pump_stream_of(stream, per_thread)); \
        CUresult result = real(exec, stream);                      \
        after_replay(&r, result);                                  \
        return result;                                             \
    }
PUMP_GRAPH_LAUNCH_HOOK(graph_launch, false)
PUMP_GRAPH_LAUNCH_HOOK(graph_launch_ptsz, true)
