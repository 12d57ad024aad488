/* graphs.c: why it exists: CUDA graphs, apart from the streams that run them: nodes (kernel,
 * host function, memcpy and memset, child graph), graph create/clone/destroy, instantiation (child graphs
 * flattened into an executable graph), launch onto a stream (or into a capture), graphs built
 * by hand and exec updates. capture.c builds graphs from captured work through the fc_graph_*
 * and fc_node_* helpers. */
#include "fakecuda_internal.h"

#include <stdlib.h>
#include <string.h>

enum { FC_NODE_KERNEL, FC_NODE_HOST, FC_NODE_COPY, FC_NODE_GRAPH };
struct CUgraph_st;
struct CUgraphNode_st {
    int type;
    fc_kdef *def;
    fakecuda_dims dims;
    void *args;    /* argument bytes, device layout */
    void **params; /* params[i] = args + offsets[i] (the node's kernelParams) */
    CUhostFn fn;
    void *ud;
    fc_copy copy;             /* FC_NODE_COPY: a memcpy (elem 0) or memset node */
    struct CUgraph_st *child; /* FC_NODE_GRAPH: the node's own copy of the child graph */
};
struct CUgraph_st { fc_link link; uint32_t magic; struct CUgraphNode_st **nodes; size_t n, cap; };
/* An executable graph: its graph's kernel and host nodes, child graphs flattened in
 * order; orig[i] is the graph node nodes[i] was copied from (what exec updates name). */
struct CUgraphExec_st {
    fc_link link;
    uint32_t magic;
    struct CUgraphNode_st **nodes;
    CUgraphNode *orig;
    size_t n, cap;
};
static struct CUgraph_st *graph_clone(const struct CUgraph_st *g);

void fc_node_free(struct CUgraphNode_st *n)
{
    if (!n) return;
    free(n->args);
    free(n->params);
    if (n->child) fc_graph_free(n->child);
    free(n);
}

struct CUgraphNode_st *fc_node_kernel(fc_kdef *def, const fakecuda_dims *d, const void *args)
{
    struct CUgraphNode_st *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->type = FC_NODE_KERNEL;
    n->def = def;
    n->dims = *d;
    n->args = malloc(def->argsize ? def->argsize : 1);
    n->params = calloc(def->nparams ? def->nparams : 1, sizeof(void *));
    if (!n->args || !n->params) { fc_node_free(n); return NULL; }
    if (def->argsize) memcpy(n->args, args, def->argsize);
    for (unsigned i = 0; i < def->nparams; i++) n->params[i] = (char *)n->args + def->offsets[i];
    return n;
}

struct CUgraphNode_st *fc_node_host(CUhostFn fn, void *ud)
{
    struct CUgraphNode_st *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->type = FC_NODE_HOST;
    n->fn = fn;
    n->ud = ud;
    return n;
}

struct CUgraphNode_st *fc_node_copy(const fc_copy *c)
{
    struct CUgraphNode_st *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->type = FC_NODE_COPY;
    n->copy = *c;
    return n;
}

static struct CUgraphNode_st *node_copy(const struct CUgraphNode_st *o)
{
    if (o->type == FC_NODE_KERNEL) return fc_node_kernel(o->def, &o->dims, o->args);
    struct CUgraphNode_st *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    *n = *o;
    if (o->type == FC_NODE_GRAPH && !(n->child = graph_clone(o->child))) {
        free(n);
        return NULL;
    }
    return n;
}

/* A kernel node from a kernel node's parameters (the arguments are copied). */
static CUresult node_from_params(const CUDA_KERNEL_NODE_PARAMS *p, struct CUgraphNode_st **out)
{
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    fc_kdef *def = fc_kernel_def(p->func ? (const void *)p->func : (const void *)p->kern);
    if (!def) return CUDA_ERROR_INVALID_HANDLE;
    if (!p->gridDimX || !p->gridDimY || !p->gridDimZ || !p->blockDimX || !p->blockDimY || !p->blockDimZ)
        return CUDA_ERROR_INVALID_VALUE;
    unsigned char *args = malloc(def->argsize ? def->argsize : 1);
    if (!args) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = fc_pack_args(def, p->kernelParams, p->extra, args);
    fakecuda_dims d = { { p->gridDimX, p->gridDimY, p->gridDimZ }, { p->blockDimX, p->blockDimY, p->blockDimZ },
                        p->sharedMemBytes };
    if (r == CUDA_SUCCESS && !(*out = fc_node_kernel(def, &d, args))) r = CUDA_ERROR_OUT_OF_MEMORY;
    free(args);
    return r;
}

