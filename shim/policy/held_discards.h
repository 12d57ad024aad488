/* held_discards.h: the dead tensors of blocks pump's allocator keeps for placement, discarded
 * off the program's threads once the GPU has passed their frees (held_discards.c). */
#ifndef PUMP_HELD_DISCARDS_H
#define PUMP_HELD_DISCARDS_H

#include "shim.h"

/* A tensor freed on `device` was kept dead (pump_kept_dead): where pump's budget presses there,
 * the oldest such blocks whose frees the GPU has passed are handed to the device's worker to be
 * discarded. Called by the freeing thread, holding no pump lock. */
PUMP_HIDDEN void pump_held_discards(int device);

#endif
