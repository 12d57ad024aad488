/* context_storage.c: why it exists: the runtime's context-local storage, the export table
 * c693336e (export_tables.c) as ZLUDA reads it (zluda/src/impl/driver.rs, context.rs): put
 * (ctx, key, value, destructor), delete (ctx, key), get (&value, ctx, key); a NULL context is
 * the current one; get of an absent key answers CUDA_ERROR_INVALID_HANDLE. When a context is
 * destroyed or reset (cuCtxDestroy, cuDevicePrimaryCtxReset, the last primary release) each of
 * its entries' destructors is called with (ctx, key, value) and the entries go. No driver lock
 * is held while a destructor runs (it may call the driver). */
#include "fakecuda_internal.h"

#include <stdlib.h>

typedef void (*fc_cls_dtor)(CUcontext, void *, void *);
typedef struct fc_cls { struct fc_cls *next; CUcontext ctx; void *key, *value; fc_cls_dtor dtor; } fc_cls;
static fc_cls *fc_cls_list;
static pthread_mutex_t fc_cls_mu = PTHREAD_MUTEX_INITIALIZER;

static CUresult cls_ctx(CUcontext *c)
{
    if (!atomic_load(&fc_initialized)) return CUDA_ERROR_NOT_INITIALIZED;
    if (!*c) *c = fc_current_ctx();
    return fc_ctx_valid(*c) ? CUDA_SUCCESS : fc_ctx_error(*c);
}

static fc_cls **find(CUcontext c, void *key)
{
    fc_cls **p = &fc_cls_list;
    while (*p && !((*p)->ctx == c && (*p)->key == key)) p = &(*p)->next;
    return p;
}

CUresult fc_cls_put(CUcontext c, void *key, void *value, fc_cls_dtor dtor)
{
    CUresult r = cls_ctx(&c);
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&fc_cls_mu);
    fc_cls **p = find(c, key);
    if (!*p && (*p = calloc(1, sizeof **p))) {
        (*p)->ctx = c;
        (*p)->key = key;
    }
    if (*p) {
        (*p)->value = value;
        (*p)->dtor = dtor;
    }
    r = *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&fc_cls_mu);
    return r;
}

CUresult fc_cls_delete(CUcontext c, void *key)
{
    CUresult r = cls_ctx(&c);
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&fc_cls_mu);
    fc_cls **p = find(c, key), *gone = *p;
    if (gone) *p = gone->next;
    pthread_mutex_unlock(&fc_cls_mu);
    free(gone);
    return CUDA_SUCCESS;
}

CUresult fc_cls_get(void **value, CUcontext c, void *key)
{
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    CUresult r = cls_ctx(&c);
    if (r != CUDA_SUCCESS) return r;
    pthread_mutex_lock(&fc_cls_mu);
    fc_cls *e = *find(c, key);
    if (e) *value = e->value;
    pthread_mutex_unlock(&fc_cls_mu);
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

void fc_cls_context_gone(CUcontext c)
{
    pthread_mutex_lock(&fc_cls_mu);
    fc_cls *mine = NULL, **p = &fc_cls_list;
    while (*p) {
        fc_cls *e = *p;
        if (e->ctx == c) {
            *p = e->next;
            e->next = mine;
            mine = e;
        } else {
            p = &e->next;
        }
    }
    pthread_mutex_unlock(&fc_cls_mu);
    while (mine) {
        fc_cls *e = mine;
        mine = e->next;
        if (e->dtor) e->dtor(e->ctx, e->key, e->value);
        free(e);
    }
}
