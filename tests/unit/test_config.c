/* DIWARP_* configuration parsing and the log module. */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/config.h"
#include "util/log.h"

/* A fake environment: NULL-terminated name/value pairs. */
struct fake_env {
        const char *kv[48];
};

static const char *fake_get(void *ctx, const char *name)
{
        struct fake_env *e = ctx;

        for (int i = 0; e->kv[i]; i += 2)
                if (strcmp(e->kv[i], name) == 0)
                        return e->kv[i + 1];
        return NULL;
}

static int parse1(struct dw_config *cfg, const char *name, const char *value, const char **why)
{
        struct fake_env e = {{name, value, NULL}};

        return dw_config_from_getenv(cfg, fake_get, &e, why);
}

static void assert_defaults(const struct dw_config *c)
{
        cr_assert_str_eq(c->addr, ""); /* not pinned: every host address */
        cr_assert_eq(c->port_base, 17471);
        cr_assert_eq(c->log_level, DW_LOG_WARN);
        cr_assert(c->progress_thread);     /* independent progress, as an RNIC */
        cr_assert_eq(c->wait_spin_us, 50); /* completion-channel waits spin briefly */
        cr_assert_eq(c->shared_nap_after, 4);
        cr_assert_eq(c->io, DW_IO_PLAIN);
        cr_assert(c->rc_crc);
        cr_assert(c->rd_direct);
        cr_assert(c->rd_late_shared); /* a device's streams learn late ACKs together */
        cr_assert_eq(c->rc_transport, DW_RC_TCP);
        cr_assert_eq(c->peer_timeout_ms, 5000);
        cr_assert_eq(c->connect_timeout_ms, 10000);
        cr_assert_str_eq(c->fault_spec, "");
        cr_assert_eq(c->fault_seed, 1);
        cr_assert_eq(c->udp_mtu, 65507);
        cr_assert_eq(c->inflight_qp, DW_CONFIG_DEFAULT_INFLIGHT_QP);
        cr_assert_eq(c->inflight_proc, DW_CONFIG_DEFAULT_INFLIGHT_PROC);
        cr_assert_eq(c->inflight_host, DW_CONFIG_DEFAULT_INFLIGHT_HOST);
        cr_assert_str_eq(c->inflight_shm, "");
        cr_assert_eq(c->stripe_min, 262144);
}

Test(config, defaults_with_empty_environment)
{
        struct dw_config c;
        struct fake_env e = {{NULL}};

        cr_assert_eq(dw_config_from_getenv(&c, fake_get, &e, NULL), 0);
        assert_defaults(&c);
}

Test(config, empty_value_means_default)
{
        struct dw_config c;
        struct fake_env e = {{"DIWARP_PORT_BASE", "", "DIWARP_LOG", "", "DIWARP_ADDR", "", NULL}};

        cr_assert_eq(dw_config_from_getenv(&c, fake_get, &e, NULL), 0);
        assert_defaults(&c);
}

Test(config, every_variable_parsed)
{
        struct dw_config c;
        const char *why = NULL;
        struct fake_env e = {{
            "DIWARP_ADDR",
            "10.1.2.3",
            "DIWARP_PORT_BASE",
            "20000",
            "DIWARP_LOG",
            "DEBUG",
            "DIWARP_PROGRESS",
            "thread",
            "DIWARP_IO",
            "uring",
            "DIWARP_RC_CRC",
            "0",
            "DIWARP_RD_DIRECT",
            "0",
            "DIWARP_RD_LATE_ACKS",
            "stream",
            "DIWARP_RC_TRANSPORT",
            "rd",
            "DIWARP_PEER_TIMEOUT_MS",
            "250",
            "DIWARP_CONNECT_TIMEOUT_MS",
            "3000",
            "DIWARP_UDP_MTU",
            "9000",
            "DIWARP_FAULT_SEED",
            "0xdeadbeefcafe",
            "DIWARP_FAULT",
            "drop:1%,delay:100",
            "DIWARP_INFLIGHT_QP",
            "4",
            "DIWARP_INFLIGHT_PROC",
            "16",
            "DIWARP_INFLIGHT_HOST",
            "32",
            "DIWARP_INFLIGHT_SHM",
            "diwarp-test.pool_1",
            NULL,
        }};

        cr_assert_eq(dw_config_from_getenv(&c, fake_get, &e, &why), 0, "%s", why);
        cr_assert_str_eq(c.addr, "10.1.2.3");
        cr_assert_eq(c.port_base, 20000);
        cr_assert_eq(c.log_level, DW_LOG_DEBUG);
        cr_assert(c.progress_thread);
        cr_assert_eq(c.io, DW_IO_URING);
        cr_assert_not(c.rc_crc);
        cr_assert_not(c.rd_direct);
        cr_assert_not(c.rd_late_shared);
        cr_assert_eq(c.rc_transport, DW_RC_RD);
        cr_assert_eq(c.peer_timeout_ms, 250);
        cr_assert_eq(c.connect_timeout_ms, 3000);
        cr_assert_eq(c.udp_mtu, 9000);
        cr_assert_eq(c.fault_seed, 0xdeadbeefcafeull);
        cr_assert_str_eq(c.fault_spec, "drop:1%,delay:100");
        cr_assert_eq(c.inflight_qp, 4);
        cr_assert_eq(c.inflight_proc, 16);
        cr_assert_eq(c.inflight_host, 32);
        cr_assert_str_eq(c.inflight_shm, "/diwarp-test.pool_1");
}

