/* units_tables.c: unit tests of the shim's two lock-free tables of what kernels are given,
 * linked with the shim's objects (plain and sanitized): handle kinds (handles.c) and TMA
 * descriptors' regions (tensor_maps.c), each with threads writing while others read
 * (under ThreadSanitizer: no report), every answer one a writer gave (a torn entry shows as
 * an address and extent of different rounds; two cores rarely interleave that finely, so
 * this is no proof of the sequence count, which the code's comment argues).
 * Prints "units_tables: N passed, M failed". */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "expect.h"
#include "handles.h"
#include "tensor_maps.h"


static void test_handle_kinds(void)
{
    static _Alignas(16) char objects[4][16];
    EXPECT(pump_handle_kind_of(objects[0]) == PUMP_HANDLE_UNKNOWN);
    pump_handle_note(objects[0], PUMP_HANDLE_KERNEL, NULL);
    pump_handle_note(objects[1], PUMP_HANDLE_FUNCTION, NULL);
    EXPECT(pump_handle_kind_of(objects[0]) == PUMP_HANDLE_KERNEL);
    EXPECT(pump_handle_kind_of(objects[1]) == PUMP_HANDLE_FUNCTION);
    EXPECT(pump_handle_kind_of(objects[2]) == PUMP_HANDLE_UNKNOWN);
    pump_handle_note(objects[0], PUMP_HANDLE_FUNCTION, NULL);  /* an address reused as the other kind */
    EXPECT(pump_handle_kind_of(objects[0]) == PUMP_HANDLE_FUNCTION);
    pump_handle_note(objects[3] + 1, PUMP_HANDLE_KERNEL, NULL);  /* not a driver object's address */
    EXPECT(pump_handle_kind_of(objects[3] + 1) == PUMP_HANDLE_UNKNOWN);
    pump_handle_note(NULL, PUMP_HANDLE_KERNEL, NULL);
    EXPECT(pump_handle_kind_of(NULL) == PUMP_HANDLE_UNKNOWN);
}

/* An unload forgets the kinds of the owner's handles and of those of no known owner. */
static void test_handle_owners(void)
{
    static _Alignas(16) char objects[4][16], module_a, module_b;
    pump_handle_note(objects[0], PUMP_HANDLE_FUNCTION, &module_a);
    pump_handle_note(objects[1], PUMP_HANDLE_KERNEL, &module_b);
    pump_handle_note(objects[2], PUMP_HANDLE_KERNEL, NULL);
    pump_handle_note(objects[1], PUMP_HANDLE_KERNEL, NULL);  /* a graph node's: the owner stays */
    EXPECT(pump_handle_owner_of(objects[0]) == &module_a);
    EXPECT(pump_handle_owner_of(objects[1]) == &module_b);
    pump_handles_forget(&module_a);
    EXPECT(pump_handle_kind_of(objects[0]) == PUMP_HANDLE_UNKNOWN);
    EXPECT(pump_handle_owner_of(objects[0]) == NULL);
    EXPECT(pump_handle_kind_of(objects[1]) == PUMP_HANDLE_KERNEL);
    EXPECT(pump_handle_kind_of(objects[2]) == PUMP_HANDLE_UNKNOWN);
    pump_handle_note(objects[0], PUMP_HANDLE_KERNEL, &module_b);  /* the address handed out again */
    EXPECT(pump_handle_kind_of(objects[0]) == PUMP_HANDLE_KERNEL);
    pump_handles_forget(&module_b);
    EXPECT(pump_handle_kind_of(objects[0]) == PUMP_HANDLE_UNKNOWN);
    EXPECT(pump_handle_kind_of(objects[1]) == PUMP_HANDLE_UNKNOWN);
}

/* A descriptor's bytes made from a number, and the region that number stands for. */
static void descriptor(uint64_t n, uint64_t *w)
{
    for (int i = 0; i < 16; i++)
        w[i] = (n + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)i;
}
static uint64_t address_of(uint64_t n) { return 0x7f0000000000ull + n * 4096; }
static uint64_t extent_of(uint64_t n) { return 64 + n; }

static void test_extents(void)
{
    const cuuint64_t dims2[2] = {1024, 1024}, strides2[1] = {4096};
    EXPECT(pump_tensor_map_extent(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, dims2, strides2) == 4096 + 1023 * 4096);
    const cuuint64_t dims1[1] = {256};
    EXPECT(pump_tensor_map_extent(CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B, 1, dims1, NULL) == 128);
    EXPECT(pump_tensor_map_extent(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 1, dims1, NULL) == 512);
    const cuuint64_t dims3[3] = {64, 8, 4}, strides3[2] = {256, 4096};
    EXPECT(pump_tensor_map_extent(CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, dims3, strides3) == 64 + 7 * 256 + 3 * 4096);
    EXPECT(pump_tensor_map_extent(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 0, dims2, strides2) == 0);
    EXPECT(pump_tensor_map_extent(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 6, dims2, strides2) == 0);
    EXPECT(pump_tensor_map_extent(CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, dims2, NULL) == 0);
}

