/* What would a miss cost under a full budget if 4 KiB pages were filled by
 * copy instead of by move? (issue 40: "a fill model per page size",
 * "eviction in batches"). Before building either into faultline, this
 * replays the steady state of a store-backed region through a full
 * budget — every miss evicts one resident page and fills one absent page —
 * with the kernel calls each design makes, side by side in one run, beside
 * a program thread that keeps running on the other CPU (so every TLB flush
 * must interrupt it, as a program thread beside faultline's worker does).
 * The "store read" is a 4 KiB memset, the same in every design.
 *
 *   move     today: park the victim with UFFDIO_MOVE into its frame's pool
 *            slot (a flush), fill the freed frame, UFFDIO_MOVE it into the
 *            absent page (a flush: the slot's PTE is cleared).
 *   copy     park as today; fill the freed frame and UFFDIO_COPY it into
 *            the absent page (a fresh PTE: no flush). The frame's slot
 *            still holds a stale copy that must go before a page parks in
 *            it: stale slots are dropped 64 at a time with one
 *            process_madvise(MADV_DONTNEED). The pool is registered with a
 *            second userfaultfd that has no UFFD_FEATURE_EVENT_REMOVE, so
 *            the drop raises no event (UFFDIO_MOVE checks only that its
 *            destination is registered with the context it is issued on).
 *   copy-1   as copy, with the pool on the regions' userfaultfd, which asks
 *            for UFFD_FEATURE_EVENT_REMOVE (as faultline's does, for the
 *            program's own drops): every drop raises a REMOVE event, waits
 *            until a reader thread has read it, and fails concurrent
 *            moves meanwhile.
 *   drop     the batched eviction: no parking; victims are
 *            dropped from the region 64 at a time with one
 *            process_madvise(MADV_DONTNEED) (raising REMOVE events, the
 *            region being on the userfaultfd with EVENT_REMOVE), fills are
 *            UFFDIO_COPY from a staging buffer. (It has no second chance
 *            and no snapshot for write-back: the lower bound of cost.)
 *
 * Then what dirty tracking by synchronous write-protection would cost (a
 * page filled with UFFDIO_COPY_MODE_WP, so a clean page cannot be written
 * without faultline hearing of it, and may be dropped safely):
 *
 *   wp-protect    UFFDIO_WRITEPROTECT of one writable page (a flush?)
 *   wp-unprotect  UFFDIO_WRITEPROTECT clearing it again (a flush?)
 *   wp-fault      a thread's first write to a protected page: the fault's
 *                 round trip through a handler thread that unprotects it
 *                 (the program thread stopped first; writer on CPU 1,
 *                 handler on CPU 0)
 *
 * Build and run (root not needed where userfaultfd is allowed):
 *   cc -O2 -pthread -o /tmp/fill_model crates/faultline-sys/bench/fill_model.c
 *   /tmp/fill_model [misses per round] [rounds]
 * Prints per design the median (min-max over rounds) of microseconds per
 * miss, the TLB shootdowns per miss (/proc/interrupts "TLB"), and the
 * REMOVE events read per miss. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define PAGE 4096UL
#define PAGES 8192UL   /* region and pool: 32 MiB each */
#define HOT 64UL       /* pages the program thread reads, never evicted */
#define BUDGET 2048UL  /* resident pages in the cycle (8 MiB) */
#define BATCH 64

enum design { MOVE, COPY, COPY_ONE, DROP, DESIGNS };
static const char *names[] = { "move", "copy", "copy-1", "drop" };

static volatile int stop;
static volatile unsigned long removes;
static char *region, *pool, *staging;
static int uffd_a, uffd_b, uffd_c, pidfd;
static char *tracked; /* the write-protection region, on uffd_c */

static void die(const char *what) {
    perror(what);
    exit(1);
}

/* The program thread: reads its hot pages on the other CPU. */
static void *program(void *arg) {
    (void)arg;
    pin(1);
    unsigned long sum = 0, i = 0;
    while (!stop) {
        sum += region[(PAGES - HOT) * PAGE + (i * 4099) % (HOT * PAGE)];
        i++;
    }
    return (void *)sum;
}

