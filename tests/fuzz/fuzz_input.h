/* fuzz_input.h: reads a fuzzer's input as little-endian integers, zeros once
 * it runs out. The harnesses read a zero as "the valid choice" (a flag byte of
 * 0 keeps the right magic, size and seals), so short inputs exercise the
 * paths a correct daemon takes and the fuzzer spends its bytes on breaking
 * one thing at a time. */
#ifndef PUMP_FUZZ_INPUT_H
#define PUMP_FUZZ_INPUT_H
#include <stddef.h>
#include <stdint.h>

struct fuzz_input {
    const uint8_t *at;
    size_t left;
};

static inline uint64_t fuzz_take(struct fuzz_input *in, unsigned bytes)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < bytes && in->left > 0; i++, in->at++, in->left--)
        v |= (uint64_t)in->at[0] << (8 * i);
    return v;
}

static inline uint8_t fuzz_u8(struct fuzz_input *in) { return (uint8_t)fuzz_take(in, 1); }
static inline uint16_t fuzz_u16(struct fuzz_input *in) { return (uint16_t)fuzz_take(in, 2); }
static inline uint32_t fuzz_u32(struct fuzz_input *in) { return (uint32_t)fuzz_take(in, 4); }
static inline uint64_t fuzz_u64(struct fuzz_input *in) { return fuzz_take(in, 8); }

#endif
