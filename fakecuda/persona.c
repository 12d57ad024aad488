/* persona.c: why it exists: what each device says it is. FAKECUDA_PERSONA picks a real card,
 * whose name, memory size, compute capability and attributes the runtime and the libraries
 * read (the runtime picks the cubins for its SM from them): h100-sxm-80gb or a100-pcie-40gb.
 * Unset (or "fakecuda"): fakecuda's own device, named "fakecuda device N", with its own UUID
 * and 80 GiB, and the H100's attributes: before, it answered only the few tests needed and 0
 * for the rest, and PyTorch's CUDA build died on it (SIGFPE in torch.randn, a division by
 * its 0 threads per SM; cublasCreate failed), bare and under pump, on every release tried
 * (issue 43). Anything else: an error at load naming the choices.
 *
 * Sources. deviceQuery output published for each card (CUDA samples, 1_Utilities/deviceQuery):
 *   H100: "NVIDIA H100 80GB HBM3", driver 13.0 / runtime 12.5 (a Kata GPU containers write-up,
 *     2025): 81079 MBytes (85017755648 bytes), 132 SMs, 1980 MHz, memory 2619 MHz, 5120-bit,
 *     L2 52428800, 233472 shared bytes per SM, 3 copy engines, PCI 0 / 2 / 0.
 *   A100: "NVIDIA A100-PCIE-40GB", driver 12.2 / runtime 12.2 (a Chameleon Cloud course page):
 *     40339 MBytes (42298834944 bytes), 108 SMs, 1410 MHz, memory 1215 MHz, 5120-bit, L2
 *     41943040, 3 copy engines, PCI 0 / 151 / 0.
 *   Both: texture limits 1D 131072, 2D 131072 x 65536, 3D 16384^3, layered 1D 32768 x 2048,
 *     2D 32768^2 x 2048; 65536 constant bytes; 49152 shared bytes per block; 65536 registers per
 *     block; 2048 threads per SM; blocks 1024 x 1024 x 64; grids 2147483647 x 65535 x 65535; pitch
 *     2147483647; texture alignment 512; ECC on; UVA, managed memory, preemption, cooperative and
 *     multi-device cooperative launch: yes; compute mode default.
 * CUDA C++ Programming Guide, "Technical Specifications per Compute Capability": 32 blocks
 * per SM, 64K registers per SM, opt-in shared memory per block 227 KB (9.0) / 163 KB (8.0),
 * shared memory per SM 228 KB / 164 KB, 1 KB reserved per block; thread block clusters from 9.0.
 * Attributes no source gives answer 0. */
#include "fakecuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { CUdevice_attribute attr; int value; } fc_attr;
typedef struct {
    const char *id, *name;
    uint64_t memory;  /* cuDeviceTotalMem's bytes, the default of FAKECUDA_DEVICE_MEMORY */
    int pci_bus;      /* device 0's; the machine's device N is on bus + N */
    uint8_t uuid[16]; /* device 0's; byte 15 is the machine's device number */
    const fc_attr *attrs;
} fc_persona;

#define FC_COMMON_ATTRS                                                                                     \
    {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 1024}, {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X, 1024},         \
    {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y, 1024}, {CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z, 64},                 \
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X, 2147483647}, {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y, 65535},          \
    {CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z, 65535}, {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, 49152},  \
    {CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY, 65536}, {CU_DEVICE_ATTRIBUTE_WARP_SIZE, 32},                \
    {CU_DEVICE_ATTRIBUTE_MAX_PITCH, 2147483647}, {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK, 65536},      \
    {CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT, 512}, {CU_DEVICE_ATTRIBUTE_GPU_OVERLAP, 1},                     \
    {CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT, 0}, {CU_DEVICE_ATTRIBUTE_INTEGRATED, 0},                      \
    {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 1}, {CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, 0},                    \
    {CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_WIDTH, 131072}, {CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_WIDTH, 131072}, \
    {CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_HEIGHT, 65536}, {CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_WIDTH, 16384}, \
    {CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_HEIGHT, 16384}, {CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE3D_DEPTH, 16384}, \
    {CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_WIDTH, 32768},                                           \
    {CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE1D_LAYERED_LAYERS, 2048},                                           \
    {CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_WIDTH, 32768},                                           \
    {CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_HEIGHT, 32768},                                          \
    {CU_DEVICE_ATTRIBUTE_MAXIMUM_TEXTURE2D_LAYERED_LAYERS, 2048}, {CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS, 1}, \
    {CU_DEVICE_ATTRIBUTE_ECC_ENABLED, 1}, {CU_DEVICE_ATTRIBUTE_TCC_DRIVER, 0},                              \
    {CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, 5120}, {CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, 2048}, \
    {CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT, 3}, {CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 1},               \
    {CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, 0}, {CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, 0},                         \
    {CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED, 1}, {CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED, 1}, \
    {CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED, 1}, {CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR, 65536}, \
    {CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY, 1}, {CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD, 0},                      \
    {CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED, 1}, {CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH, 1},     \
    {CU_DEVICE_ATTRIBUTE_COOPERATIVE_MULTI_DEVICE_LAUNCH, 1}, {CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR, 32}, \
    {CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, 1024}, {CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED, 1}, \
    {CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 1}

