/* cubin.c: why it exists: a cubin (the ELF a GPU runs) read as the driver reads it for what
 * fakecuda models: which kernels and globals it defines and each kernel's parameter layout.
 * Everything is bounds-checked: a malformed image is refused with its reason, never read past.
 *
 * The format is NVIDIA's and undocumented; what is read here is as public tools read it:
 * - ELF64, little-endian, e_machine EM_CUDA (190, glibc elf.h). e_flags name the SM: ELF ABI
 *   version 8 (CUDA 13) keeps it in bits 8..15 with the arch-specific 'a' bit at 0x8, earlier
 *   versions in bits 0..7 with 'a' at 0x800 (LLVM llvm/BinaryFormat/ELF.h, EF_CUDA_SM_MASK,
 *   EF_CUDA_ACCELERATORS, EF_CUDA_ACCELERATORS_V1).
 * - A kernel is an STT_FUNC symbol marked STO_CUDA_ENTRY (st_other 0x10) in its own section
 *   .text.<name>; its attributes are in .nv.info.<name>. Device functions (st_other 0, in
 *   other sections) are not kernels. Globals are STT_OBJECT symbols in a .nv.global* or
 *   .nv.constant* section, of st_size bytes. (Checked over PyTorch 2.14's sm_90 cubins.)
 * - .nv.info records: a format byte, an attribute byte, then EIFMT_NVAL (1), EIFMT_BVAL (2)
 *   and EIFMT_HVAL (3) carry 2 bytes inline, EIFMT_SVAL (4) a u16 length and that many bytes
 *   (cricket, RWTH-ACS, cpu-elf2.c; gpgpu-sim's cuobjdump reader; the 4-byte-aligned walk is
 *   what `cuobjdump -elf` prints). EIATTR_KPARAM_INFO (0x17, SVAL, 12 bytes: u32 index, u16
 *   ordinal, u16 offset, u32 flags with the size in bits 18..31), EIATTR_KPARAM_INFO_V2 (0x45,
 *   SVAL, 12-byte records: u32 index, u16 ordinal, u16 offset, u16 size: V1's 14-bit size ends
 *   at 16,383 bytes) and EIATTR_CBANK_PARAM_SIZE (0x19, HVAL: the parameter space's bytes). */
#include "image.h"

#include <elf.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EM_CUDA_ 190
#define STO_CUDA_ENTRY 0x10
#define EIFMT_NVAL 1
#define EIFMT_BVAL 2
#define EIFMT_HVAL 3
#define EIFMT_SVAL 4
#define EIATTR_KPARAM_INFO 0x17
#define EIATTR_CBANK_PARAM_SIZE 0x19
#define EIATTR_KPARAM_INFO_V2 0x45
#define FC_CUBIN_MAX ((size_t)1 << 32) /* larger than any cubin: a header claiming more is bad */
#define FC_PARAM_SPACE_MAX 32764       /* the driver's limit on a kernel's parameters (CUDA 12.1+) */

static int refuse(char *why, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, FC_WHY, fmt, ap);
    va_end(ap);
    return -1;
}

/* [off, off+len) inside [0, size) without overflow. */
static int inside(uint64_t off, uint64_t len, uint64_t size) { return off <= size && len <= size - off; }

static int header_ok(const Elf64_Ehdr *h, char *why)
{
    if (memcmp(h->e_ident, ELFMAG, SELFMAG) != 0) return refuse(why, "not an ELF image");
    if (h->e_ident[EI_CLASS] != ELFCLASS64 || h->e_ident[EI_DATA] != ELFDATA2LSB)
        return refuse(why, "a cubin is a 64-bit little-endian ELF (class %u, data %u)", h->e_ident[EI_CLASS],
                      h->e_ident[EI_DATA]);
    if (h->e_machine != EM_CUDA_) return refuse(why, "ELF machine %u is not EM_CUDA (190)", h->e_machine);
    if (h->e_shentsize != sizeof(Elf64_Shdr) || h->e_shnum == 0 || h->e_shstrndx >= h->e_shnum)
        return refuse(why, "bad section table (entry size %u, %u sections, names in %u)", h->e_shentsize,
                      h->e_shnum, h->e_shstrndx);
    return 0;
}

