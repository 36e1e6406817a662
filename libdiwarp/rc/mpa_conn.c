#include "rc/mpa_conn.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/uio.h>

#include "llp/tcp.h"
#include "util/time.h"

static int fail(struct dw_mpa_conn *c, int err, const char *why)
{
        c->state = DW_MPA_FAILED;
        c->err = err;
        c->why = why;
        return 1;
}

static void encode_frame(struct dw_mpa_conn *c, const struct dw_mpa_frame *f)
{
        ssize_t n = dw_mpa_frame_encode(f, c->tx, sizeof(c->tx));
        /* Inputs were validated by the callers; a failure here is a bug, but
         * turn it into a failed setup rather than a crash. */
        if (n < 0) {
                fail(c, (int)n, "MPA: could not encode the frame");
                return;
        }
        c->tx_len = (uint16_t)n;
        c->tx_off = 0;
}

int dw_mpa_init_initiator(struct dw_mpa_conn *c, int fd, bool connecting, bool want_crc,
                          uint16_t ird, uint16_t ord, const void *pd, uint16_t pd_len)
{
        if (pd_len > DW_MPA_ULP_PD_MAX || (pd_len && !pd))
                return -EINVAL;
        memset(c, 0, sizeof(*c));
        c->fd = fd;
        c->initiator = true;
        c->want_crc = want_crc;
        c->ird = ird > DW_MPA_IRD_ORD_MAX ? DW_MPA_IRD_ORD_MAX : ird;
        c->ord = ord > DW_MPA_IRD_ORD_MAX ? DW_MPA_IRD_ORD_MAX : ord;

        struct dw_mpa_frame f = {
            .is_reply = false,
            .crc = want_crc,
            .revision = 2,
            .enhanced = true,
            .ird = c->ird,
            .ord = c->ord,
            .private_data = pd,
            .private_data_len = pd_len,
        };
        encode_frame(c, &f);
        if (c->state == DW_MPA_FAILED)
                return c->err;
        c->state = connecting ? DW_MPA_CONNECTING : DW_MPA_SEND_REQ;
        return 0;
}

void dw_mpa_init_responder(struct dw_mpa_conn *c, int fd, bool want_crc, uint16_t ird, uint16_t ord)
{
        memset(c, 0, sizeof(*c));
        c->fd = fd;
        c->initiator = false;
        c->want_crc = want_crc;
        c->ird = ird > DW_MPA_IRD_ORD_MAX ? DW_MPA_IRD_ORD_MAX : ird;
        c->ord = ord > DW_MPA_IRD_ORD_MAX ? DW_MPA_IRD_ORD_MAX : ord;
        c->state = DW_MPA_WAIT_REQ;
}

short dw_mpa_poll_events(const struct dw_mpa_conn *c)
{
        switch (c->state) {
        case DW_MPA_CONNECTING:
        case DW_MPA_SEND_REQ:
        case DW_MPA_SEND_REP:
                return POLLOUT;
        default:
                return POLLIN;
        }
}

/* 1: frame written, 0: would block, <0: error. */
static int write_frame(struct dw_mpa_conn *c)
{
        while (c->tx_off < c->tx_len) {
                struct iovec iov = {c->tx + c->tx_off, (size_t)(c->tx_len - c->tx_off)};
                ssize_t n = dw_tcp_writev(c->fd, &iov, 1);
                if (n == -EAGAIN)
                        return 0;
                if (n < 0)
                        return (int)n;
                c->tx_off = (uint16_t)(c->tx_off + n);
        }
        return 1;
}

/* Reads exactly one frame, never past its end. 1: complete (decoded into f),
 * 0: would block, <0: error (c->why set for protocol errors). */
