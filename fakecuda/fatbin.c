/* fatbin.c: why it exists: what a module load is handed (a fatbin container, the runtime's
 * fatbin wrapper, or a bare cubin), the choice of the cubin the modelled GPU runs, as the
 * driver chooses, and the entries' decompression (zstd and lz4, from the system's libzstd.so.1
 * and liblz4.so.1 loaded at run time: fakecuda builds and runs without them and then refuses
 * compressed images, saying so).
 *
 * Layouts (NVIDIA's fatbinary.h is not public; as read by cricket, RWTH-ACS, cpu-elf2.c, and
 * gpgpu-sim, and checked against PyTorch 2.14's libtorch_cuda.so: 475 containers, 2,975 zstd
 * entries):
 * - the runtime's wrapper (__fatBinC_Wrapper_t, which nvcc emits and __cudaRegisterFatBinary
 *   receives): u32 magic 0x466243b1, u32 version 1, the container's address, a pointer;
 * - a container: u32 magic 0xBA55ED50, u16 version 1, u16 header size, u64 bytes of entries;
 * - an entry: u16 kind (1 PTX, 2 cubin), u16, u32 header size, u64 payload bytes, u32
 *   compressed bytes, u32, u16 u16 (format version), u32 arch (SM number: 90 for sm_90), u32
 *   u32 (name), u64 flags (0x2000 lz4, 0x8000 zstd), u64, u64 decompressed bytes; its payload
 *   follows its header.
 *
 * The choice (CUDA C++ Programming Guide, "Binary Compatibility" and "Application
 * Compatibility"): a cubin for compute capability X.y runs on X.z with z >= y, and an
 * arch-specific one (sm_90a) only on X.y itself; the driver takes the cubin of the highest
 * such y, and only without one JIT-compiles PTX for an architecture at or below the device's.
 * JIT is not modelled: that case is refused with CUDA_ERROR_JIT_COMPILER_NOT_FOUND, the
 * driver's error for a JIT it cannot run; no usable entry at all is CUDA_ERROR_NO_BINARY_FOR_GPU. */
#include "image.h"

#include <dlfcn.h>
#include <elf.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FATBIN_WRAPPER_MAGIC 0x466243b1u
#define FATBIN_MAGIC 0xBA55ED50u
#define ENTRY_PTX 1
#define ENTRY_CUBIN 2
#define FLAG_LZ4 0x2000u
#define FLAG_ZSTD 0x8000u
#define ENTRY_HEADER 64
#define FC_FATBIN_MAX ((uint64_t)1 << 34) /* past any real container (libtorch_cuda's: 333 MB in all) */

static CUresult fail(char *why, CUresult r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, FC_WHY, fmt, ap);
    va_end(ap);
    return r;
}

/* ---- decompressors, from the system's libraries ---- */
typedef size_t (*zstd_decompress_fn)(void *, size_t, const void *, size_t);
typedef unsigned (*zstd_is_error_fn)(size_t);
typedef int (*lz4_decompress_fn)(const char *, char *, int, int, int);
static zstd_decompress_fn fc_zstd;
static zstd_is_error_fn fc_zstd_is_error;
static lz4_decompress_fn fc_lz4;
static char fc_zstd_missing[160], fc_lz4_missing[160];
static pthread_once_t fc_codecs_once = PTHREAD_ONCE_INIT;

/* FAKECUDA_DECOMPRESS=none behaves as a machine without the libraries (for tests). */
static void load_codecs(void)
{
    const char *v = getenv("FAKECUDA_DECOMPRESS");
    if (v && *v && strcmp(v, "system") != 0 && strcmp(v, "none") != 0) {
        fprintf(stderr, "fakecuda: FAKECUDA_DECOMPRESS=%s: allowed: system (the default: libzstd.so.1 and "
                        "liblz4.so.1 if present) or none\n", v);
        exit(2);
    }
    int none = v && strcmp(v, "none") == 0;
    void *z = none ? NULL : dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
    if (z) {
        fc_zstd = (zstd_decompress_fn)dlsym(z, "ZSTD_decompress");
        fc_zstd_is_error = (zstd_is_error_fn)dlsym(z, "ZSTD_isError");
    }
    if (!fc_zstd || !fc_zstd_is_error)
        snprintf(fc_zstd_missing, sizeof fc_zstd_missing, "libzstd.so.1 %s",
                 none ? "not used (FAKECUDA_DECOMPRESS=none)" : "not found (install libzstd1)");
    void *l = none ? NULL : dlopen("liblz4.so.1", RTLD_NOW | RTLD_LOCAL);
    if (l) fc_lz4 = (lz4_decompress_fn)dlsym(l, "LZ4_decompress_safe_partial");
    if (!fc_lz4)
        snprintf(fc_lz4_missing, sizeof fc_lz4_missing, "liblz4.so.1 %s",
                 none ? "not used (FAKECUDA_DECOMPRESS=none)" : "not found (install liblz4-1)");
}