Test(config, alternative_spellings)
{
        struct dw_config c;

        cr_assert_eq(parse1(&c, "DIWARP_PROGRESS", "app", NULL), 0);
        cr_assert_not(c.progress_thread);
        cr_assert_eq(parse1(&c, "DIWARP_IO", "plain", NULL), 0);
        cr_assert_eq(c.io, DW_IO_PLAIN);
        cr_assert_eq(parse1(&c, "DIWARP_RC_TRANSPORT", "TCP", NULL), 0);
        cr_assert_eq(c.rc_transport, DW_RC_TCP);
        cr_assert_eq(parse1(&c, "DIWARP_LOG", "warning", NULL), 0);
        cr_assert_eq(c.log_level, DW_LOG_WARN);
        cr_assert_eq(parse1(&c, "DIWARP_LOG", "2", NULL), 0);
        cr_assert_eq(c.log_level, DW_LOG_INFO);
        cr_assert_eq(parse1(&c, "DIWARP_FAULT_SEED", "18446744073709551615", NULL), 0);
        cr_assert_eq(c.fault_seed, UINT64_MAX);
        cr_assert_eq(parse1(&c, "DIWARP_ADDR", "255.255.255.255", NULL), 0);
        cr_assert_str_eq(c.addr, "255.255.255.255");
        cr_assert_eq(parse1(&c, "DIWARP_UDP_MTU", "65507", NULL), 0);
        cr_assert_eq(parse1(&c, "DIWARP_UDP_MTU", "512", NULL), 0);
        cr_assert_eq(parse1(&c, "DIWARP_FAULT", "off", NULL), 0);
        cr_assert_eq(parse1(&c, "DIWARP_INFLIGHT_HOST", "0", NULL), 0);
        cr_assert_eq(c.inflight_host, 0);
        cr_assert_eq(parse1(&c, "DIWARP_INFLIGHT_QP", "1000000", NULL), 0);
        cr_assert_eq(c.inflight_qp, 1000000);
        cr_assert_eq(parse1(&c, "DIWARP_INFLIGHT_SHM", "/mypool", NULL), 0);
        cr_assert_str_eq(c.inflight_shm, "/mypool");
        cr_assert_eq(parse1(&c, "DIWARP_WAIT_SPIN_US", "0", NULL), 0);
        cr_assert_eq(c.wait_spin_us, 0);
        cr_assert_eq(parse1(&c, "DIWARP_WAIT_SPIN_US", "10000", NULL), 0);
        cr_assert_eq(c.wait_spin_us, 10000);
        cr_assert_eq(parse1(&c, "DIWARP_SHARED_NAP_AFTER", "0", NULL), 0);
        cr_assert_eq(c.shared_nap_after, 0);
        cr_assert_eq(parse1(&c, "DIWARP_SHARED_NAP_AFTER", "64", NULL), 0);
        cr_assert_eq(c.shared_nap_after, 64);
}

