#include "diwarp/diwarp.h"

#define DW_STR2(x) #x
#define DW_STR(x)  DW_STR2(x)

const char *diwarp_version(void)
{
        return DW_STR(DIWARP_VERSION_MAJOR) "." DW_STR(DIWARP_VERSION_MINOR) "." DW_STR(
            DIWARP_VERSION_PATCH);
}