/* The entry's cubin bytes, decompressed: a malloc'd copy. */
static CUresult entry_bytes(const unsigned char *e, const unsigned char *payload, uint64_t n, unsigned char **out,
                            size_t *size, char *why)
{
    uint64_t flags, dsize;
    uint32_t csize;
    memcpy(&flags, e + 40, 8);
    memcpy(&csize, e + 16, 4);
    memcpy(&dsize, e + 56, 8);
    *out = NULL;
    if ((flags & FLAG_ZSTD) && (flags & FLAG_LZ4))
        return fail(why, CUDA_ERROR_INVALID_IMAGE, "fatbin entry flagged both zstd and lz4 (flags 0x%llx)",
                    (unsigned long long)flags);
    if (!(flags & (FLAG_ZSTD | FLAG_LZ4))) dsize = n;
    else if (csize > n || dsize == 0 || dsize > FC_FATBIN_MAX)
        return fail(why, CUDA_ERROR_INVALID_IMAGE, "compressed fatbin entry: %u bytes in a %llu-byte payload, "
                    "%llu decompressed", csize, (unsigned long long)n, (unsigned long long)dsize);
    unsigned char *buf = malloc(dsize ? dsize : 1);
    if (!buf) return fail(why, CUDA_ERROR_OUT_OF_MEMORY, "out of memory for a %llu-byte cubin", (unsigned long long)dsize);
    CUresult r = CUDA_SUCCESS;
    if (flags & FLAG_ZSTD) {
        pthread_once(&fc_codecs_once, load_codecs);
        if (!fc_zstd) r = fail(why, CUDA_ERROR_NOT_SUPPORTED, "a zstd-compressed image needs %s", fc_zstd_missing);
        else {
            size_t got = fc_zstd(buf, dsize, payload, csize);
            if (fc_zstd_is_error(got) || got != dsize)
                r = fail(why, CUDA_ERROR_INVALID_IMAGE, "zstd entry does not decompress to its %llu bytes",
                         (unsigned long long)dsize);
        }
    } else if (flags & FLAG_LZ4) {
        pthread_once(&fc_codecs_once, load_codecs);
        if (!fc_lz4) r = fail(why, CUDA_ERROR_NOT_SUPPORTED, "an lz4-compressed image needs %s", fc_lz4_missing);
        else if (csize > 0x7fffffffu || dsize > 0x7fffffffu ||
                 fc_lz4((const char *)payload, (char *)buf, (int)csize, (int)dsize, (int)dsize) != (int)dsize)
            r = fail(why, CUDA_ERROR_INVALID_IMAGE, "lz4 entry does not decompress to its %llu bytes",
                     (unsigned long long)dsize);
    } else {
        memcpy(buf, payload, dsize);
    }
    if (r != CUDA_SUCCESS) free(buf);
    else {
        *out = buf;
        *size = dsize;
    }
    return r;
}