Test(config, bad_values_rejected_with_reason)
{
        static const char *const bad[][2] = {
            {"DIWARP_ADDR", "localhost"},
            {"DIWARP_ADDR", "1.2.3"},
            {"DIWARP_ADDR", "0.0.0.0"},
            {"DIWARP_ADDR", "::1"},
            {"DIWARP_ADDR", "255.255.255.255x"},
            {"DIWARP_PORT_BASE", "0"},
            {"DIWARP_PORT_BASE", "65536"},
            {"DIWARP_PORT_BASE", "-1"},
            {"DIWARP_PORT_BASE", "80a"},
            {"DIWARP_PORT_BASE", " 80"},
            {"DIWARP_LOG", "verbose"},
            {"DIWARP_LOG", "4"},
            {"DIWARP_PROGRESS", "threads"},
            {"DIWARP_WAIT_SPIN_US", "10001"},
            {"DIWARP_WAIT_SPIN_US", "-1"},
            {"DIWARP_WAIT_SPIN_US", "50us"},
            {"DIWARP_SHARED_NAP_AFTER", "65"},
            {"DIWARP_SHARED_NAP_AFTER", "-1"},
            {"DIWARP_IO", "epoll"},
            {"DIWARP_RC_CRC", "yes"},
            {"DIWARP_RC_CRC", "2"},
            {"DIWARP_RD_DIRECT", "yes"},
            {"DIWARP_RD_LATE_ACKS", "0"},
            {"DIWARP_RC_TRANSPORT", "udp"},
            {"DIWARP_PEER_TIMEOUT_MS", "0"},
            {"DIWARP_PEER_TIMEOUT_MS", "3600001"},
            {"DIWARP_PEER_TIMEOUT_MS", "5s"},
            {"DIWARP_CONNECT_TIMEOUT_MS", "99999999999999999999999"},
            {"DIWARP_UDP_MTU", "511"},
            {"DIWARP_UDP_MTU", "65508"},
            {"DIWARP_FAULT_SEED", "seed"},
            {"DIWARP_FAULT_SEED", "-5"},
            {"DIWARP_FAULT_SEED", "18446744073709551616"},
            {"DIWARP_FAULT", "drop:2"},
            {"DIWARP_FAULT", "drop:x"},
            {"DIWARP_FAULT", "bogus:0.1"},
            {"DIWARP_FAULT", "drop:0.1,,dup:0.1"},
            {"DIWARP_INFLIGHT_QP", "-1"},
            {"DIWARP_INFLIGHT_QP", "1000001"},
            {"DIWARP_INFLIGHT_QP", "8x"},
            {"DIWARP_INFLIGHT_PROC", "1e3"},
            {"DIWARP_INFLIGHT_PROC", "+4"},
            {"DIWARP_INFLIGHT_HOST", "many"},
            {"DIWARP_INFLIGHT_HOST", "4294967296"},
            {"DIWARP_INFLIGHT_SHM", "a/b"},
            {"DIWARP_INFLIGHT_SHM", "//pool"},
            {"DIWARP_INFLIGHT_SHM", "/"},
            {"DIWARP_INFLIGHT_SHM", ".."},
            {"DIWARP_INFLIGHT_SHM", "pool name"},
            {"DIWARP_CREDIT", "on"},
            {"DIWARP_CREDIT", "dyn"},
            {"DIWARP_CREDIT_RC", "yes"},
            {"DIWARP_CREDIT_MIN_QUOTA", "32768"},
            {"DIWARP_CREDIT_MIN_QUOTA", "-1"},
            {"DIWARP_CREDIT_SLOT", "32"},
            {"DIWARP_CREDIT_SLOT", "3000"},
            {"DIWARP_CREDIT_SLOT", "131072"},
            {"DIWARP_CREDIT_RING", "0"},
            {"DIWARP_CREDIT_RING", "32768"},
            {"DIWARP_CREDIT_PEERS", "0"},
            {"DIWARP_CREDIT_CSLOTS", "0"},
            {"DIWARP_CREDIT_CSLOTS", "65"},
            {"DIWARP_LOCAL_COPY", "on"},
            {"DIWARP_LOCAL_COPY", "2"},
            {"DIWARP_RD_MAX_PEERS", "0"},
            {"DIWARP_RD_MAX_PEERS", "1000001"},
            {"DIWARP_RD_DEV_PEERS", "lots"},
            {"DIWARP_RD_IDLE_MS", "99"},
            {"DIWARP_RD_IDLE_MS", "3600001"},
        };

        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                struct dw_config c;
                const char *why = NULL;

                cr_assert_eq(parse1(&c, bad[i][0], bad[i][1], &why), -EINVAL, "%s=%s accepted",
                             bad[i][0], bad[i][1]);
                cr_assert_not_null(why, "%s=%s: no reason", bad[i][0], bad[i][1]);
                cr_assert_not_null(strstr(why, bad[i][0]), "reason lacks the name: %s", why);
                cr_assert_not_null(strstr(why, bad[i][1]), "reason lacks the value: %s", why);
                /* A failed parse leaves the defaults, not a partial environment. */
                assert_defaults(&c);
        }
}

