/* The backend tables and the process's choice between them (api/backend.h). */
#include "api/backend.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define DW_BACKEND_ENTRY_E(ret, name, params) .name = dwe_##name,
const struct dw_backend dw_engine_backend = {.name = "engine",
                                             DW_BACKEND_VERBS(DW_BACKEND_ENTRY_E)};
#undef DW_BACKEND_ENTRY_E

_Atomic(const struct dw_backend *) dw_backend_chosen;

static pthread_once_t choose_once = PTHREAD_ONCE_INIT;

static void choose(void)
{
        atomic_store_explicit(&dw_backend_chosen, &dw_engine_backend, memory_order_release);
}

const struct dw_backend *dw_backend_select(void)
{
        pthread_once(&choose_once, choose);
        return atomic_load_explicit(&dw_backend_chosen, memory_order_acquire);
}
