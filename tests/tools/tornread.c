/* tornread: torn-read detector for a file on an NFS mount (or any file).
 *
 * Writer threads rewrite random 8 KiB blocks; every write stamps each of
 * the block's 16 512-byte sectors with the block number and a generation
 * no other write uses. Reader threads read random blocks and check that
 * each is self-consistent: every sector has the magic, its own index, the
 * right block number, one same generation for all 16, and intact filler.
 * Reads and writes use O_DIRECT so that, on an NFS mount, each one is a
 * READ or WRITE to the server rather than a page-cache access.
 *
 * Sector layout (little endian; the same as bench/torn_read.py):
 *   0 "TORN" | 4 u32 sector | 8 u64 block | 16 u64 generation |
 *   24 u64 W = mix(block, generation, sector) | 32..511 W repeated 60 times
 *
 * usage:
 *   tornread selftest                 check the checker; exit 0 if it works
 *   tornread block B G                write block B at generation G to stdout
 *   tornread init FILE BLOCKS         create FILE with BLOCKS blocks at gen 0
 *   tornread run FILE BLOCKS WRITERS READERS READS SECONDS [PROGRESS [STOP]]
 *                                     the workload: READS checked reads in
 *                                     total (shared by the readers), at most
 *                                     SECONDS; writers run until readers stop.
 *                                     PROGRESS > 0: print a "progress" line
 *                                     every PROGRESS seconds; STOP > 0: stop
 *                                     once STOP torn reads were seen
 *
 * `run` prints "checked N torn T writes W ..." and a JSON line; exit 0 when
 * no torn read was seen, 1 when some were, 2 on errors. Progress lines read
 *   progress FILE t S checked N torn T writes W
 * with running totals.
 *
 * Build: gcc -static -O2 -Wall -pthread -o tornread tornread.c
 * (add -DTORNREAD_BUFFERED for buffered instead of O_DIRECT I/O)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BLOCK 8192
#define SECTOR 512
#define SECTORS (BLOCK / SECTOR)
#define MAX_EXAMPLES 5
/* -DTORNREAD_BUFFERED: page-cache I/O instead, to probe a local file
 * system's own read/write atomicity (a host-side experiment). */
#ifdef TORNREAD_BUFFERED
#define IO_FLAGS 0
#else
#define IO_FLAGS O_DIRECT
#endif

static uint64_t mix(uint64_t block, uint64_t gen, uint64_t sector) {
    uint64_t x = block * 0x9E3779B97F4A7C15ULL + gen * 0xC2B2AE3D27D4EB4FULL +
                 sector * 0x165667B19E3779F9ULL;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 32;
    return x;
}

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get32(const unsigned char *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}
static uint64_t get64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void make_sector(unsigned char *s, uint64_t block, uint64_t gen, uint32_t sector) {
    uint64_t w = mix(block, gen, sector);
    memcpy(s, "TORN", 4);
    put32(s + 4, sector);
    put64(s + 8, block);
    put64(s + 16, gen);
    for (int off = 24; off < SECTOR; off += 8) put64(s + off, w);
}

static void make_block(unsigned char *b, uint64_t block, uint64_t gen) {
    for (uint32_t s = 0; s < SECTORS; s++) make_sector(b + s * SECTOR, block, gen, s);
}

/* Is sector s of buf intact (magic, index, block, filler for its own gen)? */
static int sector_ok(const unsigned char *buf, uint64_t block, uint32_t s, uint64_t *gen) {
    const unsigned char *p = buf + s * SECTOR;
    if (memcmp(p, "TORN", 4) != 0 || get32(p + 4) != s || get64(p + 8) != block) return 0;
    *gen = get64(p + 16);
    uint64_t w = mix(block, *gen, s);
    for (int off = 24; off < SECTOR; off += 8)
        if (get64(p + off) != w) return 0;
    return 1;
}