static int read_frame(struct dw_mpa_conn *c, struct dw_mpa_frame *f)
{
        for (;;) {
                const char *why = NULL;
                ssize_t r = c->rx_len ? dw_mpa_frame_decode(c->rx, c->rx_len, f, &why) : -ENODATA;
                if (r > 0)
                        return 1;
                size_t need = DW_MPA_FRAME_HDR_LEN;
                if (r == -ENODATA) {
                        if (c->rx_len)
                                need = f->need;
                } else {
                        c->why = why;
                        return (int)r;
                }
                if (need > sizeof(c->rx)) {
                        c->why = "MPA: frame longer than the largest allowed";
                        return -EMSGSIZE;
                }
                struct iovec iov = {c->rx + c->rx_len, need - c->rx_len};
                ssize_t n = dw_tcp_readv(c->fd, &iov, 1);
                if (n == -EAGAIN)
                        return 0;
                if (n == 0) {
                        c->why = "MPA: peer closed the connection during setup";
                        return -ECONNRESET;
                }
                if (n < 0)
                        return (int)n;
                c->rx_len = (uint16_t)(c->rx_len + n);
        }
}

static void take_peer_frame(struct dw_mpa_conn *c, const struct dw_mpa_frame *f)
{
        c->revision = f->revision;
        c->peer_markers = f->markers;
        if (f->enhanced) {
                c->peer_ird = f->ird;
                c->peer_ord = f->ord;
                c->peer_p2p = f->peer2peer;
                /* Offered RTR messages; dw_mpa_respond narrows them to one. */
                c->rtr_send = f->rtr_send;
                c->rtr_write = f->rtr_write;
                c->rtr_read = f->rtr_read;
        } else {
                c->peer_ird = DW_MPA_DEFAULT_IRD_ORD;
                c->peer_ord = DW_MPA_DEFAULT_IRD_ORD;
        }
        c->pd_len = f->private_data_len;
        if (c->pd_len > sizeof(c->pd))
                c->pd_len = sizeof(c->pd);
        if (c->pd_len)
                memcpy(c->pd, f->private_data, c->pd_len);
}

int dw_mpa_step(struct dw_mpa_conn *c)
{
        struct dw_mpa_frame f;
        int r;

        for (;;) {
                switch (c->state) {
                case DW_MPA_CONNECTING: {
                        struct pollfd p = {.fd = c->fd, .events = POLLOUT};
                        if (poll(&p, 1, 0) <= 0)
                                return 0;
                        r = dw_tcp_connect_result(c->fd);
                        if (r == -EINPROGRESS || r == -EALREADY)
                                return 0;
                        if (r < 0)
                                return fail(c, r, "MPA: TCP connect failed");
                        c->state = DW_MPA_SEND_REQ;
                        break;
                }
                case DW_MPA_SEND_REQ:
                        r = write_frame(c);
                        if (r == 0)
                                return 0;
                        if (r < 0)
                                return fail(c, r, "MPA: could not send the Request");
                        c->state = DW_MPA_WAIT_REP;
                        break;
                case DW_MPA_WAIT_REP:
                        r = read_frame(c, &f);
                        if (r == 0)
                                return 0;
                        if (r < 0)
                                return fail(c, r, c->why ? c->why : "MPA: reading the Reply");
                        if (!f.is_reply)
                                return fail(c, -EPROTO, "MPA: got a Request where a Reply was due");
                        take_peer_frame(c, &f);
                        if (f.reject) {
                                c->state = DW_MPA_REJECTED;
                                return 1;
                        }
                        if (f.markers)
                                return fail(c, -EPROTO,
                                            "MPA: the Reply asks for markers, which diwarp "
                                            "does not insert");
                        if (f.peer2peer)
                                return fail(c, -EPROTO,
                                            "MPA: the Reply asks for peer-to-peer mode, which "
                                            "the Request did not offer");
                        /* The Reply's C decides (RFC 5044 7.1); a responder that
                         * refuses CRC wins. */
                        c->crc = f.crc;
                        c->state = DW_MPA_DONE;
                        return 1;
                case DW_MPA_WAIT_REQ:
                        r = read_frame(c, &f);
                        if (r == 0)
                                return 0;
                        if (r < 0)
                                return fail(c, r, c->why ? c->why : "MPA: reading the Request");
                        if (f.is_reply)
                                return fail(c, -EPROTO, "MPA: got a Reply where a Request was due");
                        take_peer_frame(c, &f);
                        c->crc = f.crc || c->want_crc;
                        c->state = DW_MPA_REQUEST;
                        return 1;
                case DW_MPA_SEND_REP:
                        r = write_frame(c);
                        if (r == 0)
                                return 0;
                        if (r < 0)
                                return fail(c, r, "MPA: could not send the Reply");
                        /* A reject is final once written; REJECTED was chosen
                         * in dw_mpa_respond and stored in err == 1. */
                        c->state = c->err == 1 ? DW_MPA_REJECTED : DW_MPA_DONE;
                        c->err = 0;
                        return 1;
                case DW_MPA_REQUEST:
                case DW_MPA_DONE:
                case DW_MPA_REJECTED:
                case DW_MPA_FAILED:
                        return 1;
                }
        }
}

