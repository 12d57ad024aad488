/* nvml.c: why it exists: the few NVML calls PyTorch's CUDA build makes (libnvidia-ml.so.1, the
 * driver package's management library), answered from fakecuda's devices, so that what needs
 * NVML runs on fakecuda: PyTorch 2.14's expandable segments ask whether a device has fabric
 * access at their first mapping (c10/cuda/PeerToPeerAccess.cpp, get_fabric_access: nvmlInit_v2,
 * nvmlDeviceGetHandleByPciBusId_v2, nvmlDeviceGetGpuFabricInfoV) and call through null pointers
 * where no NVML library exists. Built as build/tests/nvml/libnvidia-ml.so.1 (nvml.cmake), on the
 * library path only of the runs that need it. NVML's return codes and prototypes are nvml.h's
 * (NVML API Reference); a device is found by its PCI id, as cuDeviceGetPCIBusId writes it.
 * Answered as a GPU without an NVLink fabric answers: fabric information and NVLink remotes not
 * supported, no running compute process listed. Everything else NVML offers is absent: a caller
 * that looks it up finds no symbol, as with an older library. */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define NVML_EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum { NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2,
       NVML_ERROR_NOT_SUPPORTED = 3, NVML_ERROR_NOT_FOUND = 6, NVML_ERROR_UNKNOWN = 999 };
typedef struct nvmlDevice_st *nvmlDevice_t;

static int initialised;

NVML_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    if (cuInit(0) != CUDA_SUCCESS) return NVML_ERROR_UNKNOWN;
    initialised = 1;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    initialised = 0;
    return NVML_SUCCESS;
}

/* busId: "domain:bus:device.function" in hex, the domain 4 or 8 digits (nvml.h). */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *busId, nvmlDevice_t *device)
{
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    unsigned domain, bus, slot, function;
    int count = 0;
    if (!busId || !device || sscanf(busId, "%x:%x:%x.%x", &domain, &bus, &slot, &function) != 4)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (cuDeviceGetCount(&count) != CUDA_SUCCESS) return NVML_ERROR_UNKNOWN;
    for (int d = 0; d < count; d++) {
        int ids[3];
        if (cuDeviceGetAttribute(&ids[0], CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d) != CUDA_SUCCESS ||
            cuDeviceGetAttribute(&ids[1], CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d) != CUDA_SUCCESS ||
            cuDeviceGetAttribute(&ids[2], CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d) != CUDA_SUCCESS)
            return NVML_ERROR_UNKNOWN;
        if ((unsigned)ids[0] == domain && (unsigned)ids[1] == bus && (unsigned)ids[2] == slot && function == 0) {
            *device = (nvmlDevice_t)(uintptr_t)(d + 1);
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, void *gpuFabricInfo)
{
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    return !device || !gpuFabricInfo ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link, int *type)
{
    (void)link;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    return !device || !type ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, void *pci)
{
    (void)link;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    return !device || !pci ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED;
}

/* No process is listed: the size query answers 0, as for an idle GPU. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *infoCount,
                                                              void *infos)
{
    (void)infos;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!device || !infoCount) return NVML_ERROR_INVALID_ARGUMENT;
    *infoCount = 0;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    if (!cudaDriverVersion) return NVML_ERROR_INVALID_ARGUMENT;
    return cuDriverGetVersion(cudaDriverVersion) == CUDA_SUCCESS ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}