/* Reads the regions' userfaultfd: REMOVE events (no faults are expected). */
static void *reader(void *arg) {
    (void)arg;
    struct uffd_msg msg[16];
    while (!stop) {
        struct pollfd p = { .fd = uffd_a, .events = POLLIN };
        if (poll(&p, 1, 10) <= 0) continue;
        ssize_t n = read(uffd_a, msg, sizeof msg);
        for (ssize_t i = 0; i < n / (ssize_t)sizeof msg[0]; i++) {
            if (msg[i].event == UFFD_EVENT_REMOVE) removes = removes + 1;
            else if (msg[i].event == UFFD_EVENT_PAGEFAULT) {
                fprintf(stderr, "unexpected fault at %llx\n", (unsigned long long)msg[i].arg.pagefault.address);
                exit(1);
            }
        }
    }
    return 0;
}

static void move(int uffd, char *dst, char *src) {
    struct move_args m = { (uint64_t)dst, (uint64_t)src, PAGE, 0, 0 };
    while (ioctl(uffd, UFFDIO_MOVE_NR, &m) != 0) {
        if (errno != EAGAIN) die("UFFDIO_MOVE");
        m.move = 0; /* an unread REMOVE event: retry */
    }
}

static void copy(char *dst, char *src) {
    struct uffdio_copy c = { (uint64_t)dst, (uint64_t)src, PAGE, 0, 0 };
    while (ioctl(uffd_a, UFFDIO_COPY, &c) != 0) {
        if (errno != EAGAIN) die("UFFDIO_COPY");
        c.copy = 0;
    }
}

static void drop(struct iovec *iov, int n) {
    long done = syscall(SYS_process_madvise, pidfd, iov, n, MADV_DONTNEED, 0);
    if (done != (long)(n * PAGE)) die("process_madvise(MADV_DONTNEED)");
}

/* The cycle's bookkeeping: which region pages are resident, and the pool
 * slot each one came from (its frame). */
static unsigned long page_of[BUDGET], slot_of[BUDGET];
static unsigned long absent[PAGES - HOT - BUDGET];
static unsigned long rng = 88172645463325252ULL;

static unsigned long next_rand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Fills the budget: resident pages 0..BUDGET with slots 0..BUDGET (moved
 * in, so every slot is a hole and every design starts alike). */
static void setup(void) {
    for (unsigned long i = 0; i < BUDGET; i++) {
        memset(pool + i * PAGE, (int)i, PAGE);
        move(uffd_a, region + i * PAGE, pool + i * PAGE);
        page_of[i] = i;
        slot_of[i] = i;
    }
    for (unsigned long i = 0; i < PAGES - HOT - BUDGET; i++) absent[i] = BUDGET + i;
}

/* Empties the cycle's pages again (untimed). */
static void teardown(void) {
    madvise(region, (PAGES - HOT) * PAGE, MADV_DONTNEED);
    madvise(pool, PAGES * PAGE, MADV_DONTNEED);
}

static double run(enum design d, unsigned long misses, unsigned long long *flushes, unsigned long *events) {
    setup();
    struct iovec stale[BATCH];
    int nstale = 0;
    unsigned long nabsent = PAGES - HOT - BUDGET;
    int uffd_pool = d == COPY ? uffd_b : uffd_a;
    unsigned long long f0 = shootdowns();
    unsigned long e0 = removes;
    double t0 = now();
    for (unsigned long m = 0; m < misses; m++) {
        unsigned long v = next_rand() % BUDGET, k = next_rand() % nabsent;
        unsigned long a = absent[k];
        char *victim = region + page_of[v] * PAGE, *target = region + a * PAGE;
        char *slot = pool + slot_of[v] * PAGE;
        if (d == DROP) {
            stale[nstale].iov_base = victim;
            stale[nstale].iov_len = PAGE;
            if (++nstale == BATCH) { drop(stale, nstale); nstale = 0; }
            /* A victim still in the batch is not absent yet. */
            for (int i = 0; i < nstale; i++)
                if (stale[i].iov_base == target) { drop(stale, nstale); nstale = 0; break; }
            memset(staging, (int)m, PAGE);
            copy(target, staging);
        } else {
            if (d != MOVE) {
                /* The victim's slot must be a hole before it parks there. */
                for (int i = 0; i < nstale; i++)
                    if (stale[i].iov_base == slot) { drop(stale, nstale); nstale = 0; break; }
            }
            move(uffd_pool, slot, victim); /* park; evicted clean: the frame is free */
            memset(slot, (int)m, PAGE);    /* the store's bytes */
            if (d == MOVE) {
                move(uffd_a, target, slot);
            } else {
                copy(target, slot);
                stale[nstale].iov_base = slot;
                stale[nstale].iov_len = PAGE;
                if (++nstale == BATCH) { drop(stale, nstale); nstale = 0; }
            }
        }
        absent[k] = page_of[v];
        page_of[v] = a;
    }
    if (nstale) drop(stale, nstale);
    double spent = now() - t0;
    *flushes = shootdowns() - f0;
    *events = removes - e0;
    teardown();
    return spent;
}

