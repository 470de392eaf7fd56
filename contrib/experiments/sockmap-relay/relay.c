/*
 * A throwaway relay to measure a sockmap (BPF_MAP_TYPE_SOCKHASH + an
 * sk_skb verdict program) against a plain copy through a user-space
 * buffer, on loopback in a namespace of its own. Not part of sluice:
 * docs/measurements/history/2026-12-05-bulk-round-16-sockmap-and-buffers.md
 * ("Bulk, round sixteen") says what it found and why sluice's relay stays
 * a copy.
 *
 *   gcc -O2 -o relay relay.c -lpthread
 *   ip netns add relaytest && ip -n relaytest link set lo up
 *   ip netns exec relaytest ./relay origin &
 *   ip netns exec relaytest ./relay proxy copy &      # or: proxy sockmap
 *   ip netns exec relaytest ./relay client 30         # direct and proxied, alternated
 *   ip netns exec relaytest ./relay stall             # a client that never reads
 *
 * Environment: BS=<bytes> the copy's buffer (default 16384); STREAM=1
 * attaches the verdict as BPF_SK_SKB_STREAM_VERDICT instead of
 * BPF_SK_SKB_VERDICT.
 *
 * The origin (127.0.0.1:9001) answers one byte with 32 MiB in 64 KiB
 * writes and closes; the proxy listens on 127.0.0.1:9000.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <linux/bpf.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define BODY (32u << 20)
#define ORIGIN_PORT 9001
#define PROXY_PORT 9000

static int listen_on(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(s, (void *)&a, sizeof a)) { perror("bind"); exit(1); }
    listen(s, 128);
    return s;
}

static int connect_to(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(s, (void *)&a, sizeof a)) { perror("connect"); exit(1); }
    return s;
}

/* ---- origin ---- */

static void *origin_conn(void *p) {
    int c = (long)p;
    static char body[65536];
    char req;
    if (read(c, &req, 1) != 1) { close(c); return 0; }
    unsigned off = 0;
    while (off < BODY) {
        ssize_t n = write(c, body, sizeof body);
        if (n <= 0) break;
        off += n;
    }
    fprintf(stderr, "origin wrote %u\n", off);
    close(c);
    return 0;
}

static void origin(void) {
    int l = listen_on(ORIGIN_PORT);
    for (;;) {
        pthread_t t;
        pthread_create(&t, 0, origin_conn, (void *)(long)accept(l, 0, 0));
        pthread_detach(t);
    }
}

/* ---- sockmap ---- */

static long bpf(int cmd, union bpf_attr *a) { return syscall(SYS_bpf, cmd, a, sizeof *a); }

#define INSN(c, d, s, o, i) ((struct bpf_insn){.code = (c), .dst_reg = (d), .src_reg = (s), .off = (o), .imm = (i)})

static int map_fd;

/* The verdict: redirect each skb to the socket stored under the receiving
 * socket's own cookie (its peer), out of the peer's egress. */
static void load_verdict(void) {
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.map_type = BPF_MAP_TYPE_SOCKHASH;
    a.key_size = 8;
    a.value_size = 8;
    a.max_entries = 65536;
    map_fd = bpf(BPF_MAP_CREATE, &a);
    if (map_fd < 0) { perror("map create"); exit(1); }
    struct bpf_insn prog[] = {
        INSN(BPF_ALU64 | BPF_MOV | BPF_X, 6, 1, 0, 0),                  /* r6 = skb */
        INSN(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_get_socket_cookie),  /* r0 = cookie */
        INSN(BPF_STX | BPF_MEM | BPF_DW, 10, 0, -8, 0),                 /* key on the stack */
        INSN(BPF_ALU64 | BPF_MOV | BPF_X, 1, 6, 0, 0),                  /* r1 = skb */
        INSN(BPF_LD | BPF_IMM | BPF_DW, 2, BPF_PSEUDO_MAP_FD, 0, map_fd), INSN(0, 0, 0, 0, 0),
        INSN(BPF_ALU64 | BPF_MOV | BPF_X, 3, 10, 0, 0),
        INSN(BPF_ALU64 | BPF_ADD | BPF_K, 3, 0, 0, -8),                 /* r3 = &key */
        INSN(BPF_ALU64 | BPF_MOV | BPF_K, 4, 0, 0, 0),                  /* flags: egress */
        INSN(BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_sk_redirect_hash),
        INSN(BPF_JMP | BPF_EXIT, 0, 0, 0, 0),
    };
    static char log[65536];
    memset(&a, 0, sizeof a);
    a.prog_type = BPF_PROG_TYPE_SK_SKB;
    a.insns = (unsigned long)prog;
    a.insn_cnt = sizeof prog / sizeof prog[0];
    a.license = (unsigned long)"GPL";
    a.log_buf = (unsigned long)log;
    a.log_size = sizeof log;
    a.log_level = 1;
    int prog_fd = bpf(BPF_PROG_LOAD, &a);
    if (prog_fd < 0) { perror("prog load"); fprintf(stderr, "%s\n", log); exit(1); }
    memset(&a, 0, sizeof a);
    a.target_fd = map_fd;
    a.attach_bpf_fd = prog_fd;
    a.attach_type = getenv("STREAM") ? BPF_SK_SKB_STREAM_VERDICT : BPF_SK_SKB_VERDICT;
    if (bpf(BPF_PROG_ATTACH, &a)) { perror("attach"); exit(1); }
}

static unsigned long long cookie(int s) {
    unsigned long long c = 0;
    socklen_t l = sizeof c;
    getsockopt(s, SOL_SOCKET, SO_COOKIE, &c, &l);
    return c;
}