int fc_graph_append(struct CUgraph_st *g, struct CUgraphNode_st *n)
{
    if (!n) return -1;
    if (g->n == g->cap) {
        size_t nc = g->cap ? g->cap * 2 : 8;
        struct CUgraphNode_st **v = realloc(g->nodes, nc * sizeof *v);
        if (!v) { fc_node_free(n); return -1; }
        g->nodes = v;
        g->cap = nc;
    }
    g->nodes[g->n++] = n;
    return 0;
}

struct CUgraph_st *fc_graph_new(void)
{
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->magic = FC_MAGIC_GRAPH;
    fc_keep(&g->link);
    return g;
}

void fc_graph_free(struct CUgraph_st *g)
{
    for (size_t i = 0; i < g->n; i++) fc_node_free(g->nodes[i]);
    free(g->nodes);
    g->magic = FC_MAGIC_DEAD;
    fc_unkeep(&g->link);
    free(g);
}

static struct CUgraph_st *graph_clone(const struct CUgraph_st *g)
{
    struct CUgraph_st *c = fc_graph_new();
    for (size_t i = 0; c && i < g->n; i++)
        if (fc_graph_append(c, node_copy(g->nodes[i])) != 0) {
            fc_graph_free(c);
            c = NULL;
        }
    return c;
}

static void exec_free(struct CUgraphExec_st *e)
{
    for (size_t i = 0; i < e->n; i++) fc_node_free(e->nodes[i]);
    free(e->nodes);
    free(e->orig);
    e->magic = FC_MAGIC_DEAD;
    fc_unkeep(&e->link);
    free(e);
}

/* Appends copies of g's kernel and host nodes to e, child graphs flattened in place. */
static int exec_flatten(struct CUgraphExec_st *e, const struct CUgraph_st *g)
{
    for (size_t i = 0; i < g->n; i++) {
        struct CUgraphNode_st *o = g->nodes[i];
        if (o->type == FC_NODE_GRAPH) {
            if (exec_flatten(e, o->child) != 0) return -1;
            continue;
        }
        if (e->n == e->cap) {
            size_t nc = e->cap ? e->cap * 2 : 8;
            struct CUgraphNode_st **v = realloc(e->nodes, nc * sizeof *v);
            if (v) e->nodes = v;
            CUgraphNode *w = v ? realloc(e->orig, nc * sizeof *w) : NULL;
            if (!v || !w) return -1;
            e->orig = w;
            e->cap = nc;
        }
        if (!(e->nodes[e->n] = node_copy(o))) return -1;
        e->orig[e->n++] = o;
    }
    return 0;
}

static struct CUgraphExec_st *exec_of(const struct CUgraph_st *g)
{
    struct CUgraphExec_st *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    e->magic = FC_MAGIC_EXEC;
    fc_keep(&e->link);
    if (exec_flatten(e, g) != 0) {
        exec_free(e);
        return NULL;
    }
    return e;
}

