/* Fault injection on the datagram transmit path. See fault.h and README.md. */
#include "util/fault.h"
#include "util/why.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- parsing ------------------------------------------------------------ */

/* Parses "0.25" or "25%" (whole string [s, end)) into [0, 1]. */
static bool parse_prob(const char *s, const char *end, double *out)
{
        char buf[64];
        size_t len = (size_t)(end - s);
        bool percent = false;
        char *e;
        double v;

        if (len == 0 || len >= sizeof(buf))
                return false;
        memcpy(buf, s, len);
        buf[len] = '\0';
        if (buf[len - 1] == '%') {
                percent = true;
                buf[--len] = '\0';
                if (len == 0)
                        return false;
        }
        /* Only plain decimal notation: strtod would also take "nan", "inf", hex. */
        for (size_t i = 0; i < len; i++)
                if (!((buf[i] >= '0' && buf[i] <= '9') || buf[i] == '.'))
                        return false;
        errno = 0;
        v = strtod(buf, &e);
        if (errno || *e != '\0' || e == buf)
                return false;
        if (percent)
                v /= 100.0;
        if (!(v >= 0.0 && v <= 1.0))
                return false;
        *out = v;
        return true;
}

/* A non-empty run of decimal digits [s, end) worth at most max. */
static bool parse_decimal(const char *s, const char *end, uint64_t max, uint64_t *out)
{
        uint64_t v = 0;

        if (s == end)
                return false;
        for (const char *c = s; c < end; c++) {
                if (*c < '0' || *c > '9')
                        return false;
                v = v * 10 + (uint64_t)(*c - '0');
                if (v > max)
                        return false;
        }
        *out = v;
        return true;
}

static bool parse_delay(const char *s, const char *end, uint32_t *out)
{
        uint64_t v;

        if (!parse_decimal(s, end, DW_FAULT_MAX_DELAY_US, &v))
                return false;
        *out = (uint32_t)v;
        return true;
}

/* Bytes per second: digits with an optional k, m or g (powers of 1000). */
static bool parse_rate(const char *s, const char *end, uint64_t *out)
{
        uint64_t v, mul = 1;

        if (s == end)
                return false;
        char last = end[-1];
        if (last == 'k' || last == 'K')
                mul = 1000;
        else if (last == 'm' || last == 'M')
                mul = 1000000;
        else if (last == 'g' || last == 'G')
                mul = 1000000000;
        if (mul > 1)
                end--;
        if (!parse_decimal(s, end, DW_FAULT_MAX_SLOWRX, &v))
                return false;
        if (v == 0 || v > DW_FAULT_MAX_SLOWRX / mul)
                return false;
        *out = v * mul;
        return true;
}

int dw_fault_parse(const char *spec, struct dw_fault_params *out, char *why, size_t whylen)
{
        struct dw_fault_params p = {0};
        unsigned seen = 0;
        const char *s = spec;

        if (why && whylen)
                why[0] = '\0';
        if (!spec || !*spec || strcasecmp(spec, "off") == 0 || strcasecmp(spec, "none") == 0) {
                *out = p;
                return 0;
        }
        for (;;) {
                const char *end = strchr(s, ',');
                const char *colon;
                size_t len;

                if (!end)
                        end = s + strlen(s);
                len = (size_t)(end - s);
                if (len == 0)
                        return dw_why(why, whylen, -EINVAL,
                                      "DIWARP_FAULT: empty item (stray comma) in '%.*s'",
                                      (int)(strlen(spec) > 64 ? 64 : strlen(spec)), spec);
                colon = memchr(s, ':', len);
                if (!colon)
                        return dw_why(why, whylen, -EINVAL,
                                      "DIWARP_FAULT: item '%.*s' is not key:value", (int)len, s);

                static const char *const keys[] = {"drop",    "dup",   "reorder",
                                                   "corrupt", "delay", "slowrx"};
                size_t klen = (size_t)(colon - s);
                int k = -1;

                for (int i = 0; i < 6; i++)
                        if (strlen(keys[i]) == klen && strncasecmp(s, keys[i], klen) == 0)
                                k = i;
                if (k < 0)
                        return dw_why(why, whylen, -EINVAL,
                                      "DIWARP_FAULT: unknown key in '%.*s' (expected drop, "
                                      "dup, reorder, corrupt, delay or slowrx)",
                                      (int)len, s);
                if (seen & (1u << k))
                        return dw_why(why, whylen, -EINVAL, "DIWARP_FAULT: '%.*s' repeats a key",
                                      (int)len, s);
                seen |= 1u << k;

                bool ok;
                switch (k) {
                case 0:
                        ok = parse_prob(colon + 1, end, &p.drop);
                        break;
                case 1:
                        ok = parse_prob(colon + 1, end, &p.dup);
                        break;
                case 2:
                        ok = parse_prob(colon + 1, end, &p.reorder);
                        break;
                case 3:
                        ok = parse_prob(colon + 1, end, &p.corrupt);
                        break;
                case 5:
                        if (!parse_rate(colon + 1, end, &p.slowrx_bps))
                                return dw_why(why, whylen, -EINVAL,
                                              "DIWARP_FAULT: '%.*s': slowrx must be bytes "
                                              "per second 1..10^12 (k, m, g: x1000)",
                                              (int)len, s);
                        ok = true;
                        break;
                default:
                        ok = parse_delay(colon + 1, end, &p.delay_us);
                        if (!ok)
                                return dw_why(why, whylen, -EINVAL,
                                              "DIWARP_FAULT: '%.*s': delay must be whole "
                                              "microseconds 0..10000000",
                                              (int)len, s);
                        break;
                }
                if (!ok)
                        return dw_why(why, whylen, -EINVAL,
                                      "DIWARP_FAULT: '%.*s': probability must be 0..1 or "
                                      "0%%..100%%",
                                      (int)len, s);
                if (*end == '\0')
                        break;
                s = end + 1;
        }
        *out = p;
        return 0;
}