/* DIWARP_ADDR as a list: 1..4 distinct addresses, one per rail, the string
 * kept as given. */
Test(config, addr_list_accepted)
{
        static const char *const good[] = {
            "10.0.0.1",
            "10.0.0.1,10.0.1.1",
            "10.0.0.1,10.0.1.1,10.0.2.1,10.0.3.1",
            /* The longest list: 4 x 15 characters and 3 commas. */
            "255.255.255.255,255.255.255.254,255.255.255.253,255.255.255.252",
        };
        for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
                struct dw_config c;
                const char *why = NULL;

                cr_assert_eq(parse1(&c, "DIWARP_ADDR", good[i], &why), 0, "%s: %s", good[i],
                             why ? why : "");
                cr_assert_str_eq(c.addr, good[i]);
        }
}

Test(config, addr_list_parsed_in_order)
{
        struct in_addr a[DW_CONFIG_MAX_RAILS];
        const char *why = NULL;

        memset(a, 0, sizeof(a));
        cr_assert_eq(dw_config_parse_addrs("192.168.1.7", a, &why), 1);
        cr_assert_eq(a[0].s_addr, inet_addr("192.168.1.7"));
        cr_assert_eq(dw_config_parse_addrs("10.0.0.1,10.0.1.1", a, &why), 2);
        cr_assert_eq(a[0].s_addr, inet_addr("10.0.0.1"));
        cr_assert_eq(a[1].s_addr, inet_addr("10.0.1.1"));
        cr_assert_eq(dw_config_parse_addrs("10.0.3.1,10.0.2.1,10.0.1.1,10.0.0.1", a, &why), 4);
        cr_assert_eq(a[0].s_addr, inet_addr("10.0.3.1"));
        cr_assert_eq(a[1].s_addr, inet_addr("10.0.2.1"));
        cr_assert_eq(a[2].s_addr, inet_addr("10.0.1.1"));
        cr_assert_eq(a[3].s_addr, inet_addr("10.0.0.1"));
        why = NULL;
        cr_assert_eq(dw_config_parse_addrs("10.0.0.1,10.0.0.1", a, &why), -EINVAL);
        cr_assert_not_null(why);
}

/* Each refusal names DIWARP_ADDR and what is wrong with the list. */
Test(config, addr_list_refused_with_reason)
{
        static const char *const bad[][2] = {
            {"10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4,10.0.0.5", "at most 4 addresses"},
            {"10.0.0.1,,10.0.0.2", "separated by commas"},
            {"10.0.0.1,10.0.0.2,", "separated by commas"},
            {",10.0.0.1", "separated by commas"},
            {"10.0.0.1,10.0.0.256", "separated by commas"},
            {"10.0.0.1,host", "separated by commas"},
            {"0.0.0.0,10.0.0.1", "0.0.0.0 cannot name a device"},
            {"10.0.0.1,0.0.0.0,10.0.0.2", "0.0.0.0 cannot name a device"},
            {"10.0.0.1,10.0.0.2,0.0.0.0", "0.0.0.0 cannot name a device"},
            {"10.0.0.1,10.0.0.1", "appears twice"},
            {"10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.2", "appears twice"},
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                struct dw_config c;
                const char *why = NULL;
                char named[128];

                cr_assert_eq(parse1(&c, "DIWARP_ADDR", bad[i][0], &why), -EINVAL, "%s accepted",
                             bad[i][0]);
                cr_assert_not_null(why, "%s: no reason", bad[i][0]);
                snprintf(named, sizeof(named), "DIWARP_ADDR='%s'", bad[i][0]);
                cr_assert_not_null(strstr(why, named), "reason lacks the name: %s", why);
                cr_assert_not_null(strstr(why, bad[i][1]), "%s: reason lacks '%s': %s", bad[i][0],
                                   bad[i][1], why);
                assert_defaults(&c);
        }
}