static void protect(char *page, int on) {
    struct uffdio_writeprotect w = { { (unsigned long)page, PAGE },
                                     on ? UFFDIO_WRITEPROTECT_MODE_WP : 0 };
    if (ioctl(uffd_c, UFFDIO_WRITEPROTECT, &w)) die("UFFDIO_WRITEPROTECT");
}

/* Fills the tracked region's first `n` pages write-protected (untimed). */
static void fill_protected(unsigned long n) {
    madvise(tracked, PAGES * PAGE, MADV_DONTNEED);
    for (unsigned long i = 0; i < n; i++) {
        struct uffdio_copy c = { (uint64_t)(tracked + i * PAGE), (uint64_t)staging, PAGE,
                                 UFFDIO_COPY_MODE_WP, 0 };
        if (ioctl(uffd_c, UFFDIO_COPY, &c)) die("UFFDIO_COPY_MODE_WP");
    }
}

/* Times protecting (or unprotecting) `n` pages one at a time. */
static double wp_each(unsigned long n, int on, unsigned long long *flushes) {
    fill_protected(n);
    if (on)
        for (unsigned long i = 0; i < n; i++) protect(tracked + i * PAGE, 0);
    unsigned long sum = 0;
    for (unsigned long i = 0; i < n; i++) sum += ((volatile char *)tracked)[i * PAGE]; /* in the TLB */
    if (sum == 1) printf(" ");
    unsigned long long f0 = shootdowns();
    double t0 = now();
    for (unsigned long i = 0; i < n; i++) protect(tracked + i * PAGE, on);
    double spent = now() - t0;
    *flushes = shootdowns() - f0;
    return spent;
}

static volatile unsigned long written;

static void *writer(void *arg) {
    unsigned long n = (unsigned long)arg;
    pin(1);
    for (unsigned long i = 0; i < n; i++) {
        tracked[i * PAGE] = 2;
        written = i + 1;
    }
    return 0;
}

/* Times `n` first writes to protected pages, each unprotected by this
 * thread when its fault arrives. */
