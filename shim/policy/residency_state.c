/* residency_state.c: each device's state (residency_state.h), one per device pump may work on;
 * residency_blocks.c sets each up before its first rule there. */
#include "residency_state.h"

PUMP_HIDDEN struct pump_device_state pump_devices[PUMP_DEVICES_MAX];
