#include "why.h"

#include <stdarg.h>
#include <stdio.h>

int dw_why(char *why, size_t whylen, int rc, const char *fmt, ...)
{
        va_list ap;

        if (why && whylen) {
                va_start(ap, fmt);
                vsnprintf(why, whylen, fmt, ap);
                va_end(ap);
        }
        return rc;
}