/* One character past the longest list of 4 is refused before it is parsed. */
Test(config, addr_list_too_long)
{
        struct dw_config c;
        const char *why = NULL;
        const char *v = "255.255.255.255,255.255.255.254,255.255.255.253,255.255.255.252 ";

        cr_assert_eq(strlen(v), DW_CONFIG_ADDR_LEN);
        cr_assert_eq(parse1(&c, "DIWARP_ADDR", v, &why), -EINVAL);
        cr_assert_not_null(strstr(why, "DIWARP_ADDR="), "%s", why);
        cr_assert_not_null(strstr(why, "at most 4 dotted IPv4 addresses"), "%s", why);
        assert_defaults(&c);
        /* Longer still: the same reason. */
        char big[200];
        memset(big, '1', sizeof(big) - 1);
        big[sizeof(big) - 1] = '\0';
        cr_assert_eq(parse1(&c, "DIWARP_ADDR", big, &why), -EINVAL);
        cr_assert_not_null(strstr(why, "DIWARP_ADDR="), "%s", why);
        cr_assert_not_null(strstr(why, "at most 4 dotted IPv4 addresses"), "%s", why);
        assert_defaults(&c);
}

Test(config, stripe_min)
{
        struct dw_config c;
        const char *why = NULL;

        dw_config_defaults(&c);
        cr_assert_eq(c.stripe_min, 262144);
        cr_assert_eq(parse1(&c, "DIWARP_STRIPE_MIN", "0", &why), 0, "%s", why);
        cr_assert_eq(c.stripe_min, 0, "0: never stripe");
        cr_assert_eq(parse1(&c, "DIWARP_STRIPE_MIN", "1048576", &why), 0, "%s", why);
        cr_assert_eq(c.stripe_min, 1048576);
        cr_assert_eq(parse1(&c, "DIWARP_STRIPE_MIN", "2147483648", &why), 0, "%s", why);
        cr_assert_eq(c.stripe_min, 2147483648u);
        static const char *const bad[] = {"-1",   "-262144",    "256k",
                                          "lots", "2147483649", "99999999999999999999999"};
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
                char named[96];

                why = NULL;
                cr_assert_eq(parse1(&c, "DIWARP_STRIPE_MIN", bad[i], &why), -EINVAL, "%s accepted",
                             bad[i]);
                snprintf(named, sizeof(named), "DIWARP_STRIPE_MIN='%s'", bad[i]);
                cr_assert_not_null(strstr(why, named), "%s", why);
                cr_assert_not_null(strstr(why, "0..2147483648"), "%s", why);
                assert_defaults(&c);
        }
}

/* Unset is -1: the host daemon turns it on, every other process leaves it off. */
Test(config, local_copy)
{
        struct dw_config c;
        const char *why = NULL;
        dw_config_defaults(&c);
        cr_assert_eq(c.local_copy, -1);
        cr_assert_eq(parse1(&c, "DIWARP_LOCAL_COPY", "1", &why), 0);
        cr_assert_eq(c.local_copy, 1);
        cr_assert_eq(parse1(&c, "DIWARP_LOCAL_COPY", "0", &why), 0);
        cr_assert_eq(c.local_copy, 0);
}

/* The bounds of the RD transport's state (docs/SECURITY.md). */
Test(config, rd_state_knobs)
{
        struct dw_config c;
        const char *why = NULL;
        dw_config_defaults(&c);
        cr_assert_eq(c.rd_max_peers, 4096);
        cr_assert_eq(c.rd_dev_peers, 16384);
        cr_assert_eq(c.rd_idle_ms, 10000);
        struct fake_env e = {{"DIWARP_RD_MAX_PEERS", "1", "DIWARP_RD_DEV_PEERS", "1000000",
                              "DIWARP_RD_IDLE_MS", "100", NULL}};
        cr_assert_eq(dw_config_from_getenv(&c, fake_get, &e, &why), 0, "%s", why);
        cr_assert_eq(c.rd_max_peers, 1);
        cr_assert_eq(c.rd_dev_peers, 1000000);
        cr_assert_eq(c.rd_idle_ms, 100);
}