size_t fc_cubin_extent(const void *image, char *why, int *bad)
{
    Elf64_Ehdr h;
    memcpy(&h, image, sizeof h);
    *bad = 0;
    if (memcmp(h.e_ident, ELFMAG, SELFMAG) != 0) return 0;
    if (header_ok(&h, why) ||
        (!inside(h.e_shoff, (uint64_t)h.e_shnum * sizeof(Elf64_Shdr), FC_CUBIN_MAX) &&
         refuse(why, "section table at %llu runs past any cubin", (unsigned long long)h.e_shoff))) {
        *bad = 1;
        return 0;
    }
    uint64_t end = h.e_shoff + (uint64_t)h.e_shnum * sizeof(Elf64_Shdr);
    for (unsigned i = 0; i < h.e_shnum; i++) {
        Elf64_Shdr s;
        memcpy(&s, (const char *)image + h.e_shoff + (uint64_t)i * sizeof s, sizeof s);
        if (s.sh_type == SHT_NOBITS) continue;
        if (!inside(s.sh_offset, s.sh_size, FC_CUBIN_MAX)) {
            refuse(why, "section %u runs past any cubin", i);
            *bad = 1;
            return 0;
        }
        if (s.sh_offset + s.sh_size > end) end = s.sh_offset + s.sh_size;
    }
    return end;
}

static const Elf64_Shdr *shdr(const fc_cubin *c, unsigned i)
{
    const Elf64_Ehdr *h = (const Elf64_Ehdr *)c->elf;
    return (const Elf64_Shdr *)(c->elf + h->e_shoff) + i;
}

/* The NUL-terminated string at off of string table section t, or NULL. */
static const char *str_at(const fc_cubin *c, unsigned t, uint64_t off)
{
    const Elf64_Shdr *s = shdr(c, t);
    if (s->sh_type != SHT_STRTAB || off >= s->sh_size) return NULL;
    const char *p = (const char *)c->elf + s->sh_offset + off;
    return memchr(p, 0, s->sh_size - off) ? p : NULL;
}

static const char *section_name(const fc_cubin *c, unsigned i)
{
    const Elf64_Ehdr *h = (const Elf64_Ehdr *)c->elf;
    return i < h->e_shnum ? str_at(c, h->e_shstrndx, shdr(c, i)->sh_name) : NULL;
}

static unsigned find_section(const fc_cubin *c, const char *prefix, const char *name)
{
    const Elf64_Ehdr *h = (const Elf64_Ehdr *)c->elf;
    size_t pl = strlen(prefix);
    for (unsigned i = 1; i < h->e_shnum; i++) {
        const char *n = section_name(c, i);
        if (n && strncmp(n, prefix, pl) == 0 && strcmp(n + pl, name) == 0) return i;
    }
    return 0;
}

static int sections_ok(const fc_cubin *c, char *why)
{
    const Elf64_Ehdr *h = (const Elf64_Ehdr *)c->elf;
    if (!inside(h->e_shoff, (uint64_t)h->e_shnum * sizeof(Elf64_Shdr), c->size) || h->e_shoff % 8)
        return refuse(why, "section table (%u at %llu) outside the %zu-byte cubin", h->e_shnum,
                      (unsigned long long)h->e_shoff, c->size);
    for (unsigned i = 0; i < h->e_shnum; i++) {
        const Elf64_Shdr *s = shdr(c, i);
        if (s->sh_type != SHT_NOBITS && !inside(s->sh_offset, s->sh_size, c->size))
            return refuse(why, "section %u (%llu bytes at %llu) outside the %zu-byte cubin", i,
                          (unsigned long long)s->sh_size, (unsigned long long)s->sh_offset, c->size);
    }
    if (shdr(c, h->e_shstrndx)->sh_type != SHT_STRTAB) return refuse(why, "section names not in a string table");
    return 0;
}

static int add_sym(fc_cubin_sym **v, unsigned *n, const char *name, uint64_t size, unsigned info)
{
    fc_cubin_sym *nv = realloc(*v, (*n + 1) * sizeof **v);
    if (!nv) return -1;
    nv[(*n)++] = (fc_cubin_sym){ name, size, info };
    *v = nv;
    return 0;
}

