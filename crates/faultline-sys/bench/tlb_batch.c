/* Does Linux batch the TLB flush of many scattered 4 KiB pages dropped at
 * once? (issue 40: eviction in batches). Three ways to take 64 scattered
 * pages of a 2-thread process out of its page tables, each repeated over
 * many batches, with the TLB shootdowns the kernel counts in
 * /proc/interrupts ("TLB") and the time per page:
 *
 *   move     one UFFDIO_MOVE per page (faultline's eviction today: a page
 *            parked into its pool slot)
 *   madvise  one madvise(MADV_DONTNEED) per page
 *   vector   one process_madvise(MADV_DONTNEED) over an iovec of all 64
 *
 * A second thread spins on another CPU reading the region, so every
 * flush must reach it (an IPI), as with a program thread running beside
 * faultline's. Build and run (root not needed; userfaultfd may be):
 *   cc -O2 -pthread -o /tmp/tlb_batch crates/faultline-sys/bench/tlb_batch.c
 *   /tmp/tlb_batch [batches] [alone]
 * ("alone": no second thread, so no flush needs an IPI.) Prints one line
 * per way. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
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
#define PAGES 8192UL /* 32 MiB region */
#define BATCH 64

static volatile int stop;
static char *region;

static void *spinner(void *arg) {
    (void)arg;
    pin(1);
    unsigned long sum = 0, i = 0;
    while (!stop) {
        sum += region[(i * 4099) % (PAGES * PAGE)];
        i++;
    }
    return (void *)sum;
}

/* Page i of batch b: scattered (a multiplicative walk), distinct in a batch. */
static unsigned long pick(unsigned long b, unsigned long i) {
    return (b * 7919 + i * 127) % PAGES;
}

int main(int argc, char **argv) {
    unsigned long batches = argc > 1 ? strtoul(argv[1], 0, 10) : 400;
    region = mmap(0, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    char *pool = mmap(0, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED || pool == MAP_FAILED) { perror("mmap"); return 1; }
    madvise(region, PAGES * PAGE, MADV_NOHUGEPAGE);
    madvise(pool, PAGES * PAGE, MADV_NOHUGEPAGE);
    for (unsigned long p = 0; p < PAGES; p++) region[p * PAGE] = 1;

    int uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
    struct uffdio_api api = { .api = UFFD_API, .features = FEATURE_MOVE };
    int have_move = uffd >= 0 && ioctl(uffd, UFFDIO_API, &api) == 0;
    struct uffdio_register reg = { .range = { (unsigned long)pool, PAGES * PAGE },
                                   .mode = UFFDIO_REGISTER_MODE_MISSING };
    have_move = have_move && ioctl(uffd, UFFDIO_REGISTER, &reg) == 0;
    int pidfd = syscall(SYS_pidfd_open, getpid(), 0);

    int alone = argc > 2 && !strcmp(argv[2], "alone");
    pin(0);
    pthread_t t;
    if (!alone) pthread_create(&t, 0, spinner, 0);
    usleep(20000);

    const char *ways[] = { "move", "madvise", "vector" };
    for (int w = 0; w < 3; w++) {
        if (w == 0 && !have_move) { printf("move: no UFFDIO_MOVE here (%s)\n", strerror(errno)); continue; }
        double spent = 0;
        unsigned long long flushes = 0, pages = 0;
        int failed = 0;
        for (unsigned long b = 0; b < batches && !failed; b++) {
            struct iovec iov[BATCH];
            for (int i = 0; i < BATCH; i++) {
                unsigned long p = pick(b, i);
                region[p * PAGE] = 1; /* resident again (untimed) */
                iov[i].iov_base = region + p * PAGE;
                iov[i].iov_len = PAGE;
            }
            unsigned long long f0 = shootdowns();
            double t0 = now();
            if (w == 0) {
                for (int i = 0; i < BATCH; i++) {
                    unsigned long p = pick(b, i);
                    struct move_args m = { (uint64_t)(pool + p * PAGE), (uint64_t)(region + p * PAGE), PAGE, 0, 0 };
                    if (ioctl(uffd, UFFDIO_MOVE_NR, &m) != 0) { perror("UFFDIO_MOVE"); failed = 1; break; }
                }
            } else if (w == 1) {
                for (int i = 0; i < BATCH; i++) madvise(iov[i].iov_base, PAGE, MADV_DONTNEED);
            } else {
                long n = syscall(SYS_process_madvise, pidfd, iov, BATCH, MADV_DONTNEED, 0);
                if (n != (long)(BATCH * PAGE)) {
                    printf("vector: process_madvise(MADV_DONTNEED) refused: %s\n", strerror(errno));
                    failed = 1;
                }
            }
            spent += now() - t0;
            flushes += shootdowns() - f0;
            pages += BATCH;
            if (w == 0) /* give the pool slots back for the next batch */
                madvise(pool, PAGES * PAGE, MADV_DONTNEED);
        }
        if (!failed || pages > BATCH)
            printf("%-8s %s %llu pages in batches of %d: %.2f us/page, %.3f TLB shootdowns/page\n",
                   ways[w], alone ? "alone" : "beside a spinning thread", pages, BATCH,
                   spent / pages * 1e6, (double)flushes / pages);
    }
    stop = 1;
    if (!alone) pthread_join(t, 0);
    return 0;
}