int dw_mpa_respond(struct dw_mpa_conn *c, bool accept, uint16_t ird, uint16_t ord, const void *pd,
                   uint16_t pd_len)
{
        if (c->state != DW_MPA_REQUEST || c->initiator)
                return -EINVAL;
        if (pd_len > DW_MPA_ULP_PD_MAX || (pd_len && !pd))
                return -EINVAL;
        /* A revision 1 initiator gets a revision 1 Reply (it could not parse
         * the enhanced block); its IRD/ORD are then the defaults. */
        bool v2 = c->revision == 2;
        if (!v2 && pd_len > DW_MPA_PD_MAX)
                return -EINVAL;

        c->ird = ird > DW_MPA_IRD_ORD_MAX ? DW_MPA_IRD_ORD_MAX : ird;
        c->ord = ord > DW_MPA_IRD_ORD_MAX ? DW_MPA_IRD_ORD_MAX : ord;
        if (c->ord > c->peer_ird)
                c->ord = c->peer_ird;

        struct dw_mpa_frame f = {
            .is_reply = true,
            .crc = c->crc,
            .reject = !accept,
            .revision = v2 ? 2 : 1,
            .enhanced = v2,
            .ird = v2 ? c->ird : 0,
            .ord = v2 ? c->ord : 0,
            .private_data = pd,
            .private_data_len = pd_len,
        };
        if (accept && v2 && c->peer_p2p) {
                /* RFC 6581 peer-to-peer: pick one RTR message the initiator
                 * offered. A zero-length Write touches nothing, so prefer it;
                 * then Read (answered by a zero-length Read Response); a Send
                 * last, since it must be kept from consuming a receive WQE. */
                bool w = c->rtr_write, r = c->rtr_read, s = c->rtr_send;
                c->rtr_write = w;
                c->rtr_read = !w && r;
                c->rtr_send = !w && !r && s;
                f.peer2peer = true;
                f.rtr_write = c->rtr_write;
                f.rtr_read = c->rtr_read;
                f.rtr_send = c->rtr_send;
        } else {
                c->rtr_write = c->rtr_read = c->rtr_send = false;
        }
        encode_frame(c, &f);
        if (c->state == DW_MPA_FAILED)
                return c->err;
        c->err = accept ? 0 : 1;
        c->state = DW_MPA_SEND_REP;
        return 0;
}

int dw_mpa_run(struct dw_mpa_conn *c, uint64_t deadline_ns)
{
        for (;;) {
                if (dw_mpa_step(c))
                        return 1;
                int r = dw_tcp_wait(c->fd, dw_mpa_poll_events(c), deadline_ns);
                if (r == 0)
                        return -ETIMEDOUT;
                if (r < 0)
                        return r;
        }
}
