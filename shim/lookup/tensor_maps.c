/* tensor_maps.c: descriptor bytes -> the region they cover (see tensor_maps.h).
 *
 * Descriptors are made on the host for each GEMM or copy (cuBLASLt and CUTLASS encode
 * them before their launches), so the table is a cache of the newest: 512 buckets of 4
 * entries, a descriptor in the bucket its bytes hash to, a new one taking the bucket's
 * next entry in turn. Each entry holds the whole 128 bytes, compared in full: a match is
 * exact, never a fingerprint's chance. An entry is written under a sequence count
 * (seqlock): odd while being written, readers that see it change retry once or miss,
 * and a writer finding every entry of its bucket mid-write skips the note (said once)
 * instead of waiting. Fields are stored with release and loaded with acquire, so a
 * reader that sees any of a writer's stores sees its odd count after them (no fences:
 * ThreadSanitizer does not model them). No lock, no allocation, no driver call.
 */
#include <string.h>

#include "tensor_maps.h"

#define WORDS (PUMP_TENSOR_MAP_BYTES / 8)
#define BUCKETS 512 /* power of two */
#define WAYS 4

struct entry {
    uint64_t seq;          /* even: stable; odd: being written; 0: never written */
    uint64_t hash;
    uint64_t word[WORDS];
    uint64_t address, extent;
} __attribute__((aligned(64)));

static struct entry table[BUCKETS][WAYS]; /* 96 KiB */
static uint32_t next_way[BUCKETS];
PUMP_HIDDEN atomic_bool pump_tensor_maps_seen;

static uint64_t hash_of(const uint64_t *w)
{
    uint64_t h = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < WORDS; i++) {
        h ^= w[i];
        h *= 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
    }
    return h | 1; /* never 0: an unwritten entry's hash */
}

/* Element size in bits (cuda.h, CUtensorMapDataType); the packed kinds by the bytes they take:
 * 16U4_ALIGN8B packs 16 4-bit values in 8 bytes, the ALIGN16B kinds 16 values in 16. Unknown
 * types count 64 bits: the larger region, an extra prefetch at worst. */
static uint64_t element_bits(CUtensorMapDataType type)
{
    switch ((int)type) {
    case CU_TENSOR_MAP_DATA_TYPE_UINT8:
        return 8;
    case CU_TENSOR_MAP_DATA_TYPE_UINT16:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT16:
    case CU_TENSOR_MAP_DATA_TYPE_BFLOAT16:
        return 16;
    case CU_TENSOR_MAP_DATA_TYPE_UINT32:
    case CU_TENSOR_MAP_DATA_TYPE_INT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_FLOAT32_FTZ:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32:
    case CU_TENSOR_MAP_DATA_TYPE_TFLOAT32_FTZ:
        return 32;
    case CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B:
        return 4;
    case CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN16B:
    case CU_TENSOR_MAP_DATA_TYPE_16U6_ALIGN16B:
        return 8;
    default:
        return 64;
    }
}

PUMP_HIDDEN uint64_t pump_tensor_map_extent(CUtensorMapDataType type, cuuint32_t rank, const cuuint64_t *dims,
                                            const cuuint64_t *strides)
{
    /* cuda.h: rank 1..5, each globalDim 1..2^32, each globalStride below 2^40: no overflow. */
    if (rank == 0 || rank > 5 || dims == NULL || (rank > 1 && strides == NULL))
        return 0;
    for (cuuint32_t i = 0; i < rank; i++)
        if (dims[i] == 0 || dims[i] > ((uint64_t)1 << 32) || (i > 0 && strides[i - 1] >= ((uint64_t)1 << 40)))
            return 0;
    /* The first dimension is contiguous; each further one adds (dim - 1) rows of its stride. */
    uint64_t extent = (dims[0] * element_bits(type) + 7) / 8;
    for (cuuint32_t i = 1; i < rank; i++)
        extent += (dims[i] - 1) * strides[i - 1];
    return extent;
}

static bool same(const struct entry *e, const uint64_t *w)
{
    for (int i = 0; i < WORDS; i++)
        if (__atomic_load_n(&e->word[i], __ATOMIC_ACQUIRE) != w[i])
            return false;
    return true;
}

/* Claims entry e for writing (its count made odd); false if another writer holds it. */
static bool claim(struct entry *e, uint64_t *seq)
{
    *seq = __atomic_load_n(&e->seq, __ATOMIC_RELAXED);
    if ((*seq & 1) != 0 ||
        !__atomic_compare_exchange_n(&e->seq, seq, *seq + 1, false, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
        return false;
    return true;
}

PUMP_HIDDEN void pump_tensor_map_note(const void *map, uint64_t address, uint64_t extent)
{
    uint64_t w[WORDS];
    memcpy(w, map, sizeof w);
    uint64_t hash = hash_of(w);
    uint32_t bucket = (uint32_t)(hash >> 20) & (BUCKETS - 1);
    /* The same bytes again (a descriptor encoded anew for the same tensor) keep their entry. */
    uint32_t first = __atomic_fetch_add(&next_way[bucket], 1, __ATOMIC_RELAXED);
    for (uint32_t k = 0; k < WAYS; k++) {
        struct entry *e = &table[bucket][k];
        if (__atomic_load_n(&e->hash, __ATOMIC_RELAXED) == hash && same(e, w)) {
            first = k;
            break;
        }
    }
    for (uint32_t k = 0; k < WAYS; k++) {
        struct entry *e = &table[bucket][(first + k) % WAYS];
        uint64_t seq;
        if (!claim(e, &seq))
            continue;
        __atomic_store_n(&e->hash, hash, __ATOMIC_RELEASE);
        for (int i = 0; i < WORDS; i++)
            __atomic_store_n(&e->word[i], w[i], __ATOMIC_RELEASE);
        __atomic_store_n(&e->address, address, __ATOMIC_RELEASE);
        __atomic_store_n(&e->extent, extent, __ATOMIC_RELEASE);
        __atomic_store_n(&e->seq, seq + 2, __ATOMIC_RELEASE);
        atomic_store_explicit(&pump_tensor_maps_seen, true, memory_order_relaxed);
        PUMP_COUNT(tensor_maps_noted, 1);
        return;
    }
    pump_log_once("TMA descriptors made on many threads at once: one was not remembered, its memory faults in");
}

PUMP_HIDDEN bool pump_tensor_map_find(const void *bytes, uint64_t *address, uint64_t *extent)
{
    uint64_t w[WORDS];
    memcpy(w, bytes, sizeof w); /* a host copy of an argument need not be aligned */
    uint64_t hash = hash_of(w);
    uint32_t bucket = (uint32_t)(hash >> 20) & (BUCKETS - 1);
    for (uint32_t k = 0; k < WAYS; k++) {
        const struct entry *e = &table[bucket][k];
        for (int attempt = 0; attempt < 2; attempt++) {
            uint64_t before = __atomic_load_n(&e->seq, __ATOMIC_ACQUIRE);
            if ((before & 1) != 0 || before == 0 || __atomic_load_n(&e->hash, __ATOMIC_ACQUIRE) != hash)
                break;
            bool match = same(e, w);
            uint64_t a = __atomic_load_n(&e->address, __ATOMIC_ACQUIRE);
            uint64_t x = __atomic_load_n(&e->extent, __ATOMIC_ACQUIRE);
            if (__atomic_load_n(&e->seq, __ATOMIC_ACQUIRE) != before)
                continue; /* rewritten while read: once more */
            if (!match)
                break;
            *address = a;
            *extent = x;
            return true;
        }
    }
    return false;
}