static double wp_faults(unsigned long n) {
    fill_protected(n);
    pthread_t w;
    double t0 = now();
    pthread_create(&w, 0, writer, (void *)n);
    while (written < n) {
        struct pollfd p = { .fd = uffd_c, .events = POLLIN };
        if (poll(&p, 1, 100) <= 0) continue;
        struct uffd_msg msg;
        if (read(uffd_c, &msg, sizeof msg) != sizeof msg) continue;
        if (msg.event != UFFD_EVENT_PAGEFAULT || !(msg.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP)) {
            fprintf(stderr, "unexpected event %d\n", msg.event);
            exit(1);
        }
        struct uffdio_writeprotect u = { { msg.arg.pagefault.address & ~(PAGE - 1), PAGE }, 0 };
        if (ioctl(uffd_c, UFFDIO_WRITEPROTECT, &u)) die("UFFDIO_WRITEPROTECT (unprotect + wake)");
    }
    pthread_join(w, 0);
    return now() - t0;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    unsigned long misses = argc > 1 ? strtoul(argv[1], 0, 10) : 20000;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    if (rounds < 1 || rounds > 64 || misses < 1) { fprintf(stderr, "usage: fill_model [misses] [rounds<=64]\n"); return 2; }
    region = mmap(0, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    pool = mmap(0, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    staging = aligned_alloc(PAGE, PAGE);
    if (region == MAP_FAILED || pool == MAP_FAILED || !staging) die("mmap");
    madvise(region, PAGES * PAGE, MADV_NOHUGEPAGE);
    madvise(pool, PAGES * PAGE, MADV_NOHUGEPAGE);
    for (unsigned long p = PAGES - HOT; p < PAGES; p++) region[p * PAGE] = 1; /* the hot set */

    uffd_a = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    uffd_b = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    if (uffd_a < 0 || uffd_b < 0) die("userfaultfd");
    struct uffdio_api api_a = { .api = UFFD_API, .features = FEATURE_MOVE | UFFD_FEATURE_EVENT_REMOVE };
    struct uffdio_api api_b = { .api = UFFD_API, .features = FEATURE_MOVE };
    if (ioctl(uffd_a, UFFDIO_API, &api_a) || ioctl(uffd_b, UFFDIO_API, &api_b)) die("UFFDIO_API");
    struct uffdio_register reg = { .range = { (unsigned long)region, (PAGES - HOT) * PAGE },
                                   .mode = UFFDIO_REGISTER_MODE_MISSING };
    if (ioctl(uffd_a, UFFDIO_REGISTER, &reg)) die("UFFDIO_REGISTER region");
    pidfd = syscall(SYS_pidfd_open, getpid(), 0);
    if (pidfd < 0) die("pidfd_open");
    tracked = mmap(0, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uffd_c = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    struct uffdio_api api_c = { .api = UFFD_API, .features = 0 };
    if (tracked == MAP_FAILED || uffd_c < 0 || ioctl(uffd_c, UFFDIO_API, &api_c)) die("write-protect setup");
    madvise(tracked, PAGES * PAGE, MADV_NOHUGEPAGE);
    struct uffdio_register treg = { .range = { (unsigned long)tracked, PAGES * PAGE },
                                    .mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP };
    if (ioctl(uffd_c, UFFDIO_REGISTER, &treg)) die("UFFDIO_REGISTER (write-protect)");
    memset(staging, 7, PAGE);

    pin(0);
    pthread_t prog, rd;
    pthread_create(&rd, 0, reader, 0);
    pthread_create(&prog, 0, program, 0);
    usleep(20000);

    double us[DESIGNS][64];
    double flushes[DESIGNS] = { 0 }, events[DESIGNS] = { 0 };
    for (int r = 0; r < rounds; r++) {
        for (int d = 0; d < DESIGNS; d++) { /* interleaved: drift hits all alike */
            /* The pool's registration: on the regions' context, or the second one. */
            struct uffdio_range all = { (unsigned long)pool, PAGES * PAGE };
            ioctl(uffd_a, UFFDIO_UNREGISTER, &all);
            ioctl(uffd_b, UFFDIO_UNREGISTER, &all);
            /* Write-protect mode only, as faultline's pool: a fault in a
             * hole stays with the kernel. */
            struct uffdio_register pr = { .range = all, .mode = UFFDIO_REGISTER_MODE_WP };
            if (ioctl(d == COPY ? uffd_b : uffd_a, UFFDIO_REGISTER, &pr)) die("UFFDIO_REGISTER pool");
            unsigned long long f;
            unsigned long e;
            double s = run(d, misses, &f, &e);
            us[d][r] = s / misses * 1e6;
            flushes[d] += (double)f / misses / rounds;
            events[d] += (double)e / misses / rounds;
        }
    }
    /* Write-protection, beside the program thread. */
    const unsigned long wp_pages = 2048;
    double prot[64], unprot[64], faults[64];
    double prot_f = 0, unprot_f = 0;
    for (int r = 0; r < rounds; r++) {
        unsigned long long f;
        prot[r] = wp_each(wp_pages, 1, &f) / wp_pages * 1e6;
        prot_f += (double)f / wp_pages / rounds;
        unprot[r] = wp_each(wp_pages, 0, &f) / wp_pages * 1e6;
        unprot_f += (double)f / wp_pages / rounds;
    }
    stop = 1;
    pthread_join(prog, 0);
    pthread_join(rd, 0);
    for (int r = 0; r < rounds; r++) {
        written = 0;
        faults[r] = wp_faults(wp_pages) / wp_pages * 1e6;
    }
    printf("%lu misses x %d rounds, a program thread running beside; 2 CPUs pinned 0 (faultline) and 1 (program)\n", misses, rounds);
    for (int d = 0; d < DESIGNS; d++) {
        qsort(us[d], rounds, sizeof us[d][0], cmp);
        printf("%-7s %6.2f us/miss (%.2f-%.2f)  %.3f TLB shootdowns/miss  %.3f REMOVE events/miss\n",
               names[d], us[d][rounds / 2], us[d][0], us[d][rounds - 1], flushes[d], events[d]);
    }
    qsort(prot, rounds, sizeof prot[0], cmp);
    qsort(unprot, rounds, sizeof unprot[0], cmp);
    qsort(faults, rounds, sizeof faults[0], cmp);
    printf("wp-protect   %6.2f us/page (%.2f-%.2f)  %.3f TLB shootdowns/page\n", prot[rounds / 2], prot[0], prot[rounds - 1], prot_f);
    printf("wp-unprotect %6.2f us/page (%.2f-%.2f)  %.3f TLB shootdowns/page\n", unprot[rounds / 2], unprot[0], unprot[rounds - 1], unprot_f);
    printf("wp-fault     %6.2f us/write (%.2f-%.2f), program thread stopped\n", faults[rounds / 2], faults[0], faults[rounds - 1]);
    return 0;
}