static int symbols(fc_cubin *c, char *why)
{
    const Elf64_Ehdr *h = (const Elf64_Ehdr *)c->elf;
    unsigned t = 0;
    for (unsigned i = 1; i < h->e_shnum && !t; i++)
        if (shdr(c, i)->sh_type == SHT_SYMTAB) t = i;
    if (!t) return 0; /* no symbols: no kernels, no globals */
    const Elf64_Shdr *st = shdr(c, t);
    if (st->sh_entsize != sizeof(Elf64_Sym) || st->sh_link >= h->e_shnum || st->sh_offset % 8)
        return refuse(why, "bad symbol table (entry size %llu, strings in %u)", (unsigned long long)st->sh_entsize,
                      st->sh_link);
    const Elf64_Sym *sym = (const Elf64_Sym *)(c->elf + st->sh_offset);
    for (size_t i = 1; i < st->sh_size / sizeof *sym; i++) {
        unsigned type = ELF64_ST_TYPE(sym[i].st_info);
        if ((type != STT_FUNC && type != STT_OBJECT) || sym[i].st_shndx == SHN_UNDEF ||
            sym[i].st_shndx >= h->e_shnum)
            continue;
        const char *name = str_at(c, st->sh_link, sym[i].st_name);
        const char *sec = section_name(c, sym[i].st_shndx);
        if (!name || !sec) return refuse(why, "symbol %zu: name or section name outside its string table", i);
        int bad = 0;
        if (type == STT_FUNC && (sym[i].st_other & STO_CUDA_ENTRY) && strncmp(sec, ".text.", 6) == 0 &&
            strcmp(sec + 6, name) == 0)
            bad = add_sym(&c->kernels, &c->nkernels, name, 0, find_section(c, ".nv.info.", name));
        else if (type == STT_OBJECT && (strncmp(sec, ".nv.global", 10) == 0 || strncmp(sec, ".nv.constant", 12) == 0))
            bad = add_sym(&c->globals, &c->nglobals, name, sym[i].st_size, 0);
        if (bad) return refuse(why, "out of memory");
    }
    return 0;
}

fc_cubin *fc_cubin_open(unsigned char *elf, size_t size, char *why)
{
    fc_cubin *c = calloc(1, sizeof *c);
    if (!c) {
        free(elf);
        refuse(why, "out of memory");
        return NULL;
    }
    c->elf = elf;
    c->size = size;
    const Elf64_Ehdr *h = (const Elf64_Ehdr *)elf;
    if (size < sizeof *h) refuse(why, "a %zu-byte cubin is shorter than its ELF header", size);
    else if (!header_ok(h, why) && !sections_ok(c, why) && !symbols(c, why)) {
        int v8 = h->e_ident[EI_ABIVERSION] >= 8;
        c->sm = v8 ? (h->e_flags >> 8) & 0xff : h->e_flags & 0xff;
        c->arch_specific = !!(h->e_flags & (v8 ? 0x8u : 0x800u));
        return c;
    }
    fc_cubin_free(c);
    return NULL;
}

void fc_cubin_free(fc_cubin *c)
{
    if (!c) return;
    free(c->kernels);
    free(c->globals);
    free(c->elf);
    free(c);
}

typedef struct param { unsigned ordinal; size_t offset, size; } param;