Test(config, credit_knobs)
{
        struct dw_config c;
        const char *why = NULL;
        dw_config_defaults(&c);
        cr_assert_eq(c.credit, DW_CREDIT_ON_STATIC);
        cr_assert_eq(c.credit_slot, 2048);
        cr_assert_eq(c.credit_ring, 1024);
        cr_assert_eq(c.credit_peers, 16);
        cr_assert_eq(c.credit_cslots, 2);
        cr_assert_not(c.credit_rc_park);
        cr_assert_eq(parse1(&c, "DIWARP_CREDIT_RC", "park", &why), 0);
        cr_assert(c.credit_rc_park);
        cr_assert_eq(parse1(&c, "DIWARP_CREDIT_RC", "rnr", &why), 0);
        cr_assert_not(c.credit_rc_park);
        struct fake_env e = {{"DIWARP_CREDIT", "off", "DIWARP_CREDIT_SLOT", "65536",
                              "DIWARP_CREDIT_RING", "32767", "DIWARP_CREDIT_PEERS", "1000",
                              "DIWARP_CREDIT_CSLOTS", "64", NULL}};
        cr_assert_eq(dw_config_from_getenv(&c, fake_get, &e, &why), 0, "%s", why);
        cr_assert_eq(c.credit, DW_CREDIT_OFF);
        cr_assert_eq(c.credit_slot, 65536);
        cr_assert_eq(c.credit_ring, 32767);
        cr_assert_eq(c.credit_peers, 1000);
        cr_assert_eq(c.credit_cslots, 64);
        cr_assert_eq(parse1(&c, "DIWARP_CREDIT", "static", &why), 0);
        cr_assert_eq(c.credit, DW_CREDIT_ON_STATIC);
        cr_assert_eq(parse1(&c, "DIWARP_CREDIT", "dynamic", &why), 0);
        cr_assert_eq(c.credit, DW_CREDIT_ON_DYNAMIC);
        cr_assert_eq(c.credit_min_quota, 0);
        /* Dynamic: every sender keeps its floor, so the ring holds them all. */
        struct fake_env dyn = {{"DIWARP_CREDIT", "dynamic", "DIWARP_CREDIT_RING", "64",
                                "DIWARP_CREDIT_PEERS", "16", "DIWARP_CREDIT_MIN_QUOTA", "5", NULL}};
        cr_assert_eq(dw_config_from_getenv(&c, fake_get, &dyn, &why), -EINVAL);
        cr_assert_not_null(strstr(why, "floor of 5 slots"), "%s", why);
        dyn.kv[7] = "4";
        cr_assert_eq(dw_config_from_getenv(&c, fake_get, &dyn, &why), 0, "%s", why);
        cr_assert_eq(c.credit_min_quota, 4);
        /* Every sender needs a slot of the ring: refused with both names. */
        struct fake_env small = {{"DIWARP_CREDIT_RING", "8", "DIWARP_CREDIT_PEERS", "9", NULL}};
        cr_assert_eq(dw_config_from_getenv(&c, fake_get, &small, &why), -EINVAL);
        cr_assert_not_null(strstr(why, "DIWARP_CREDIT_RING=8"), "%s", why);
        cr_assert_not_null(strstr(why, "DIWARP_CREDIT_PEERS=9"), "%s", why);
        /* ... unless credits are off. */
        struct fake_env off = {
            {"DIWARP_CREDIT", "off", "DIWARP_CREDIT_RING", "8", "DIWARP_CREDIT_PEERS", "9", NULL}};
        cr_assert_eq(dw_config_from_getenv(&c, fake_get, &off, &why), 0, "%s", why);
}

Test(config, failure_discards_earlier_variables)
{
        struct dw_config c;
        const char *why = NULL;
        struct fake_env e = {{"DIWARP_ADDR", "10.0.0.1", "DIWARP_PORT_BASE", "99999", NULL}};

        cr_assert_eq(dw_config_from_getenv(&c, fake_get, &e, &why), -EINVAL);
        cr_assert_not_null(strstr(why, "DIWARP_PORT_BASE='99999'"), "%s", why);
        assert_defaults(&c);
}

Test(config, fault_reason_explains_the_item)
{
        struct dw_config c;
        const char *why = NULL;

        cr_assert_eq(parse1(&c, "DIWARP_FAULT", "dup:0.1,reorder:7", &why), -EINVAL);
        cr_assert_not_null(strstr(why, "DIWARP_FAULT='dup:0.1,reorder:7'"), "%s", why);
        cr_assert_not_null(strstr(why, "probability"), "%s", why);
}

Test(config, long_value_truncated_in_reason)
{
        struct dw_config c;
        const char *why = NULL;
        char big[1000];

        memset(big, 'x', sizeof(big) - 1);
        big[sizeof(big) - 1] = '\0';
        cr_assert_eq(parse1(&c, "DIWARP_FAULT", big, &why), -EINVAL);
        cr_assert_not_null(strstr(why, "DIWARP_FAULT="), "%s", why);
        cr_assert_lt(strlen(why), sizeof(c.why_buf));
}

