/* not_found.c: why it exists: what a client asked for that fakecuda does not have, counted
 * by name, so that a new runtime's new needs show (in FAKECUDA_STATS' "not_found", and in
 * tests/test_real_client.py) rather than as a hang or a wrong answer: cuGetProcAddress symbols
 * answered SYMBOL_NOT_FOUND, cuGetExportTable ids refused, and slots of a served export table
 * whose behaviour is not modelled (export_tables.c). */
#include "fakecuda_internal.h"

#include <stdio.h>
#include <string.h>

#define FC_NOT_FOUND_MAX 512
static struct { int kind; char name[72]; uint64_t count; } fc_nf[FC_NOT_FOUND_MAX];
static int fc_nnf;
static uint64_t fc_nf_dropped; /* names past FC_NOT_FOUND_MAX: counted, not named */
static pthread_mutex_t fc_nf_mu = PTHREAD_MUTEX_INITIALIZER;
static const char *const fc_nf_kinds[FC_NF_KINDS] = {"cuGetProcAddress", "cuGetExportTable", "export_table_slot"};

void fc_not_found(int kind, const char *name)
{
    pthread_mutex_lock(&fc_nf_mu);
    int i = 0;
    while (i < fc_nnf && !(fc_nf[i].kind == kind && strcmp(fc_nf[i].name, name) == 0)) i++;
    if (i == fc_nnf && fc_nnf < FC_NOT_FOUND_MAX) {
        fc_nf[i].kind = kind;
        snprintf(fc_nf[i].name, sizeof fc_nf[i].name, "%s", name);
        fc_nnf++;
    }
    if (i < fc_nnf) fc_nf[i].count++;
    else fc_nf_dropped++;
    pthread_mutex_unlock(&fc_nf_mu);
}

FC_EXPORT uint64_t fakecuda_not_found_count(int kind)
{
    uint64_t n = 0;
    pthread_mutex_lock(&fc_nf_mu);
    for (int i = 0; i < fc_nnf; i++)
        if (fc_nf[i].kind == kind) n += fc_nf[i].count;
    pthread_mutex_unlock(&fc_nf_mu);
    return n;
}

/* {"cuGetProcAddress": {"cuFoo": 2, ...}, "cuGetExportTable": {...}, "export_table_slot": {...},
 * "unnamed": N}. Names are a symbol (no quote or backslash can be in one that matched nothing:
 * they are written with any such byte as '?'), a UUID, or "UUID[slot]". */
void fc_not_found_write_json(FILE *f)
{
    pthread_mutex_lock(&fc_nf_mu);
    fputc('{', f);
    for (int k = 0; k < FC_NF_KINDS; k++) {
        fprintf(f, "%s\"%s\": {", k ? ", " : "", fc_nf_kinds[k]);
        int first = 1;
        for (int i = 0; i < fc_nnf; i++) {
            if (fc_nf[i].kind != k) continue;
            fputs(first ? "\"" : ", \"", f);
            for (const char *c = fc_nf[i].name; *c; c++) fputc(*c == '"' || *c == '\\' || (unsigned char)*c < 32 ? '?' : *c, f);
            fprintf(f, "\": %llu", (unsigned long long)fc_nf[i].count);
            first = 0;
        }
        fputc('}', f);
    }
    fprintf(f, ", \"unnamed\": %llu}", (unsigned long long)fc_nf_dropped);
    pthread_mutex_unlock(&fc_nf_mu);
}
