/* driver_table.c: the driver functions pump calls for itself (shim.h's struct pump_driver),
 * defined at the bottom so that every layer may read them: hooks/driver.c fills the table once,
 * when libcuda is loaded, and nothing writes it after. */
#include "shim.h"

PUMP_HIDDEN struct pump_driver pump_driver;
