/* tensor_maps.h: the memory each TMA descriptor names, learned where descriptors are made.
 *
 * A CUtensorMap (cuda.h: `alignas(64) cuuint64_t opaque[16]`, 128 bytes, layout
 * undocumented) is passed to a kernel by value; the global address inside it is not a
 * plain word the launch scan could find. The only documented way to know it is where the
 * descriptor is encoded or re-addressed (cuTensorMapEncodeTiled, cuTensorMapEncodeIm2col,
 * cuTensorMapEncodeIm2colWide, cuTensorMapReplaceAddress: hooks_tensor_maps.c), so pump
 * remembers each descriptor's bytes with the region it covers, and the scan looks up the
 * 64-byte-aligned 128-byte windows of a launch's by-value arguments.
 */
#ifndef PUMP_TENSOR_MAPS_H
#define PUMP_TENSOR_MAPS_H

#include "shim.h"

#define PUMP_TENSOR_MAP_BYTES 128 /* sizeof(CUtensorMap) */
#define PUMP_TENSOR_MAP_ALIGN 64  /* its alignment: where it sits in the parameter buffer */

/* Whether any descriptor was ever noted: the scan looks for none until then. */
extern PUMP_HIDDEN atomic_bool pump_tensor_maps_seen;

/* The bytes from globalAddress to the last element a descriptor of this shape covers (cuda.h:
 * globalDim elements in each of tensorRank dimensions, globalStrides bytes between the
 * rows of each dimension past the first); 0 for a shape the driver would refuse. */
PUMP_HIDDEN uint64_t pump_tensor_map_extent(CUtensorMapDataType type, cuuint32_t rank, const cuuint64_t *dims,
                                            const cuuint64_t *strides);

/* Remembers the 128 bytes at `map` as covering [address, address + extent). Lock-free;
 * the table is bounded and keeps the newest. */
PUMP_HIDDEN void pump_tensor_map_note(const void *map, uint64_t address, uint64_t extent);

/* The region of the descriptor whose 128 bytes (any alignment) are at `bytes`; false if
 * no descriptor pump saw made has them. Lock-free, no driver call. */
PUMP_HIDDEN bool pump_tensor_map_find(const void *bytes, uint64_t *address, uint64_t *extent);

#endif