static CUresult instantiate(CUgraphExec *ph, CUgraph g, unsigned long long flags, CUgraphNode *err_node, char *log,
                            size_t log_size)
{
    (void)flags; /* auto-free, upload, device launch, priority: not modelled */
    if (err_node) *err_node = NULL;
    if (log && log_size) log[0] = '\0';
    if (!ph || !g || g->magic != FC_MAGIC_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphExec_st *e = exec_of(g);
    if (!e) return CUDA_ERROR_OUT_OF_MEMORY;
    *ph = e;
    return CUDA_SUCCESS;
}
FC_DEF(cuGraphInstantiateWithFlags, 11040, (CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags),
       instantiate(phGraphExec, hGraph, flags, NULL, NULL, 0));
FC_DEF(cuGraphInstantiate, 10000, (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
        char *logBuffer, size_t bufferSize),
       instantiate(phGraphExec, hGraph, 0, phErrorNode, logBuffer, bufferSize));
FC_DEF(cuGraphInstantiate_v2, 11000, (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
        char *logBuffer, size_t bufferSize),
       instantiate(phGraphExec, hGraph, 0, phErrorNode, logBuffer, bufferSize));

static CUresult instantiate_with_params(CUgraphExec *ph, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS *p)
{
    if (!p) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = instantiate(ph, g, p->flags, &p->hErrNode_out, NULL, 0);
    p->result_out = r == CUDA_SUCCESS ? CUDA_GRAPH_INSTANTIATE_SUCCESS : CUDA_GRAPH_INSTANTIATE_ERROR;
    return r;
}
FC_DEF(cuGraphInstantiateWithParams, 12000, (CUgraphExec *phGraphExec, CUgraph hGraph,
        CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams),
       instantiate_with_params(phGraphExec, hGraph, instantiateParams));
FC_DEF(cuGraphInstantiateWithParams_ptsz, 12000, (CUgraphExec *phGraphExec, CUgraph hGraph,
        CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams),
       instantiate_with_params(phGraphExec, hGraph, instantiateParams));

/* The graph's nodes run in capture order, as one block of ops on the stream (into a
 * capturing stream they are appended to that capture instead). */
static CUresult graph_launch(CUgraphExec e, CUstream h)
{
    if (!e || e->magic != FC_MAGIC_EXEC) return CUDA_ERROR_INVALID_VALUE;
    FC_STREAM_OR_RETURN(h);
    fc_cost(FC_E_GRAPH_LAUNCH, FAKECUDA_GRAPH_LAUNCH_HOST_NS);
    if (fc_stream_capturing(s)) {
        for (size_t i = 0; i < e->n; i++) {
            int r = fc_capture_append(s, node_copy(e->nodes[i]));
            if (r != FC_NOT_CAPTURING && r != CUDA_SUCCESS) return (CUresult)r;
        }
        return CUDA_SUCCESS;
    }
    fc_op *first = NULL, *last = NULL;
    for (size_t i = 0; i < e->n; i++) {
        struct CUgraphNode_st *n = e->nodes[i];
        fc_op *op;
        if (n->type == FC_NODE_KERNEL) {
            op = fc_kernel_op(n->def, &n->dims, n->args, NULL, 0);
        } else if ((op = calloc(1, sizeof *op)) && n->type == FC_NODE_COPY) {
            op->kind = FC_OP_COPY;
            op->u.copy = n->copy;
        } else if (op) {
            op->kind = FC_OP_HOSTFN;
            op->u.h.fn = n->fn;
            op->u.h.ud = n->ud;
        }
        if (!op) {
            while (first) { fc_op *nx = first->next; free(first); first = nx; }
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        if (last) last->next = op;
        else first = op;
        last = op;
    }
    fc_enqueue_chain(s, first, last, e->n);
    return CUDA_SUCCESS;
}
FC_DEF(cuGraphLaunch, 10000, (CUgraphExec hGraphExec, CUstream hStream), graph_launch(hGraphExec, hStream));
FC_DEF(cuGraphLaunch_ptsz, 10000, (CUgraphExec hGraphExec, CUstream hStream), graph_launch(hGraphExec, hStream));

FC_EXPORT CUresult cuGraphDestroy(CUgraph hGraph)
{
    FC_ENTRY(cuGraphDestroy, 10000);
    if (!hGraph || hGraph->magic != FC_MAGIC_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    fc_graph_free(hGraph);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuGraphDestroy);

FC_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec)
{
    FC_ENTRY(cuGraphExecDestroy, 10000);
    if (!hGraphExec || hGraphExec->magic != FC_MAGIC_EXEC) return CUDA_ERROR_INVALID_VALUE;
    exec_free(hGraphExec);
    return CUDA_SUCCESS;
}
FC_ALIAS(cuGraphExecDestroy);

/* ---- graphs built by hand, and exec updates (nodes are a linear list: dependencies
 * are validated, not recorded) ---- */
FC_EXPORT CUresult cuGraphCreate(CUgraph *phGraph, unsigned int flags)
{
    FC_ENTRY(cuGraphCreate, 10000);
    if (!phGraph || flags) return CUDA_ERROR_INVALID_VALUE;
    return (*phGraph = fc_graph_new()) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
FC_ALIAS(cuGraphCreate);

static CUresult add_node(CUgraphNode *ph, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                         struct CUgraphNode_st *n)
{
    if (!ph || !g || g->magic != FC_MAGIC_GRAPH || (ndeps && !deps)) {
        fc_node_free(n);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (fc_graph_append(g, n) != 0) return CUDA_ERROR_OUT_OF_MEMORY;
    *ph = n;
    return CUDA_SUCCESS;
}

static CUresult add_kernel_node(CUgraphNode *ph, CUgraph g, const CUgraphNode *deps, size_t ndeps,
                                const CUDA_KERNEL_NODE_PARAMS *p)
{
    struct CUgraphNode_st *n = NULL;
    CUresult r = node_from_params(p, &n);
    return r == CUDA_SUCCESS ? add_node(ph, g, deps, ndeps, n) : r;
}
FC_DEF(cuGraphAddKernelNode_v2, 12000, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
        size_t numDependencies, const CUDA_KERNEL_NODE_PARAMS *nodeParams),
       add_kernel_node(phGraphNode, hGraph, dependencies, numDependencies, nodeParams));

/* The child graph is copied, as the driver clones it. */
static CUresult add_child_node(CUgraphNode *ph, CUgraph g, const CUgraphNode *deps, size_t ndeps, CUgraph child)
{
    if (!child || child->magic != FC_MAGIC_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *n = calloc(1, sizeof *n);
    if (!n || !(n->child = graph_clone(child))) {
        free(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    n->type = FC_NODE_GRAPH;
    return add_node(ph, g, deps, ndeps, n);
}
FC_DEF(cuGraphAddChildGraphNode, 10000, (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
        size_t numDependencies, CUgraph childGraph),
       add_child_node(phGraphNode, hGraph, dependencies, numDependencies, childGraph));

FC_EXPORT CUresult cuGraphChildGraphNodeGetGraph(CUgraphNode hNode, CUgraph *phGraph)
{
    FC_ENTRY(cuGraphChildGraphNodeGetGraph, 10000);
    if (!hNode || !phGraph || hNode->type != FC_NODE_GRAPH) return CUDA_ERROR_INVALID_VALUE;
    *phGraph = hNode->child;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuGraphChildGraphNodeGetGraph);

/* The exec's copy of graph node hNode (a kernel node) gets new parameters. */
static CUresult exec_kernel_node_set(CUgraphExec e, CUgraphNode hNode, const CUDA_KERNEL_NODE_PARAMS *p)
{
    if (!e || e->magic != FC_MAGIC_EXEC || !hNode) return CUDA_ERROR_INVALID_VALUE;
    size_t i = 0;
    while (i < e->n && !(e->orig[i] == hNode && e->nodes[i]->type == FC_NODE_KERNEL)) i++;
    if (i == e->n) return CUDA_ERROR_INVALID_VALUE;
    struct CUgraphNode_st *n = NULL;
    CUresult r = node_from_params(p, &n);
    if (r != CUDA_SUCCESS) return r;
    fc_node_free(e->nodes[i]);
    e->nodes[i] = n;
    return CUDA_SUCCESS;
}
FC_DEF(cuGraphExecKernelNodeSetParams_v2, 12000, (CUgraphExec hGraphExec, CUgraphNode hNode,
        const CUDA_KERNEL_NODE_PARAMS *nodeParams),
       exec_kernel_node_set(hGraphExec, hNode, nodeParams));

/* The exec takes g's parameters when g has the same nodes in the same order. */
static CUresult exec_update(CUgraphExec e, CUgraph g, CUgraphExecUpdateResultInfo *info)
{
    if (!e || e->magic != FC_MAGIC_EXEC || !g || g->magic != FC_MAGIC_GRAPH || !info)
        return CUDA_ERROR_INVALID_VALUE;
    memset(info, 0, sizeof *info);
    struct CUgraphExec_st *fresh = exec_of(g);
    if (!fresh) return CUDA_ERROR_OUT_OF_MEMORY;
    int same = fresh->n == e->n;
    for (size_t i = 0; same && i < e->n; i++) same = fresh->nodes[i]->type == e->nodes[i]->type;
    if (!same) {
        exec_free(fresh);
        info->result = CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED;
        return CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    }
    for (size_t i = 0; i < e->n; i++) {
        struct CUgraphNode_st *old = e->nodes[i];
        e->nodes[i] = fresh->nodes[i];
        fresh->nodes[i] = old;
        e->orig[i] = fresh->orig[i];
    }
    exec_free(fresh);
    info->result = CU_GRAPH_EXEC_UPDATE_SUCCESS;
    return CUDA_SUCCESS;
}
FC_DEF(cuGraphExecUpdate_v2, 12000, (CUgraphExec hGraphExec, CUgraph hGraph, CUgraphExecUpdateResultInfo *resultInfo),
       exec_update(hGraphExec, hGraph, resultInfo));

FC_EXPORT CUresult cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
    FC_ENTRY(cuGraphGetNodes, 10000);
    if (!hGraph || hGraph->magic != FC_MAGIC_GRAPH || !numNodes) return CUDA_ERROR_INVALID_VALUE;
    if (nodes)
        for (size_t i = 0; i < *numNodes; i++) nodes[i] = i < hGraph->n ? hGraph->nodes[i] : NULL;
    if (!nodes || *numNodes > hGraph->n) *numNodes = hGraph->n;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuGraphGetNodes);

FC_EXPORT CUresult cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)
{
    FC_ENTRY(cuGraphNodeGetType, 10000);
    if (!hNode || !type) return CUDA_ERROR_INVALID_VALUE;
    *type = hNode->type == FC_NODE_KERNEL ? CU_GRAPH_NODE_TYPE_KERNEL
            : hNode->type == FC_NODE_GRAPH ? CU_GRAPH_NODE_TYPE_GRAPH
            : hNode->type == FC_NODE_COPY  ? (hNode->copy.elem ? CU_GRAPH_NODE_TYPE_MEMSET : CU_GRAPH_NODE_TYPE_MEMCPY)
                                           : CU_GRAPH_NODE_TYPE_HOST;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuGraphNodeGetType);

FC_EXPORT CUresult cuGraphKernelNodeGetParams_v2(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS *nodeParams)
{
    FC_ENTRY(cuGraphKernelNodeGetParams_v2, 12000);
    if (!hNode || !nodeParams || hNode->type != FC_NODE_KERNEL) return CUDA_ERROR_INVALID_VALUE;
    memset(nodeParams, 0, sizeof *nodeParams);
    /* The node keeps its kernel, not the handle it was made with: the driver's own handle
     * for it, which a module unload does not free (pump learns it here, of unknown origin). */
    nodeParams->func = &hNode->def->func;
    nodeParams->gridDimX = hNode->dims.grid[0];
    nodeParams->gridDimY = hNode->dims.grid[1];
    nodeParams->gridDimZ = hNode->dims.grid[2];
    nodeParams->blockDimX = hNode->dims.block[0];
    nodeParams->blockDimY = hNode->dims.block[1];
    nodeParams->blockDimZ = hNode->dims.block[2];
    nodeParams->sharedMemBytes = hNode->dims.shared_mem;
    nodeParams->kernelParams = hNode->params;
    return CUDA_SUCCESS;
}
FC_ALIAS(cuGraphKernelNodeGetParams_v2);

