/* What the C microbenchmarks share (tlb_batch.c, fill_model.c,
 * first_touch_floor.c): the UFFDIO_MOVE and syscall numbers newer than the
 * C headers here, pinning to a CPU, the TLB shootdowns the kernel has
 * counted, and a monotonic clock in seconds. Header-only, static inline
 * functions (a program need not use them all). */
#ifndef FAULTLINE_BENCH_COMMON_H
#define FAULTLINE_BENCH_COMMON_H
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <time.h>

/* Newer than the C headers here: defined by hand. */
struct move_args { uint64_t dst, src, len, mode; int64_t move; };
#define UFFDIO_MOVE_NR _IOWR(0xAA, 0x05, struct move_args)
#define FEATURE_MOVE (1ULL << 16)
#ifndef SYS_process_madvise
#define SYS_process_madvise 440
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

static inline void pin(int cpu) {
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
}

/* The sum of /proc/interrupts' "TLB" row over every CPU. */
static inline unsigned long long shootdowns(void) {
    FILE *f = fopen("/proc/interrupts", "r");
    char line[4096];
    unsigned long long total = 0;
    while (f && fgets(line, sizeof line, f)) {
        char *p = line;
        while (*p == ' ') p++;
        if (strncmp(p, "TLB:", 4)) continue;
        p += 4;
        for (;;) {
            char *end;
            unsigned long long v = strtoull(p, &end, 10);
            if (end == p) break;
            total += v;
            p = end;
        }
    }
    if (f) fclose(f);
    return total;
}

static inline double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
#endif