static int by_offset(const void *a, const void *b)
{
    const param *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* The layout's rules, as every one of PyTorch's 22,529 sm_90 KPARAM_INFO kernels keeps them
 * (issue 26): ordinals 0..n-1 once each, no two parameters overlapping, all inside the
 * parameter space, which stays within the driver's 32,764 bytes. */
static int layout_ok(const char *kernel, param *p, unsigned n, long cbank, char *why)
{
    if (n && cbank < 0) return refuse(why, "%s: parameters without EIATTR_CBANK_PARAM_SIZE", kernel);
    if (cbank > FC_PARAM_SPACE_MAX)
        return refuse(why, "%s: parameter space of %ld bytes; allowed: up to %d", kernel, cbank, FC_PARAM_SPACE_MAX);
    unsigned char *seen = calloc(n ? n : 1, 1);
    if (!seen) return refuse(why, "out of memory");
    int bad = 0;
    for (unsigned i = 0; i < n && !bad; i++) {
        if (p[i].ordinal >= n || seen[p[i].ordinal])
            bad = refuse(why, "%s: parameter ordinal %u repeated or outside 0..%u", kernel, p[i].ordinal, n - 1);
        else if (p[i].size == 0)
            bad = refuse(why, "%s: parameter %u has size 0", kernel, p[i].ordinal);
        else seen[p[i].ordinal] = 1;
    }
    free(seen);
    if (bad) return -1;
    qsort(p, n, sizeof *p, by_offset);
    for (unsigned i = 0; i < n; i++) {
        if (i + 1 < n && p[i].offset + p[i].size > p[i + 1].offset)
            return refuse(why, "%s: parameters %u (%zu bytes at %zu) and %u (at %zu) overlap", kernel, p[i].ordinal,
                          p[i].size, p[i].offset, p[i + 1].ordinal, p[i + 1].offset);
        if (p[i].offset + p[i].size > (size_t)cbank)
            return refuse(why, "%s: parameter %u (%zu bytes at %zu) ends past the %ld-byte parameter space", kernel,
                          p[i].ordinal, p[i].size, p[i].offset, cbank);
    }
    return 0;
}

int fc_cubin_layout(const fc_cubin *c, unsigned k, unsigned *n, size_t **offsets, size_t **sizes, size_t *argsize,
                    char *why)
{
    const char *kernel = c->kernels[k].name;
    *n = 0;
    *offsets = *sizes = NULL;
    *argsize = 0;
    if (!c->kernels[k].info) return 0; /* no attributes: no parameters */
    const Elf64_Shdr *s = shdr(c, c->kernels[k].info);
    const unsigned char *d = c->elf + s->sh_offset;
    size_t len = s->sh_size, np = 0;
    long cbank = -1;
    param *p = malloc((len / 16 + 1) * sizeof *p); /* a parameter record takes 16 bytes at least */
    if (!p) return refuse(why, "out of memory");
    for (size_t at = 0; at < len;) {
        if (len - at < 4) {
            free(p);
            return refuse(why, "%s: .nv.info record at %zu cut short", kernel, at);
        }
        unsigned fmt = d[at], attr = d[at + 1];
        uint16_t vlen = 2;
        const unsigned char *v = d + at + 2;
        if (fmt == EIFMT_SVAL) {
            memcpy(&vlen, d + at + 2, 2);
            v = d + at + 4;
            if (len - at - 4 < vlen) {
                free(p);
                return refuse(why, "%s: .nv.info attribute 0x%x of %u bytes at %zu runs past its section", kernel,
                              attr, vlen, at);
            }
        } else if (fmt != EIFMT_NVAL && fmt != EIFMT_BVAL && fmt != EIFMT_HVAL) {
            free(p);
            return refuse(why, "%s: .nv.info format 0x%x at %zu; known: 1 to 4", kernel, fmt, at);
        }
        int bad = 0;
        if (attr == EIATTR_CBANK_PARAM_SIZE) {
            uint16_t sz;
            memcpy(&sz, v, 2);
            if (fmt != EIFMT_HVAL) bad = 1;
            cbank = sz;
        } else if (attr == EIATTR_KPARAM_INFO || attr == EIATTR_KPARAM_INFO_V2) {
            if (fmt != EIFMT_SVAL || vlen != 12) bad = 1;
            else {
                uint16_t ord, off;
                memcpy(&ord, v + 4, 2);
                memcpy(&off, v + 6, 2);
                size_t size;
                if (attr == EIATTR_KPARAM_INFO) {
                    uint32_t flags;
                    memcpy(&flags, v + 8, 4);
                    size = (flags >> 18) & 0x3fff;
                } else {
                    uint16_t sz;
                    memcpy(&sz, v + 8, 2);
                    size = sz;
                }
                p[np++] = (param){ ord, off, size };
            }
        }
        if (bad) {
            free(p);
            return refuse(why, "%s: .nv.info attribute 0x%x in format %u with %u bytes; expected %s", kernel, attr,
                          fmt, vlen, attr == EIATTR_CBANK_PARAM_SIZE ? "EIFMT_HVAL" : "EIFMT_SVAL of 12 bytes");
        }
        at += (fmt == EIFMT_SVAL ? 4u + vlen : 4u);
    }
    if (layout_ok(kernel, p, (unsigned)np, cbank, why)) {
        free(p);
        return -1;
    }
    *offsets = calloc(np ? np : 1, sizeof **offsets);
    *sizes = calloc(np ? np : 1, sizeof **sizes);
    if (!*offsets || !*sizes) {
        free(p);
        free(*offsets);
        free(*sizes);
        *offsets = *sizes = NULL;
        return refuse(why, "out of memory");
    }
    for (size_t i = 0; i < np; i++) {
        (*offsets)[p[i].ordinal] = p[i].offset;
        (*sizes)[p[i].ordinal] = p[i].size;
    }
    free(p);
    *n = (unsigned)np;
    *argsize = cbank > 0 ? (size_t)cbank : 0;
    return 0;
}
