/* image.h: real kernel images, shared by fatbin.c (containers, entry choice, decompression),
 * cubin.c (the ELF and its .nv.info), images.c (what modules and libraries hold) and the
 * module and launch code (modules.c, kernels.c). Every refusal comes with a reason (why,
 * a NUL-terminated sentence) that the caller prints. */
#ifndef FAKECUDA_IMAGE_H
#define FAKECUDA_IMAGE_H

#include "fakecuda_internal.h"

#define FC_WHY 256 /* bytes of a refusal's reason */

/* ---- fatbin.c ---- */
/* The cubin a module load gets from image (a fatbin container, the runtime's fatbin wrapper,
 * or a bare cubin) for a device of compute capability major.minor: CUDA_SUCCESS with *elf a
 * malloc'd copy (decompressed) of *size bytes; CUDA_SUCCESS with *elf NULL when image is none
 * of these (PTX text, or a test's name for the registry of host kernels); else the driver's
 * error with why filled in. */
CUresult fc_fatbin_select(const void *image, int major, int minor, unsigned char **elf, size_t *size, char *why);

/* ---- cubin.c ---- */
typedef struct fc_cubin_sym { const char *name; uint64_t size; unsigned info; } fc_cubin_sym;
typedef struct fc_cubin {
    unsigned char *elf; /* owned */
    size_t size;
    unsigned sm;        /* from e_flags */
    int arch_specific;  /* an sm_XYa cubin: runs on compute capability X.Y only */
    unsigned nkernels, nglobals;
    fc_cubin_sym *kernels; /* info: the .nv.info.<name> section index, 0 if none */
    fc_cubin_sym *globals; /* size: st_size */
} fc_cubin;
/* Checks the ELF (EM_CUDA, in-bounds section table, symbol and string tables) and lists its
 * kernels and globals; takes elf (freed on failure too). NULL with why on a refusal. */
fc_cubin *fc_cubin_open(unsigned char *elf, size_t size, char *why);
void fc_cubin_free(fc_cubin *c);
/* The parameter layout of kernel k, from its .nv.info section: n parameters (by ordinal) at
 * offsets[] of sizes[] (malloc'd, freed by the caller), in a parameter space of *argsize bytes
 * (EIATTR_CBANK_PARAM_SIZE). 0, or -1 with why. */
int fc_cubin_layout(const fc_cubin *c, unsigned k, unsigned *n, size_t **offsets, size_t **sizes, size_t *argsize,
                    char *why);
/* The extent of a bare cubin at image (64-bit little-endian ELF, EM_CUDA), read from its headers
 * as the driver must (cuModuleLoadData takes no size): 0 when it is not one. */
size_t fc_cubin_extent(const void *image, char *why, int *bad);

/* ---- images.c ---- */
typedef struct fc_image fc_image;
/* Loads image for the current context's device (device 0 without one): *out NULL for an image
 * that is no fatbin, wrapper or cubin (the registry serves it). Prints why on a refusal. */
CUresult fc_image_load(const char *entry, const void *image, fc_image **out);
void fc_image_free(fc_image *img);
unsigned fc_image_kernel_count(const fc_image *img);
/* Kernel i (materialized on first use under lazy loading): CUDA_SUCCESS, or
 * CUDA_ERROR_INVALID_IMAGE when its parameter info is malformed (said on stderr). */
CUresult fc_image_kernel_at(fc_image *img, unsigned i, fc_kdef **out);
CUresult fc_image_kernel(fc_image *img, const char *name, fc_kdef **out); /* NOT_FOUND when absent */
CUresult fc_image_global(fc_image *img, const char *name, CUdeviceptr *dptr, size_t *bytes);
/* A launch of an image kernel with its packed arguments: recorded for FAKECUDA_LAUNCH_LOG. */
void fc_image_launch_record(const fc_kdef *def, int by_kernel_handle, const unsigned char *args, CUstream s,
                            unsigned grid_x, fc_launch_position at);

#endif