static const fc_attr fc_h100_attrs[] = {
    FC_COMMON_ATTRS,
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 9}, {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
    {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 132}, {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1980000},
    {CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 2619000}, {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 52428800},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 233472},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 232448}, {CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 1},
    {CU_DEVICE_ATTRIBUTE_MAX, 0}};
static const fc_attr fc_a100_attrs[] = {
    FC_COMMON_ATTRS,
    {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, 8}, {CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, 0},
    {CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 108}, {CU_DEVICE_ATTRIBUTE_CLOCK_RATE, 1410000},
    {CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, 1215000}, {CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 41943040},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR, 167936},
    {CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, 166912}, {CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH, 0},
    {CU_DEVICE_ATTRIBUTE_MAX, 0}};
static const fc_persona fc_personas[] = {
    /* its own name, UUID and memory (80 GiB), an H100 in every attribute (issue 43 item 1) */
    {"fakecuda", NULL, 0, 1, {'f', 'a', 'k', 'e', 'c', 'u', 'd', 'a', 0x40, 0x80}, fc_h100_attrs},
    {"h100-sxm-80gb", "NVIDIA H100 80GB HBM3", 85017755648ull, 2,
     {0x6b, 0x1d, 0x3a, 0x52, 0x9e, 0x04, 0x4c, 0x11, 0x80, 0x90, 0x48, 0x31, 0x30, 0x30, 0x00, 0x00}, fc_h100_attrs},
    {"a100-pcie-40gb", "NVIDIA A100-PCIE-40GB", 42298834944ull, 151,
     {0x3f, 0x7c, 0x15, 0xa8, 0x21, 0x6b, 0x4e, 0x02, 0x9d, 0x41, 0x41, 0x31, 0x30, 0x30, 0x00, 0x00}, fc_a100_attrs},
};
static const fc_persona *fc_persona_cur = &fc_personas[0];
static pthread_once_t fc_persona_once = PTHREAD_ONCE_INIT;

static void pick(void)
{
    const char *v = getenv("FAKECUDA_PERSONA");
    if (!v || !*v) return;
    for (size_t i = 0; i < sizeof fc_personas / sizeof *fc_personas; i++)
        if (strcmp(v, fc_personas[i].id) == 0) {
            fc_persona_cur = &fc_personas[i];
            return;
        }
    fprintf(stderr, "fakecuda: FAKECUDA_PERSONA=%s: allowed: fakecuda (the default), h100-sxm-80gb, a100-pcie-40gb\n", v);
    exit(2);
}
static const fc_persona *persona(void)
{
    pthread_once(&fc_persona_once, pick);
    return fc_persona_cur;
}

uint64_t fc_persona_memory(void) { return persona()->memory; }
const char *fc_persona_id(void) { return persona()->id; }

/* The machine's device behind ordinal dev (CUDA_VISIBLE_DEVICES): its ids stay its own. */
int fc_persona_attribute(int dev, CUdevice_attribute attr)
{
    const fc_persona *p = persona();
    int machine = fc_cfg.physical[dev];
    if (attr == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID) return p->pci_bus + machine;
    for (const fc_attr *a = p->attrs; a->attr != CU_DEVICE_ATTRIBUTE_MAX; a++)
        if (a->attr == attr) return a->value;
    return 0;
}

void fc_persona_name(int dev, char *name, size_t len)
{
    const fc_persona *p = persona();
    if (p->name) snprintf(name, len, "%s", p->name);
    else snprintf(name, len, "fakecuda device %d", fc_cfg.physical[dev]);
}

void fc_persona_uuid(int dev, uint8_t out[16])
{
    memcpy(out, persona()->uuid, 16);
    out[15] = (uint8_t)fc_cfg.physical[dev];
}