/* ---- PRNG: splitmix64 (tiny state, good enough statistics, reproducible) --- */

static uint64_t rng_next(struct dw_fault *f)
{
        uint64_t z = (f->rng += 0x9e3779b97f4a7c15ull);

        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_unit(struct dw_fault *f)
{
        return (double)(rng_next(f) >> 11) * (1.0 / 9007199254740992.0);
}

static bool chance(struct dw_fault *f, double p)
{
        /* Always draw, so one knob does not shift the sequence seen by the others
         * depending on whether it is zero. */
        double u = rng_unit(f);

        return u < p;
}

/* ---- init / destroy ----------------------------------------------------- */

int dw_fault_init(struct dw_fault *f, const char *spec, uint64_t seed, const char **why)
{
        int rc;

        memset(f, 0, sizeof(*f));
        rc = dw_fault_parse(spec, &f->p, f->why_buf, sizeof(f->why_buf));
        if (rc) {
                if (why)
                        *why = f->why_buf;
                return rc;
        }
        f->rng = seed;
        f->enabled = f->p.drop > 0 || f->p.dup > 0 || f->p.reorder > 0 || f->p.corrupt > 0 ||
                     f->p.delay_us > 0;
        if (!f->enabled)
                return 0;
        if (f->p.corrupt > 0) {
                f->scratch = malloc(DW_FAULT_MAX_PKT);
                if (!f->scratch)
                        goto nomem;
        }
        if (f->p.reorder > 0 || f->p.delay_us > 0) {
                f->hold = calloc(DW_FAULT_HOLD_SLOTS, sizeof(*f->hold));
                if (!f->hold)
                        goto nomem;
                for (int i = 0; i < DW_FAULT_HOLD_SLOTS; i++) {
                        f->hold[i].buf = malloc(DW_FAULT_MAX_PKT);
                        if (!f->hold[i].buf)
                                goto nomem;
                }
        }
        return 0;
nomem:
        dw_fault_destroy(f);
        snprintf(f->why_buf, sizeof(f->why_buf), "DIWARP_FAULT: out of memory for hold queue");
        if (why)
                *why = f->why_buf;
        return -ENOMEM;
}

void dw_fault_destroy(struct dw_fault *f)
{
        if (f->hold) {
                for (int i = 0; i < DW_FAULT_HOLD_SLOTS; i++)
                        free(f->hold[i].buf);
                free(f->hold);
        }
        free(f->scratch);
        f->hold = NULL;
        f->scratch = NULL;
        f->held = 0;
        f->hold_head = f->hold_tail = 0;
        f->enabled = false;
}

bool dw_fault_enabled(const struct dw_fault *f)
{
        return f && f->enabled;
}

/* ---- hold queue --------------------------------------------------------- */

static struct dw_fault_held *slot(const struct dw_fault *f, uint32_t i)
{
        return &f->hold[i % DW_FAULT_HOLD_SLOTS];
}

static bool releasable(const struct dw_fault *f, const struct dw_fault_held *h, uint64_t now_ns)
{
        if (now_ns < h->due_ns)
                return false;
        if (h->after_seq == 0 || f->tx_seq >= h->after_seq)
                return true;
        return now_ns - h->due_ns >= DW_FAULT_REORDER_MAX_NS;
}

/* Skips freed entries at the head so their slots can be reused. */
static void compact_head(struct dw_fault *f)
{
        while (f->hold_head != f->hold_tail && !slot(f, f->hold_head)->used)
                f->hold_head++;
}

static int send_held(struct dw_fault *f, struct dw_fault_held *h, dw_fault_send_fn send_fn,
                     void *ctx)
{
        struct iovec v = {.iov_base = h->buf, .iov_len = h->len};
        int rc = send_fn(ctx, &v, 1, h->addrlen ? (const void *)&h->addr : NULL, h->addrlen);

        if (rc == -EAGAIN || rc == -EWOULDBLOCK || rc == -ENOBUFS)
                return rc; /* stays held; retried on the next flush */
        /* Sent, or failed for good (e.g. -ECONNREFUSED): an unreliable network
         * may lose a packet, so the entry is released either way. */
        h->used = false;
        f->held--;
        f->tx_seq++;
        return rc < 0 ? rc : 0;
}

static int flush(struct dw_fault *f, uint64_t now_ns, bool all, dw_fault_send_fn send_fn, void *ctx)
{
        int n = 0;

        if (!f->hold || f->held == 0)
                return 0;
        for (uint32_t i = f->hold_head; i != f->hold_tail; i++) {
                struct dw_fault_held *h = slot(f, i);
                int rc;

                if (!h->used || !(all || releasable(f, h, now_ns)))
                        continue;
                rc = send_held(f, h, send_fn, ctx);
                if (rc == -EAGAIN || rc == -EWOULDBLOCK || rc == -ENOBUFS) {
                        compact_head(f);
                        return n ? n : rc;
                }
                n++;
        }
        compact_head(f);
        return n;
}

int dw_fault_flush_due(struct dw_fault *f, uint64_t now_ns, dw_fault_send_fn send_fn, void *ctx)
{
        return flush(f, now_ns, false, send_fn, ctx);
}

int dw_fault_flush_all(struct dw_fault *f, dw_fault_send_fn send_fn, void *ctx)
{
        return flush(f, 0, true, send_fn, ctx);
}

unsigned dw_fault_held_count(const struct dw_fault *f)
{
        return f->held;
}

uint64_t dw_fault_next_due_ns(const struct dw_fault *f)
{
        uint64_t best = UINT64_MAX;

        if (!f->hold)
                return best;
        for (uint32_t i = f->hold_head; i != f->hold_tail; i++) {
                const struct dw_fault_held *h = slot(f, i);
                uint64_t due;

                if (!h->used)
                        continue;
                due = h->due_ns;
                /* A reorder gate not yet met ends at the time bound at the latest. */
                if (h->after_seq && f->tx_seq < h->after_seq)
                        due += DW_FAULT_REORDER_MAX_NS;
                if (due < best)
                        best = due;
        }
        return best;
}

/* ---- transmit ----------------------------------------------------------- */

static size_t iov_len(const struct iovec *iov, int iovcnt)
{
        size_t n = 0;

        for (int i = 0; i < iovcnt; i++)
                n += iov[i].iov_len;
        return n;
}

static void gather(uint8_t *dst, const struct iovec *iov, int iovcnt)
{
        for (int i = 0; i < iovcnt; i++) {
                if (iov[i].iov_len)
                        memcpy(dst, iov[i].iov_base, iov[i].iov_len);
                dst += iov[i].iov_len;
        }
}

static int do_send(struct dw_fault *f, const struct iovec *iov, int iovcnt, const void *addr,
                   socklen_t addrlen, dw_fault_send_fn send_fn, void *ctx)
{
        int rc = send_fn(ctx, iov, iovcnt, addr, addrlen);

        if (rc >= 0)
                f->tx_seq++;
        return rc;
}

int dw_fault_tx(struct dw_fault *f, const struct iovec *iov, int iovcnt, const void *dst_addr,
                socklen_t addrlen, uint64_t now_ns, dw_fault_send_fn send_fn, void *ctx,
                struct diwarp_counters *ctr)
{
        size_t len;
        bool drop, corrupt, dup, reorder;
        struct iovec one;
        int rc;

        if (!dw_fault_enabled(f))
                return send_fn(ctx, iov, iovcnt, dst_addr, addrlen);

        /* Due packets go first: they were "sent" before this one. A transient
         * error is left for the next call; this packet still goes through the model. */
        if (f->held)
                (void)flush(f, now_ns, false, send_fn, ctx);

        len = iov_len(iov, iovcnt);
        /* Draw every decision for every packet so the random sequence depends
         * only on the seed and the packet count. */
        drop = chance(f, f->p.drop);
        corrupt = chance(f, f->p.corrupt);
        dup = chance(f, f->p.dup);
        reorder = chance(f, f->p.reorder);
        uint64_t bit = rng_next(f);
        uint64_t later = rng_next(f);

        if (drop) {
                if (ctr)
                        ctr->fault_dropped++;
                return (int)len;
        }
        if (corrupt && len > 0 && len <= DW_FAULT_MAX_PKT && f->scratch) {
                gather(f->scratch, iov, iovcnt);
                bit %= (uint64_t)len * 8;
                f->scratch[bit / 8] ^= (uint8_t)(1u << (bit % 8));
                one.iov_base = f->scratch;
                one.iov_len = len;
                iov = &one;
                iovcnt = 1;
                if (ctr)
                        ctr->fault_corrupted++;
        }
        bool hold = (reorder || f->p.delay_us > 0) && f->hold && len <= DW_FAULT_MAX_PKT &&
                    addrlen <= sizeof(struct sockaddr_storage);
        int copies = dup ? 2 : 1;

        if (dup && ctr)
                ctr->fault_duplicated++;
        if (hold && ctr) {
                if (reorder)
                        ctr->fault_reordered++;
                if (f->p.delay_us > 0)
                        ctr->fault_delayed++;
        }
        rc = (int)len;
        for (int c = 0; c < copies; c++) {
                if (!hold) {
                        rc = do_send(f, iov, iovcnt, dst_addr, addrlen, send_fn, ctx);
                        if (rc < 0)
                                return rc;
                        continue;
                }
                /* Full ring: the oldest entry leaves early rather than being lost. */
                if (f->hold_tail - f->hold_head == DW_FAULT_HOLD_SLOTS) {
                        struct dw_fault_held *old = slot(f, f->hold_head);
                        if (old->used && send_held(f, old, send_fn, ctx) < 0 && old->used) {
                                /* Transient failure: the socket is full anyway; the
                                 * held packet is lost as a congested network would. */
                                old->used = false;
                                f->held--;
                                if (ctr)
                                        ctr->fault_dropped++;
                        }
                        compact_head(f);
                }
                struct dw_fault_held *h = slot(f, f->hold_tail++);
                gather(h->buf, iov, iovcnt);
                h->len = len;
                h->due_ns = now_ns + (uint64_t)f->p.delay_us * 1000u;
                h->after_seq = reorder ? f->tx_seq + 1 + later % DW_FAULT_REORDER_MAX_LATER : 0;
                h->addrlen = dst_addr ? addrlen : 0;
                if (h->addrlen)
                        memcpy(&h->addr, dst_addr, addrlen);
                h->used = true;
                f->held++;
        }
        return rc;
}

/* ---- slowrx: a receiver that places data slowly --------------------------- */

uint64_t dw_fault_rx_wait(const struct dw_fault *f, uint64_t now_ns)
{
        if (!f->p.slowrx_bps || f->rx_clock <= now_ns)
                return 0;
        return f->rx_clock;
}

void dw_fault_rx_took(struct dw_fault *f, uint64_t bytes, uint64_t now_ns)
{
        if (!f->p.slowrx_bps)
                return;
        /* A virtual clock: reading is allowed while it does not run ahead of
         * real time; an idle receiver banks at most a burst. */
        uint64_t floor = now_ns > DW_FAULT_SLOWRX_BURST_NS ? now_ns - DW_FAULT_SLOWRX_BURST_NS : 0;
        if (f->rx_clock < floor)
                f->rx_clock = floor;
        f->rx_clock += (uint64_t)((double)bytes * 1e9 / (double)f->p.slowrx_bps);
}