/* key: cookie(receiver), value: the socket its bytes go out of. */
static void pair_up(int receiver, int peer) {
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    unsigned long long k = cookie(receiver), v = peer;
    a.map_fd = map_fd;
    a.key = (unsigned long)&k;
    a.value = (unsigned long)&v;
    a.flags = BPF_ANY;
    if (bpf(BPF_MAP_UPDATE_ELEM, &a)) { perror("map update"); exit(1); }
}

static struct tcp_info info(int s) {
    struct tcp_info i;
    socklen_t l = sizeof i;
    memset(&i, 0, sizeof i);
    getsockopt(s, IPPROTO_TCP, TCP_INFO, &i, &l);
    return i;
}

/* Bytes handed to `s` so far: acknowledged, then still queued (read in that
 * order, so a concurrent ACK can only make this an undercount). */
static unsigned long long handed_to(int s) {
    unsigned long long acked = info(s).tcpi_bytes_acked;
    int queued = 0;
    ioctl(s, SIOCOUTQ, &queued);
    return acked + queued;
}

/* `from` has seen its peer's FIN. Without this wait the half-close passed
 * on overtakes bytes still in the redirect's queue, and they are lost: the
 * client got 5 to 31 MiB of 32 in every transfer of a first version. */
static void drain_then_half_close(int from, int to) {
    unsigned long long got = info(from).tcpi_bytes_received - 1; /* the FIN */
    while (handed_to(to) < got) usleep(50);
    shutdown(to, SHUT_WR);
}

static void relay_by_sockmap(int c, int u) {
    pair_up(c, u);
    pair_up(u, c);
    int c_done = 0, u_done = 0;
    char b[16];
    while (!(c_done && u_done)) {
        struct pollfd f[2] = {{c, POLLIN | POLLRDHUP, 0}, {u, POLLIN | POLLRDHUP, 0}};
        poll(f, 2, -1);
        if (!c_done && f[0].revents && recv(c, b, sizeof b, MSG_DONTWAIT) == 0) {
            c_done = 1;
            drain_then_half_close(c, u);
        }
        if (!u_done && f[1].revents && recv(u, b, sizeof b, MSG_DONTWAIT) == 0) {
            u_done = 1;
            drain_then_half_close(u, c);
        }
    }
}

/* ---- copy ---- */

struct direction { int from, to; };

static void *copy_one_way(void *p) {
    struct direction *d = p;
    static __thread char buf[1 << 20];
    size_t size = getenv("BS") ? (size_t)atoi(getenv("BS")) : 16384;
    if (size > sizeof buf) size = sizeof buf;
    for (;;) {
        ssize_t n = read(d->from, buf, size);
        if (n <= 0) break;
        for (ssize_t o = 0; o < n;) {
            ssize_t w = write(d->to, buf + o, n - o);
            if (w <= 0) goto out;
            o += w;
        }
    }
out:
    shutdown(d->to, SHUT_WR);
    return 0;
}

static void relay_by_copy(int c, int u) {
    struct direction up = {c, u}, down = {u, c};
    pthread_t t;
    pthread_create(&t, 0, copy_one_way, &up);
    copy_one_way(&down);
    pthread_join(t, 0);
}

static int by_sockmap;

static void *proxy_conn(void *p) {
    int c = (long)p, u = connect_to(ORIGIN_PORT);
    if (by_sockmap) relay_by_sockmap(c, u); else relay_by_copy(c, u);
    close(c);
    close(u);
    return 0;
}

static void proxy(const char *mode) {
    by_sockmap = !strcmp(mode, "sockmap");
    if (by_sockmap) load_verdict();
    int l = listen_on(PROXY_PORT);
    for (;;) {
        pthread_t t;
        pthread_create(&t, 0, proxy_conn, (void *)(long)accept(l, 0, 0));
        pthread_detach(t);
    }
}

/* ---- client ---- */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double one_transfer(int port) {
    static char buf[1 << 20];
    double t0 = now();
    int s = connect_to(port);
    if (write(s, "G", 1) != 1) exit(1);
    unsigned long got = 0;
    for (ssize_t n; (n = read(s, buf, sizeof buf)) > 0;) got += n;
    close(s);
    if (got != BODY) fprintf(stderr, "short: %lu of %u bytes\n", got, BODY);
    return now() - t0;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void client(int n) {
    double direct[1000], proxied[1000];
    if (n > 1000) n = 1000;
    for (int i = 0; i < n; i++) {
        direct[i] = one_transfer(ORIGIN_PORT);
        proxied[i] = one_transfer(PROXY_PORT);
    }
    qsort(direct, n, sizeof(double), by_value);
    qsort(proxied, n, sizeof(double), by_value);
    printf("direct median %.2f ms, proxied %.2f ms: %.1f%% of direct's speed\n",
           direct[n / 2] * 1e3, proxied[n / 2] * 1e3, 100 * direct[n / 2] / proxied[n / 2]);
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    if (argc >= 2 && !strcmp(argv[1], "origin")) origin();
    else if (argc >= 3 && !strcmp(argv[1], "proxy")) proxy(argv[2]);
    else if (argc >= 3 && !strcmp(argv[1], "client")) client(atoi(argv[2]));
    else if (argc >= 2 && !strcmp(argv[1], "stall")) {
        int s = connect_to(PROXY_PORT);
        if (write(s, "G", 1) != 1) return 1;
        sleep(3);
    } else {
        fprintf(stderr, "usage: relay origin | proxy copy|sockmap | client N | stall\n");
        return 2;
    }
    return 0;
}
