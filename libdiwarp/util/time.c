/* The engine's clock for programs on the library (diwarpdv_now_ns,
 * include/diwarp/diwarpdv.h). */
#include <diwarp/diwarpdv.h>

#include "util/time.h"

uint64_t diwarpdv_now_ns(void)
{
        return dw_now_ns();
}
