/* The least a 4 KiB first touch served through userfaultfd can cost, beside
 * the kernel's own first touch (issue 40's first-touch goals: <= 3x the
 * kernel in-thread, <= 8x with workers).
 *
 * Each way of serving does nothing but the one ioctl that puts the page in
 * place, so faultline's own work (locks, frames, states, fault-around) is
 * left out; what remains is the mechanism's cost:
 *   kernel        the kernel's own fault: a read maps the shared zero page,
 *                 a write allocates and clears a page;
 *   sigbus        UFFD_FEATURE_SIGBUS: the touching thread takes a SIGBUS
 *                 and its handler maps the page (UFFDIO_ZEROPAGE for a
 *                 read, UFFDIO_COPY of a zeroed buffer for a write): what
 *                 faultline's in-thread mode does at the least;
 *   handler       the touching thread waits in the kernel; a handler thread
 *                 pinned to the other CPU, asleep in poll(2), reads the
 *                 event and maps the page: what a worker does at the least;
 *   handler-same  the same handler pinned to the touching thread's CPU (a
 *                 worker on that CPU: each wake-up is a switch on one CPU);
 *   handler-spin  the handler on the other CPU busy-polling a non-blocking
 *                 read(2) instead of sleeping (faultline's --spin-us).
 * The touching thread is pinned to CPU 0. Per touch: clock_gettime around
 * the access. Usage: first_touch_floor [pages] [rounds]; prints median,
 * p10 and p90 in µs per way and access, and the ratio of medians to the
 * kernel's. A first untimed round backs the guest's memory. */
#define _GNU_SOURCE
#include "common.h"
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096UL

static int uffd = -1;
static char zeros[PAGE] __attribute__((aligned(4096)));
static atomic_int stop;

static void die(const char *what) {
    perror(what);
    exit(1);
}

/* Maps the page at `addr`: the zero page for a read, a copy of zeros for a
 * write. */
static void place(unsigned long addr, int write) {
    addr &= ~(PAGE - 1);
    if (write) {
        struct uffdio_copy c = {.dst = addr, .src = (unsigned long)zeros, .len = PAGE};
        if (ioctl(uffd, UFFDIO_COPY, &c) && errno != EEXIST) die("UFFDIO_COPY");
    } else {
        struct uffdio_zeropage z = {.range = {.start = addr, .len = PAGE}};
        if (ioctl(uffd, UFFDIO_ZEROPAGE, &z) && errno != EEXIST) die("UFFDIO_ZEROPAGE");
    }
}

static int touch_writes;

static void on_sigbus(int sig, siginfo_t *si, void *ctx) {
    (void)sig;
    (void)ctx;
    place((unsigned long)si->si_addr, touch_writes);
}

/* How a handler waits and where: way 2, 3 or 4 of run(). */
struct how { int spin, cpu; };

static void *handler(void *arg) {
    struct how h = *(struct how *)arg;
    pin(h.cpu);
    while (!atomic_load(&stop)) {
        if (!h.spin) {
            struct pollfd p = {.fd = uffd, .events = POLLIN};
            if (poll(&p, 1, 10) <= 0) continue;
        }
        struct uffd_msg m;
        ssize_t n = read(uffd, &m, sizeof m);
        if (n != sizeof m) continue; /* EAGAIN: nothing yet */
        if (m.event == UFFD_EVENT_PAGEFAULT)
            place(m.arg.pagefault.address, !!(m.arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE));
    }
    return NULL;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Touches `pages` fresh pages one by one (a read or a write of one byte);
 * `way` 0 is the kernel, 1 SIGBUS, 2 a sleeping handler on the other CPU,
 * 3 one on the same CPU, 4 a spinning one on the other CPU.
 * Fills `us` with each touch's µs. */
static void run(int way, int write, size_t pages, double *us) {
    char *m = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) die("mmap");
    madvise(m, pages * PAGE, MADV_NOHUGEPAGE);
    pthread_t t;
    struct how how = {.spin = way == 4, .cpu = way == 3 ? 0 : 1};
    if (way) {
        struct uffdio_api api = {.api = UFFD_API, .features = way == 1 ? UFFD_FEATURE_SIGBUS : 0};
        uffd = syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
        if (uffd < 0) die("userfaultfd");
        if (ioctl(uffd, UFFDIO_API, &api)) die("UFFDIO_API");
        struct uffdio_register r = {.range = {.start = (unsigned long)m, .len = pages * PAGE},
                                    .mode = UFFDIO_REGISTER_MODE_MISSING};
        if (ioctl(uffd, UFFDIO_REGISTER, &r)) die("UFFDIO_REGISTER");
        touch_writes = write;
        atomic_store(&stop, 0);
        if (way >= 2 && pthread_create(&t, NULL, handler, &how)) die("pthread_create");
    }
    volatile char sink = 0;
    for (size_t i = 0; i < pages; i++) {
        volatile char *p = m + i * PAGE;
        double t0 = now();
        if (write)
            *p = 1;
        else
            sink += *p;
        us[i] = (now() - t0) * 1e6;
    }
    (void)sink;
    if (way) {
        if (way >= 2) {
            atomic_store(&stop, 1);
            pthread_join(t, NULL);
        }
        close(uffd);
    }
    munmap(m, pages * PAGE);
}

int main(int argc, char **argv) {
    size_t pages = argc > 1 ? strtoul(argv[1], NULL, 10) : 4096;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    const char *names[] = {"kernel", "sigbus", "handler", "handler-same", "handler-spin"};
    struct sigaction sa = {.sa_sigaction = on_sigbus, .sa_flags = SA_SIGINFO};
    sigaction(SIGBUS, &sa, NULL);
    pin(0);
    double *us = malloc(pages * sizeof *us);
    double *all = malloc(pages * rounds * sizeof *all);
    if (!us || !all) die("malloc");
    run(0, 1, pages, us); /* untimed: back the guest's memory */
    printf("%d rounds of %zu fresh 4 KiB pages per way, touched one by one from CPU 0\n", rounds,
           pages);
    printf("%-13s %-6s %9s %7s %7s %9s\n", "way", "access", "median_us", "p10", "p90", "vs_kernel");
    for (int write = 1; write >= 0; write--) {
        double kernel = 0;
        for (int way = 0; way < 5; way++) {
            for (int r = 0; r < rounds; r++) {
                run(way, write, pages, us);
                memcpy(all + r * pages, us, pages * sizeof *us);
            }
            size_t n = pages * rounds;
            qsort(all, n, sizeof *all, cmp);
            double med = all[n / 2];
            if (way == 0) kernel = med;
            printf("%-13s %-6s %9.2f %7.2f %7.2f %8.2fx\n", names[way], write ? "write" : "read",
                   med, all[n / 10], all[n * 9 / 10], med / kernel);
        }
    }
    free(us);
    free(all);
    return 0;
}