Test(config, inflight_shm_name_length)
{
        struct dw_config c;
        const char *why = NULL;
        char name[DW_CONFIG_MAX_SHM_NAME + 3];

        /* The longest name fits, with or without its leading slash. */
        memset(name, 'p', sizeof(name));
        name[0] = '/';
        name[DW_CONFIG_MAX_SHM_NAME + 1] = '\0';
        cr_assert_eq(parse1(&c, "DIWARP_INFLIGHT_SHM", name, &why), 0, "%s", why);
        cr_assert_str_eq(c.inflight_shm, name);
        cr_assert_eq(parse1(&c, "DIWARP_INFLIGHT_SHM", name + 1, &why), 0, "%s", why);
        cr_assert_str_eq(c.inflight_shm, name);
        /* One character more is refused. */
        name[DW_CONFIG_MAX_SHM_NAME + 1] = 'p';
        name[DW_CONFIG_MAX_SHM_NAME + 2] = '\0';
        cr_assert_eq(parse1(&c, "DIWARP_INFLIGHT_SHM", name, &why), -EINVAL);
        cr_assert_not_null(strstr(why, "DIWARP_INFLIGHT_SHM="), "%s", why);
        assert_defaults(&c);
}

Test(config, from_process_environment)
{
        struct dw_config c;
        const char *why = NULL;

        /* Criterion runs each test in its own process, so setenv stays local. */
        setenv("DIWARP_PORT_BASE", "30000", 1);
        setenv("DIWARP_RC_TRANSPORT", "rd", 1);
        unsetenv("DIWARP_ADDR");
        cr_assert_eq(dw_config_from_env(&c, &why), 0);
        cr_assert_eq(c.port_base, 30000);
        cr_assert_eq(c.rc_transport, DW_RC_RD);
        cr_assert_str_eq(c.addr, "");
        setenv("DIWARP_IO", "bogus", 1);
        cr_assert_eq(dw_config_from_env(&c, &why), -EINVAL);
        cr_assert_not_null(strstr(why, "DIWARP_IO='bogus'"), "%s", why);
}

/* ---- log ---------------------------------------------------------------- */

Test(log, level_parse)
{
        cr_assert_eq(dw_log_level_parse("error"), DW_LOG_ERROR);
        cr_assert_eq(dw_log_level_parse("Warn"), DW_LOG_WARN);
        cr_assert_eq(dw_log_level_parse("info"), DW_LOG_INFO);
        cr_assert_eq(dw_log_level_parse("debug"), DW_LOG_DEBUG);
        cr_assert_eq(dw_log_level_parse("trace"), -EINVAL);
        cr_assert_eq(dw_log_level_parse(""), -EINVAL);
        cr_assert_eq(dw_log_level_parse(NULL), -EINVAL);
}

Test(log, level_from_env)
{
        unsetenv("DIWARP_LOG");
        cr_assert_eq(dw_log_level_from_env(), DW_LOG_WARN);
        setenv("DIWARP_LOG", "info", 1);
        cr_assert_eq(dw_log_level_from_env(), DW_LOG_INFO);
        setenv("DIWARP_LOG", "loud", 1);
        cr_assert_eq(dw_log_level_from_env(), -EINVAL);
}

Test(log, set_level_clamps)
{
        dw_log_set_level(99);
        cr_assert_eq(dw_log_get_level(), DW_LOG_DEBUG);
        dw_log_set_level(-3);
        cr_assert_eq(dw_log_get_level(), DW_LOG_ERROR);
}

static int evaluated;

static int side_effect(void)
{
        return ++evaluated;
}

/* Captures what the log writes to stderr while fn runs. */
static size_t capture(void (*fn)(void), char *out, size_t cap)
{
        int p[2], saved;
        ssize_t n;

        cr_assert_eq(pipe(p), 0);
        saved = dup(STDERR_FILENO);
        dup2(p[1], STDERR_FILENO);
        fn();
        dup2(saved, STDERR_FILENO);
        close(saved);
        close(p[1]);
        n = read(p[0], out, cap - 1);
        close(p[0]);
        cr_assert_geq(n, 0);
        out[n] = '\0';
        return (size_t)n;
}

static void emit_lines(void)
{
        dw_log_set_level(DW_LOG_WARN);
        dw_err("qp %u: %s", 17u, "broken");
        dw_warn("peer %s:%d gone\n", "10.0.0.2", 7471);
        dw_info("hidden %d", side_effect());
        dw_dbg("hidden %d", side_effect());
}

Test(log, format_and_filtering)
{
        char buf[4096];

        evaluated = 0;
        capture(emit_lines, buf, sizeof(buf));
        cr_assert_str_eq(buf, "diwarp: error: qp 17: broken\n"
                              "diwarp: warn: peer 10.0.0.2:7471 gone\n");
        cr_assert_eq(evaluated, 0, "arguments evaluated below the level");
}