static void test_descriptors(void)
{
    uint64_t w[16], address = 0, extent = 0;
    descriptor(1, w);
    EXPECT(!pump_tensor_map_find(w, &address, &extent));
    pump_tensor_map_note(w, address_of(1), extent_of(1));
    EXPECT(atomic_load(&pump_tensor_maps_seen));
    EXPECT(pump_tensor_map_find(w, &address, &extent) && address == address_of(1) && extent == extent_of(1));
    unsigned char unaligned[129];
    memcpy(unaligned + 1, w, 128);
    EXPECT(pump_tensor_map_find(unaligned + 1, &address, &extent) && address == address_of(1));
    w[15] ^= 1;  /* one bit off: another descriptor */
    EXPECT(!pump_tensor_map_find(w, &address, &extent));
    w[15] ^= 1;
    pump_tensor_map_note(w, address_of(2), extent_of(2));  /* the same bytes again: the newer region */
    EXPECT(pump_tensor_map_find(w, &address, &extent) && address == address_of(2));
    /* The table keeps the newest: a descriptor leaves when four newer ones came to its
     * bucket. After 4,096 more, the newest 128 are all there, and at least 15 in 16 of 1,024. */
    for (uint64_t n = 100; n < 100 + 4096; n++) {
        descriptor(n, w);
        pump_tensor_map_note(w, address_of(n), extent_of(n));
    }
    int newest = 0, recent = 0;
    for (uint64_t n = 100 + 4096 - 1024; n < 100 + 4096; n++) {
        descriptor(n, w);
        bool there = pump_tensor_map_find(w, &address, &extent) && address == address_of(n) &&
                     extent == extent_of(n);
        recent += there;
        newest += there && n >= 100 + 4096 - 128;
    }
    EXPECT(newest == 128);
    EXPECT(recent >= 960); /* 992 with this hash */
    printf("units_tables: %d of the newest 1,024 descriptors kept\n", recent);
}

static atomic_bool stop;
static atomic_int torn, found;

/* Each round gives the same descriptors another region (as cuTensorMapReplaceAddress and a
 * new encode of the same bytes do): address and extent move together, so a reader that
 * sees one round's address with another's extent read a torn entry. */
#define ROUND_SHIFT 40
static void *descriptor_writer(void *arg)
{
    uint64_t w[16];
    for (uint64_t round = 0; round < 2000; round++)
        for (uint64_t n = 0; n < 64; n++) {
            uint64_t id = 10000 + (uint64_t)(uintptr_t)arg * 64 + n, parity = round % 2;
            descriptor(id, w);
            pump_tensor_map_note(w, address_of(id) + (parity << ROUND_SHIFT), extent_of(id) + parity);
        }
    return NULL;
}

static void *descriptor_reader(void *arg)
{
    (void)arg;
    uint64_t w[16], address, extent;
    while (!atomic_load(&stop))
        for (uint64_t id = 10000; id < 10000 + 128; id++) {
            descriptor(id, w);
            if (pump_tensor_map_find(w, &address, &extent)) {
                atomic_fetch_add(&found, 1);
                uint64_t parity = (address - address_of(id)) >> ROUND_SHIFT;
                if (parity > 1 || address != address_of(id) + (parity << ROUND_SHIFT) ||
                    extent != extent_of(id) + parity)
                    atomic_fetch_add(&torn, 1);
            }
        }
    return NULL;
}

static void *handle_writer(void *arg)
{
    static _Alignas(16) char objects[256][16];
    for (int round = 0; round < 200; round++)
        for (int i = 0; i < 256; i++)
            pump_handle_note(objects[i], (i + round + (int)(uintptr_t)arg) % 2 ? PUMP_HANDLE_KERNEL
                                                                               : PUMP_HANDLE_FUNCTION, NULL);
    for (int i = 0; i < 256; i++)
        if (pump_handle_kind_of(objects[i]) == PUMP_HANDLE_UNKNOWN)
            atomic_fetch_add(&torn, 1);
    return NULL;
}

static void test_races(void)
{
    pthread_t writers[2], readers[2], handles[2];
    for (uintptr_t i = 0; i < 2; i++) {
        pthread_create(&readers[i], NULL, descriptor_reader, NULL);
        pthread_create(&writers[i], NULL, descriptor_writer, (void *)i);
        pthread_create(&handles[i], NULL, handle_writer, (void *)i);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(writers[i], NULL);
        pthread_join(handles[i], NULL);
    }
    atomic_store(&stop, true);
    for (int i = 0; i < 2; i++)
        pthread_join(readers[i], NULL);
    EXPECT(atomic_load(&torn) == 0);
    EXPECT(atomic_load(&found) > 0);
}

int main(void)
{
    test_handle_kinds();
    test_handle_owners();
    test_extents();
    test_descriptors();
    test_races();
    return expect_report("units_tables");
}
