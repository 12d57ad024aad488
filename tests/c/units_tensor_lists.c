/* units_tensor_lists.c: the two readers of PyTorch's multi_tensor_apply tensor lists, the
 * shim's (shim/lookup/tensor_lists.c, what the scan takes) and fakecuda's (fakecuda/
 * tensor_lists.c, what its launch log says a kernel reads), written apart, held to the structs
 * of real builds: each kernel kind and depth the real-client tier's foreach and fused AdamW
 * launch, at the first parameter's size torch 2.11.0+cu130 (4 KB of kernel arguments) and
 * 2.14.1+cu130 (32 KB) passed (their FAKECUDA_LAUNCH_LOG), with block_to_tensor's place worked
 * out by hand from each header's struct. Then a launch over three blocks of one struct full of
 * stale slots: both take the slots of the tensors those blocks name, in every list, and a
 * fused optimizer's state step, and nothing else.
 * Prints "units_tensor_lists: N passed, M failed". */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../fakecuda/tensor_lists.h"
#include "expect.h"
#include "tensor_lists.h"

#define MTA "_ZN2at6native54_GLOBAL__N__ae7e1889_21_ForeachPointwiseOp_cu_ef478fac25multi_tensor_apply_kernelINS1_"
#define PLAIN(depth) MTA "18TensorListMetadataILi" #depth "EEENS1_14UnaryOpFunctorIfLi1ELi1ELi1EEEJNS0_4SqrtIfEEEEEvT_T0_DpT1_"
#define SCALARS(depth) MTA "28TensorListScalarListMetadataIfLi" #depth "EEENS1_25BinaryOpScalarListFunctorIfLi1ELi1ELi0EEEJSt7dividesIfEEEEvT_T0_DpT1_"
#define FUSED(depth) MTA "32FusedOptimizerTensorListMetadataILi" #depth "EEENS1_20FusedAdamMathFunctorIfLi4ELNS0_9ADAM_MODEE1ELb0EEEJPKfdddddbS9_S9_EEEvT_T0_DpT1_"

struct known {
    const char *name;
    size_t size;                       /* the first parameter's, as the build passed it */
    unsigned depth, tensors, block_to_tensor_at, steps_at, blocks, entry_bytes;
};

static const struct known builds[] = {
    /* torch 2.11.0+cu130: 4 KB of arguments, 320 blocks of 8-bit entries */
    {PLAIN(1), 3368, 1, 110, 1760, 0, 320, 1},
    {PLAIN(2), 3144, 2, 64, 1536, 0, 320, 1},
    {PLAIN(3), 3144, 3, 48, 1536, 0, 320, 1},
    {SCALARS(1), 3520, 1, 96, 1920, 0, 320, 1},
    {SCALARS(3), 3328, 3, 48, 1728, 0, 320, 1},
    {FUSED(4), 3336, 4, 36, 1728, 1440, 320, 1},
    /* torch 2.14.1+cu130: 32 KB of arguments, 2240 blocks of 16-bit entries */
    {PLAIN(1), 25768, 1, 770, 12320, 0, 2240, 2},
    {PLAIN(2), 24200, 2, 448, 10752, 0, 2240, 2},
    {PLAIN(3), 24200, 3, 336, 10752, 0, 2240, 2},
    {SCALARS(1), 26880, 1, 672, 13440, 0, 2240, 2},
    {SCALARS(3), 25536, 3, 336, 12096, 0, 2240, 2},
    {FUSED(4), 25544, 4, 252, 12096, 10080, 2240, 2},
};

static void set_entry(unsigned char *meta, const struct known *k, unsigned block, unsigned tensor)
{
    unsigned char *e = meta + k->block_to_tensor_at + (size_t)k->entry_bytes * block;
    e[0] = (unsigned char)tensor;
    if (k->entry_bytes == 2)
        e[1] = (unsigned char)(tensor >> 8);
}