static void emit_long(void)
{
        char big[3000];

        memset(big, 'a', sizeof(big) - 1);
        big[sizeof(big) - 1] = '\0';
        dw_log_set_level(DW_LOG_DEBUG);
        dw_dbg("%s", big);
}

Test(log, long_line_truncated_to_one_line)
{
        char buf[8192];
        size_t n = capture(emit_long, buf, sizeof(buf));

        cr_assert_gt(n, 100);
        cr_assert_leq(n, 1024);
        cr_assert_eq(strncmp(buf, "diwarp: debug: aaa", 18), 0);
        cr_assert_eq(buf[n - 1], '\n');
        cr_assert_null(memchr(buf, '\n', n - 1), "line split");
}

/* DIWARP_AUTH: off by default; file:PATH reads 16 or 32 raw bytes or hex
 * from a file only its owner may read; everything else is refused with a
 * reason naming the variable. */
static void auth_file(char *path, const void *data, size_t n, mode_t mode)
{
        strcpy(path, "/tmp/diwarp-test-key-XXXXXX");
        int fd = mkstemp(path);
        cr_assert_geq(fd, 0);
        cr_assert_eq(write(fd, data, n), (ssize_t)n);
        cr_assert_eq(fchmod(fd, mode), 0);
        close(fd);
}

static int auth_parse(struct dw_config *c, const char *path, const char **why)
{
        char v[128];
        snprintf(v, sizeof(v), "file:%s", path);
        return parse1(c, "DIWARP_AUTH", v, why);
}

Test(config, auth)
{
        struct dw_config c;
        const char *why = NULL;
        cr_assert_eq(parse1(&c, "DIWARP_AUTH", "off", &why), 0);
        cr_assert_eq(c.auth_key_len, 0);
        cr_assert(!c.auth_conn);
        /* connection: RC over RD's connection keys, no file. */
        cr_assert_eq(parse1(&c, "DIWARP_AUTH", "connection", &why), 0, "%s", why);
        cr_assert_eq(c.auth_key_len, 0);
        cr_assert(c.auth_conn);
        cr_assert_eq(parse1(&c, "DIWARP_AUTH", "connections", &why), -EINVAL);
        cr_assert(strstr(why, "connection"), "%s", why);
        char p[64];
        uint8_t raw[32];
        for (int i = 0; i < 32; i++)
                raw[i] = (uint8_t)(i * 37 + 1);
        auth_file(p, raw, 16, 0600);
        cr_assert_eq(auth_parse(&c, p, &why), 0, "%s", why);
        cr_assert_eq(c.auth_key_len, 16);
        cr_assert_eq(memcmp(c.auth_key, raw, 16), 0);
        cr_assert(c.auth_conn, "file:PATH keys RC over RD connections too");
        unlink(p);
        const char hex[] = "000102030405060708090a0b0c0d0e0f"
                           "101112131415161718191A1B1C1D1E1F\n";
        auth_file(p, hex, sizeof(hex) - 1, 0400);
        cr_assert_eq(auth_parse(&c, p, &why), 0, "%s", why);
        cr_assert_eq(c.auth_key_len, 32);
        for (int i = 0; i < 32; i++)
                cr_assert_eq(c.auth_key[i], i);
        unlink(p);
        /* Group- or world-readable, a wrong length, no file, a bad form. */
        auth_file(p, raw, 32, 0640);
        cr_assert_eq(auth_parse(&c, p, &why), -EINVAL);
        cr_assert(strstr(why, "DIWARP_AUTH") && strstr(why, "group or others"), "%s", why);
        cr_assert_eq(c.auth_key_len, 0);
        unlink(p);
        auth_file(p, raw, 20, 0600);
        cr_assert_eq(auth_parse(&c, p, &why), -EINVAL);
        cr_assert(strstr(why, "16 or 32"), "%s", why);
        unlink(p);
        cr_assert_eq(auth_parse(&c, p, &why), -EINVAL);
        cr_assert(strstr(why, "cannot open"), "%s", why);
        cr_assert_eq(parse1(&c, "DIWARP_AUTH", "on", &why), -EINVAL);
        cr_assert(strstr(why, "DIWARP_AUTH='on'"), "%s", why);
        cr_assert_eq(parse1(&c, "DIWARP_AUTH", "file:", &why), -EINVAL);
}
