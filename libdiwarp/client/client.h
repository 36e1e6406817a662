/* client/: the native API in client mode (DIWARP_PROGRESS=daemon). The host
 * daemon (diwarpd) owns the sockets and runs the engine; here every verb is
 * either a request on the daemon's Unix socket (objects, state changes) or a
 * store into a shared-memory ring the daemon serves (posts, completions,
 * event arming). See client/README.md.
 *
 * The verbs are the dwc_* functions of api/backend.h: api/ calls them through
 * dw_client_backend when the process chose client mode; their handles are
 * then client objects, never engine ones. api/ has checked the arguments
 * the public contract defines.
 */
#ifndef DIWARP_CLIENT_CLIENT_H
#define DIWARP_CLIENT_CLIENT_H

#include <stdint.h>

/* diwarp stat: asks the daemon at path for its clients and counters. */
struct dw_ipc_stat_rsp;
int dwc_daemon_stat(struct dw_ipc_stat_rsp *out);
struct dw_ipc_stat_qps_rsp;
int dwc_daemon_stat_qps(uint32_t first, struct dw_ipc_stat_qps_rsp *out);
/* diwarp daemon stop. */
int dwc_daemon_shutdown(void);

#endif