/* Among the container's entries, the cubin for sm (major*10+minor) as the driver picks it. */
static CUresult select_entry(const unsigned char *fb, int major, int minor, unsigned char **elf, size_t *size, char *why)
{
    uint16_t version, hsize;
    uint64_t total;
    memcpy(&version, fb + 4, 2);
    memcpy(&hsize, fb + 6, 2);
    memcpy(&total, fb + 8, 8);
    if (version != 1 || hsize < 16 || total > FC_FATBIN_MAX)
        return fail(why, CUDA_ERROR_INVALID_IMAGE, "fatbin container version %u, header %u bytes, %llu bytes of "
                    "entries; modelled: version 1, a header of 16 bytes or more", version, hsize,
                    (unsigned long long)total);
    const unsigned char *p = fb + hsize, *end = fb + hsize + total;
    const unsigned char *best = NULL, *best_payload = NULL;
    uint64_t best_n = 0;
    unsigned best_arch = 0, ptx_arch = 0;
    int have_ptx = 0;
    unsigned sm = (unsigned)(major * 10 + minor);
    while (p < end) {
        uint32_t ehs, arch;
        uint64_t n;
        uint16_t kind;
        if ((uint64_t)(end - p) < ENTRY_HEADER)
            return fail(why, CUDA_ERROR_INVALID_IMAGE, "fatbin entry header at %td cut short", p - fb);
        memcpy(&kind, p, 2);
        memcpy(&ehs, p + 4, 4);
        memcpy(&n, p + 8, 8);
        memcpy(&arch, p + 28, 4);
        if (ehs < ENTRY_HEADER || ehs > (uint64_t)(end - p) || n > (uint64_t)(end - p) - ehs)
            return fail(why, CUDA_ERROR_INVALID_IMAGE, "fatbin entry at %td (header %u bytes, payload %llu) runs "
                        "past its container's %llu bytes", p - fb, ehs, (unsigned long long)n,
                        (unsigned long long)total);
        if (kind == ENTRY_CUBIN && arch / 10 == (unsigned)major && arch % 10 <= (unsigned)minor &&
            (!best || arch > best_arch)) {
            best = p;
            best_payload = p + ehs;
            best_n = n;
            best_arch = arch;
        } else if (kind == ENTRY_PTX && arch <= sm && arch >= 10) {
            have_ptx = 1;
            ptx_arch = arch;
        }
        p += ehs + n;
    }
    if (!best) {
        if (have_ptx)
            return fail(why, CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "no cubin for sm_%u; the driver would JIT-compile the "
                        "compute_%u PTX, which fakecuda does not model", sm, ptx_arch);
        return fail(why, CUDA_ERROR_NO_BINARY_FOR_GPU, "no cubin for sm_%u (compute capability %d.%d) and no PTX "
                    "at or below it", sm, major, minor);
    }
    CUresult r = entry_bytes(best, best_payload, best_n, elf, size, why);
    if (r != CUDA_SUCCESS) return r;
    /* The cubin's own header must say what its entry says, and an sm_XYa cubin runs on X.Y only. */
    int bad = 0;
    if (*size < sizeof(Elf64_Ehdr) || memcmp(*elf, ELFMAG, SELFMAG) != 0) bad = 1;
    else {
        Elf64_Ehdr h;
        memcpy(&h, *elf, sizeof h);
        int v8 = h.e_ident[EI_ABIVERSION] >= 8;
        unsigned esm = v8 ? (h.e_flags >> 8) & 0xff : h.e_flags & 0xff;
        int accel = !!(h.e_flags & (v8 ? 0x8u : 0x800u));
        if (esm != best_arch) bad = 2;
        else if (accel && best_arch != sm) bad = 3;
    }
    if (bad) {
        free(*elf);
        *elf = NULL;
        if (bad == 3)
            return fail(why, CUDA_ERROR_NO_BINARY_FOR_GPU, "the only cubin for compute capability %d.x is sm_%ua, "
                        "which runs on %u.%u only", major, best_arch, best_arch / 10, best_arch % 10);
        return fail(why, CUDA_ERROR_INVALID_IMAGE, bad == 1 ? "the sm_%u entry is not an ELF image"
                                                            : "the sm_%u entry's ELF names another SM", best_arch);
    }
    return CUDA_SUCCESS;
}

/* Whether image starts with the 4 bytes of magic (little-endian), read one at a time so that a
 * shorter string (a test's "x") is never read past its end. */
static int starts_with(const void *image, uint32_t magic)
{
    const unsigned char *p = image;
    for (int i = 0; i < 4; i++)
        if (p[i] != ((magic >> (8 * i)) & 0xff)) return 0;
    return 1;
}

CUresult fc_fatbin_select(const void *image, int major, int minor, unsigned char **elf, size_t *size, char *why)
{
    uint32_t magic;
    *elf = NULL;
    *size = 0;
    if (starts_with(image, FATBIN_WRAPPER_MAGIC)) {
        struct { uint32_t magic, version; const void *data, *rest; } w;
        memcpy(&w, image, sizeof w);
        if (w.version != 1)
            return fail(why, CUDA_ERROR_INVALID_IMAGE, "fatbin wrapper version %u; modelled: 1", w.version);
        if (!w.data) return fail(why, CUDA_ERROR_INVALID_IMAGE, "fatbin wrapper without a container");
        memcpy(&magic, w.data, 4);
        if (magic != FATBIN_MAGIC)
            return fail(why, CUDA_ERROR_INVALID_IMAGE, "fatbin wrapper's container has magic 0x%08x, not 0x%08x",
                        magic, FATBIN_MAGIC);
        return select_entry(w.data, major, minor, elf, size, why);
    }
    if (starts_with(image, FATBIN_MAGIC)) return select_entry(image, major, minor, elf, size, why);
    if (!starts_with(image, 0x464c457fu)) return CUDA_SUCCESS; /* no "\x7fELF": the registry's */
    int bad;
    why[0] = 0;
    size_t n = fc_cubin_extent(image, why, &bad);
    if (bad) return CUDA_ERROR_INVALID_IMAGE;
    if (!n) return CUDA_SUCCESS; /* none of the three: the registry's */
    if (!(*elf = malloc(n))) return fail(why, CUDA_ERROR_OUT_OF_MEMORY, "out of memory for a %zu-byte cubin", n);
    memcpy(*elf, image, n);
    *size = n;
    return CUDA_SUCCESS;
}