/* 0 when the block read is self-consistent; else 1 and a description. */
static int check_block(const unsigned char *buf, size_t len, uint64_t block, char *why,
                       size_t whylen) {
    if (len != BLOCK) {
        snprintf(why, whylen, "block %llu: short read of %zu bytes", (unsigned long long)block,
                 len);
        return 1;
    }
    uint64_t g0 = 0, g;
    int bad = 0, mixed = 0;
    for (uint32_t s = 0; s < SECTORS; s++) {
        if (!sector_ok(buf, block, s, &g)) {
            bad = 1;
            continue;
        }
        if (s == 0) g0 = g;
        else if (g != g0) mixed = 1;
    }
    if (!bad && !mixed) return 0;
    int n = snprintf(why, whylen, "block %llu:", (unsigned long long)block);
    for (uint32_t s = 0; s < SECTORS && n > 0 && (size_t)n < whylen; s++) {
        const unsigned char *p = buf + s * SECTOR;
        int ok = sector_ok(buf, block, s, &g);
        n += snprintf(why + n, whylen - n, " %u:b%llug%llu%s", s,
                      (unsigned long long)get64(p + 8), (unsigned long long)get64(p + 16),
                      ok ? "" : "!");
    }
    return 1;
}

/* ------------------------------------------------------------------ */

static int selftest(void) {
    unsigned char a[BLOCK], b[BLOCK], t[BLOCK];
    char why[1024];
    int fails = 0;
    make_block(a, 5, 7);
    make_block(b, 5, 9);
    if (check_block(a, BLOCK, 5, why, sizeof why) != 0) {
        printf("FAIL: consistent block rejected: %s\n", why);
        fails++;
    }
    if (check_block(a, BLOCK, 6, why, sizeof why) == 0) {
        printf("FAIL: block 5 accepted as block 6\n");
        fails++;
    }
    /* Torn at a page boundary: first 4 KiB of gen 7, rest of gen 9. */
    memcpy(t, a, 4096);
    memcpy(t + 4096, b + 4096, BLOCK - 4096);
    if (check_block(t, BLOCK, 5, why, sizeof why) == 0) {
        printf("FAIL: page-torn block accepted\n");
        fails++;
    } else {
        printf("detected: %s\n", why);
    }
    /* Torn at a sector boundary: only sector 15 of the other generation. */
    memcpy(t, a, BLOCK);
    memcpy(t + 15 * SECTOR, b + 15 * SECTOR, SECTOR);
    if (check_block(t, BLOCK, 5, why, sizeof why) == 0) {
        printf("FAIL: sector-torn block accepted\n");
        fails++;
    }
    /* Torn inside a sector: 100 bytes of sector 3 from the other write. */
    memcpy(t, a, BLOCK);
    memcpy(t + 3 * SECTOR + 200, b + 3 * SECTOR + 200, 100);
    if (check_block(t, BLOCK, 5, why, sizeof why) == 0) {
        printf("FAIL: torn-within-sector block accepted\n");
        fails++;
    }
    if (check_block(a, BLOCK - 1, 5, why, sizeof why) == 0) {
        printf("FAIL: short read accepted\n");
        fails++;
    }
    printf(fails ? "selftest FAILED\n" : "selftest ok\n");
    return fails ? 1 : 0;
}

/* ------------------------------------------------------------------ */

struct shared {
    const char *file;
    uint64_t blocks;
    int writers;
    double deadline;
    uint64_t stop_after_torn; /* 0: never */
    atomic_int stop;
    atomic_int errors;
    /* Running totals for progress lines and stop_after_torn. */
    atomic_ullong reads, torn, writes;
    pthread_mutex_t mu;
    int examples;
};

