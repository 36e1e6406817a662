/* The backend tables and the process's choice between them (api/backend.h). */
#include "api/backend.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define DW_BACKEND_ENTRY_E(ret, name, params) .name = dwe_##name,
const struct dw_backend dw_engine_backend = {.name = "engine",
                                             DW_BACKEND_VERBS(DW_BACKEND_ENTRY_E)};
#undef DW_BACKEND_ENTRY_E

#define DW_BACKEND_ENTRY_C(ret, name, params) .name = dwc_##name,
const struct dw_backend dw_client_backend = {.name = "daemon client",
                                             DW_BACKEND_VERBS(DW_BACKEND_ENTRY_C)};
#undef DW_BACKEND_ENTRY_C

_Atomic(const struct dw_backend *) dw_backend_chosen;

static pthread_once_t choose_once = PTHREAD_ONCE_INIT;
static _Atomic int engine_only;

/* Client mode is the process's: DIWARP_PROGRESS=daemon, read once, at the
 * first call of the API (or diwarpdv_engine_only's), unless the process asked
 * for the engine (diwarpdv_engine_only: the daemon). */
static void choose(void)
{
        const char *p = getenv("DIWARP_PROGRESS");
        bool client = !atomic_load(&engine_only) && p && strcmp(p, "daemon") == 0;
        atomic_store_explicit(&dw_backend_chosen, client ? &dw_client_backend : &dw_engine_backend,
                              memory_order_release);
}

const struct dw_backend *dw_backend_select(void)
{
        pthread_once(&choose_once, choose);
        return atomic_load_explicit(&dw_backend_chosen, memory_order_acquire);
}

int diwarpdv_engine_only(void)
{
        atomic_store(&engine_only, 1);
        return dw_backend_select() == &dw_engine_backend ? 0 : -EBUSY;
}