static void test_layouts(const struct known *k)
{
    struct pump_tensor_list list;
    fc_tensor_list tl;
    EXPECT(pump_tensor_list_of(k->name, k->size, &list));
    EXPECT(fc_tensor_list_of(k->name, k->size, &tl));
    EXPECT(list.depth == k->depth && list.tensors == k->tensors && list.size == k->size);
    EXPECT(list.block_to_tensor_at == k->block_to_tensor_at && list.steps_at == k->steps_at);
    EXPECT(list.blocks == k->blocks && list.entry_bytes == k->entry_bytes);
    EXPECT(tl.depth == k->depth && tl.tensors == k->tensors && tl.block_to_tensor_at == k->block_to_tensor_at);
    EXPECT(tl.steps_at == k->steps_at && tl.blocks == k->blocks && tl.entry_bytes == k->entry_bytes);
    /* Another size is another struct: neither reads it as this one. */
    EXPECT(!pump_tensor_list_of(k->name, k->size + 8, &list) && !fc_tensor_list_of(k->name, k->size + 8, &tl));
    EXPECT(!pump_tensor_list_of("sm80_xmma_gemm_f32f32", k->size, &list) && !fc_tensor_list_of("gemm", k->size, &tl));
}

/* A launch over three blocks naming tensors 2, 0, 2; the entries after them name tensor 1 (a
 * block the launch does not have), one names no tensor at all: slots 0 and 2 of every list are
 * read, and nothing else, though every slot holds a pointer. */
static void test_reads(const struct known *k)
{
    struct pump_tensor_list list;
    fc_tensor_list tl;
    if (!pump_tensor_list_of(k->name, k->size, &list) || !fc_tensor_list_of(k->name, k->size, &tl)) {
        EXPECT(!"recognised");
        return;
    }
    unsigned char *meta = malloc(k->size);
    size_t *offsets = malloc((k->depth + 1) * (size_t)k->tensors * sizeof *offsets);
    if (meta == NULL || offsets == NULL) {
        EXPECT(!"memory");
        free(meta);
        free(offsets);
        return;
    }
    for (size_t w = 0; w + 8 <= k->size; w += 8) {
        uint64_t stale = 0x7f0000000000ull + w;
        memcpy(meta + w, &stale, 8);
    }
    for (unsigned b = 0; b < k->blocks; b++)
        set_entry(meta, k, b, 1);
    set_entry(meta, k, 0, 2);
    set_entry(meta, k, 1, 0);
    set_entry(meta, k, 2, 2);
    set_entry(meta, k, 5, k->entry_bytes == 1 ? 0xff : 0xffff);
    uint8_t read[PUMP_TENSOR_LIST_SLOTS];
    pump_tensor_list_read(&list, (const char *)meta, 3, read);
    unsigned marked = 0;
    for (unsigned t = 0; t < PUMP_TENSOR_LIST_SLOTS; t++)
        marked += read[t];
    EXPECT(marked == 2 && read[0] && read[2]);
    size_t n = fc_tensor_list_reads(&tl, meta, 3, offsets), at = 0;
    EXPECT(n == 2 * (k->depth + (k->steps_at != 0)));
    for (unsigned d = 0; d < k->depth && at + 1 < n; d++, at += 2)
        EXPECT(offsets[at] == 8 * (size_t)d * k->tensors && offsets[at + 1] == 8 * ((size_t)d * k->tensors + 2));
    if (k->steps_at != 0 && at + 1 < n)
        EXPECT(offsets[at] == k->steps_at && offsets[at + 1] == k->steps_at + 16);
    /* A grid past the struct's blocks reads no entry beyond them: every block then names tensor 1 too. */
    pump_tensor_list_read(&list, (const char *)meta, 100000, read);
    EXPECT(read[0] && read[1] && read[2] && !read[3]);
    EXPECT(fc_tensor_list_reads(&tl, meta, 100000, offsets) == 3 * (k->depth + (k->steps_at != 0)));
    free(meta);
    free(offsets);
}

int main(void)
{
    for (size_t i = 0; i < sizeof builds / sizeof builds[0]; i++) {
        test_layouts(&builds[i]);
        test_reads(&builds[i]);
    }
    return expect_report("units_tensor_lists");
}