struct worker {
    struct shared *sh;
    int id;
    int writer;
    uint64_t quota;
    uint64_t done;
    uint64_t torn;
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t xorshift(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

static void *work(void *arg) {
    struct worker *w = arg;
    struct shared *sh = w->sh;
    int fd = open(sh->file, (w->writer ? O_RDWR : O_RDONLY) | IO_FLAGS);
    if (fd < 0) {
        fprintf(stderr, "tornread: open %s: %s\n", sh->file, strerror(errno));
        atomic_fetch_add(&sh->errors, 1);
        atomic_store(&sh->stop, 1);
        return NULL;
    }
    unsigned char *buf;
    if (posix_memalign((void **)&buf, 4096, BLOCK) != 0) abort();
    uint64_t rs = 0x9E3779B97F4A7C15ULL * (uint64_t)(w->id * 2 + w->writer + 1);
    char why[1024];
    while (!atomic_load_explicit(&sh->stop, memory_order_relaxed)) {
        uint64_t b = xorshift(&rs) % sh->blocks;
        off_t off = (off_t)(b * BLOCK);
        if (w->writer) {
            make_block(buf, b, w->done * (uint64_t)sh->writers + (uint64_t)w->id + 1);
            ssize_t n = pwrite(fd, buf, BLOCK, off);
            if (n != BLOCK) {
                fprintf(stderr, "tornread: pwrite block %llu: %zd %s\n", (unsigned long long)b,
                        n, n < 0 ? strerror(errno) : "short");
                atomic_fetch_add(&sh->errors, 1);
                atomic_store(&sh->stop, 1);
                break;
            }
            w->done++;
            atomic_fetch_add_explicit(&sh->writes, 1, memory_order_relaxed);
        } else {
            if (w->done >= w->quota) break;
            if ((w->done & 63) == 0 && now() >= sh->deadline) break;
            ssize_t n = pread(fd, buf, BLOCK, off);
            if (n < 0) {
                fprintf(stderr, "tornread: pread block %llu: %s\n", (unsigned long long)b,
                        strerror(errno));
                atomic_fetch_add(&sh->errors, 1);
                atomic_store(&sh->stop, 1);
                break;
            }
            w->done++;
            if (check_block(buf, (size_t)n, b, why, sizeof why)) {
                w->torn++;
                pthread_mutex_lock(&sh->mu);
                if (sh->examples++ < MAX_EXAMPLES) printf("torn: %s: %s\n", sh->file, why);
                pthread_mutex_unlock(&sh->mu);
                uint64_t t = atomic_fetch_add_explicit(&sh->torn, 1, memory_order_relaxed) + 1;
                if (sh->stop_after_torn && t >= sh->stop_after_torn) atomic_store(&sh->stop, 1);
            }
            /* Counted after the check, so a progress line never shows a
             * read whose verdict is not in its torn count yet. */
            atomic_fetch_add_explicit(&sh->reads, 1, memory_order_relaxed);
        }
    }
    free(buf);
    close(fd);
    return NULL;
}

static int init_file(const char *file, uint64_t blocks) {
    int fd = open(file, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        fprintf(stderr, "tornread: create %s: %s\n", file, strerror(errno));
        return 2;
    }
    unsigned char b[BLOCK];
    for (uint64_t i = 0; i < blocks; i++) {
        make_block(b, i, 0);
        if (pwrite(fd, b, BLOCK, (off_t)(i * BLOCK)) != BLOCK) {
            fprintf(stderr, "tornread: write %s: %s\n", file, strerror(errno));
            return 2;
        }
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        fprintf(stderr, "tornread: fsync %s: %s\n", file, strerror(errno));
        return 2;
    }
    return 0;
}

/* Sleep until the readers are done (reported through `done`), printing a
 * progress line every `every` seconds. */
static void watch(struct shared *sh, atomic_int *done, double t0, double every) {
    double next = t0 + every;
    while (!atomic_load(done)) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        double t = now();
        if (t < next || atomic_load(done)) continue;
        next += every;
        printf("progress %s t %.1f checked %llu torn %llu writes %llu\n", sh->file, t - t0,
               (unsigned long long)atomic_load(&sh->reads),
               (unsigned long long)atomic_load(&sh->torn),
               (unsigned long long)atomic_load(&sh->writes));
    }
}

struct joiner {
    pthread_t *th;
    int from, to;
    atomic_int done;
};

static void *join_readers(void *arg) {
    struct joiner *j = arg;
    for (int i = j->from; i < j->to; i++) pthread_join(j->th[i], NULL);
    atomic_store(&j->done, 1);
    return NULL;
}

static int run(const char *file, uint64_t blocks, int writers, int readers, uint64_t reads,
               double seconds, double progress, uint64_t stop_after_torn) {
    struct shared sh = {.file = file, .blocks = blocks, .writers = writers,
                        .stop_after_torn = stop_after_torn};
    pthread_mutex_init(&sh.mu, NULL);
    int n = writers + readers;
    struct worker *ws = calloc((size_t)n, sizeof *ws);
    pthread_t *th = calloc((size_t)n, sizeof *th);
    double t0 = now();
    sh.deadline = t0 + seconds;
    for (int i = 0; i < n; i++) {
        ws[i].sh = &sh;
        ws[i].writer = i < writers;
        ws[i].id = ws[i].writer ? i : i - writers;
        if (!ws[i].writer)
            ws[i].quota = reads / readers + ((uint64_t)ws[i].id < reads % readers);
        if (pthread_create(&th[i], NULL, work, &ws[i]) != 0) {
            fprintf(stderr, "tornread: pthread_create failed\n");
            return 2;
        }
    }
    if (progress > 0) {
        struct joiner j = {.th = th, .from = writers, .to = n};
        pthread_t jt;
        if (pthread_create(&jt, NULL, join_readers, &j) != 0) {
            fprintf(stderr, "tornread: pthread_create failed\n");
            return 2;
        }
        watch(&sh, &j.done, t0, progress);
        pthread_join(jt, NULL);
    } else {
        for (int i = writers; i < n; i++) pthread_join(th[i], NULL);
    }
    double t1 = now();
    atomic_store(&sh.stop, 1);
    for (int i = 0; i < writers; i++) pthread_join(th[i], NULL);
    uint64_t checked = 0, torn = 0, writes = 0;
    for (int i = 0; i < n; i++) {
        if (ws[i].writer) writes += ws[i].done;
        else {
            checked += ws[i].done;
            torn += ws[i].torn;
        }
    }
    double el = t1 - t0 > 1e-9 ? t1 - t0 : 1e-9;
    int errors = atomic_load(&sh.errors);
    printf("checked %llu torn %llu writes %llu seconds %.3f reads/s %.1f writes/s %.1f errors %d\n",
           (unsigned long long)checked, (unsigned long long)torn, (unsigned long long)writes, el,
           checked / el, writes / el, errors);
    printf("{\"tool\": \"tornread\", \"file\": \"%s\", \"blocks\": %llu, \"writers\": %d, \"readers\": %d, "
           "\"reads_target\": %llu, \"checked_reads\": %llu, \"torn_reads\": %llu, "
           "\"writes\": %llu, \"seconds\": %.3f, \"reads_per_s\": %.1f, \"writes_per_s\": %.1f, "
           "\"errors\": %d}\n",
           file, (unsigned long long)blocks, writers, readers, (unsigned long long)reads,
           (unsigned long long)checked, (unsigned long long)torn, (unsigned long long)writes, el,
           checked / el, writes / el, errors);
    fflush(stdout);
    return errors ? 2 : torn ? 1 : 0;
}

static int usage(void) {
    fprintf(stderr,
            "usage: tornread selftest | block B G | init FILE BLOCKS |\n"
            "       run FILE BLOCKS WRITERS READERS READS SECONDS [PROGRESS [STOP]]\n");
    return 2;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) return usage();
    if (strcmp(argv[1], "selftest") == 0) return selftest();
    if (strcmp(argv[1], "block") == 0 && argc == 4) {
        unsigned char b[BLOCK];
        make_block(b, strtoull(argv[2], NULL, 0), strtoull(argv[3], NULL, 0));
        return fwrite(b, 1, BLOCK, stdout) == BLOCK ? 0 : 2;
    }
    if (strcmp(argv[1], "init") == 0 && argc == 4)
        return init_file(argv[2], strtoull(argv[3], NULL, 0));
    if (strcmp(argv[1], "run") == 0 && argc >= 8 && argc <= 10) {
        uint64_t blocks = strtoull(argv[3], NULL, 0), reads = strtoull(argv[6], NULL, 0);
        int writers = atoi(argv[4]), readers = atoi(argv[5]);
        double seconds = atof(argv[7]);
        double progress = argc > 8 ? atof(argv[8]) : 0;
        uint64_t stop = argc > 9 ? strtoull(argv[9], NULL, 0) : 0;
        if (blocks < 1 || writers < 1 || readers < 1 || reads < 1 || seconds <= 0 ||
            progress < 0)
            return usage();
        return run(argv[2], blocks, writers, readers, reads, seconds, progress, stop);
    }
    return usage();
}
