/* The coherence oracle (tests/coherence.rs): threads of one unmodified C
 * program write pages of a file through write(2)-family calls and through
 * a shared mapping, and read them back both ways, while the preload pages
 * the mapping through a budget far smaller than the file. Each thread owns
 * the pages p with p % threads == its index, so after any write of its own
 * returns, every read of that page — through the mapping or pread — must
 * show it (the kernel's page cache guarantees that; the preload must too).
 * Every 8-byte word of page p holds (p << 32) | version, so a read of a
 * foreign page must still name its page (no torn or misplaced data).
 *
 * usage: coherence FILE PAGES THREADS OPS MODE LEDGER
 *   MODE ro: the mapping is PROT_READ; writes are pwrite/pwritev/write.
 *   MODE rw: the mapping is PROT_READ|PROT_WRITE; writes alternate between
 *            stores through the mapping and pwrite; ends with msync.
 * The final version of every page goes to LEDGER (one u32 per page), which
 * the test compares with the file read without the preload. Exit 0: every
 * check held; 1 with a message on stderr otherwise. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#define PAGE 4096
#define WORDS (PAGE / 8)

static int fd;
static size_t pages;
static int threads;
static long ops;
static int rw;
static volatile uint64_t *map;
static uint32_t *version; /* per page, written only by its owner */

static void die(const char *what, size_t page, uint64_t want, uint64_t got) {
    fprintf(stderr, "coherence: %s: page %zu want %#llx got %#llx\n", what, page,
            (unsigned long long)want, (unsigned long long)got);
    exit(1);
}

static uint64_t next_rand(uint64_t *s) {
    *s ^= *s << 13; *s ^= *s >> 7; *s ^= *s << 17;
    return *s;
}

static void fill(uint64_t *buf, size_t p, uint32_t v) {
    for (int i = 0; i < WORDS; i++) buf[i] = ((uint64_t)p << 32) | v;
}

static void write_page(size_t p, uint32_t v, int how, uint64_t *buf) {
    fill(buf, p, v);
    off_t at = (off_t)p * PAGE;
    ssize_t n;
    switch (how) {
    case 0:
        n = pwrite(fd, buf, PAGE, at);
        break;
    case 1: {
        struct iovec iov[2] = {{buf, PAGE / 2}, {(char *)buf + PAGE / 2, PAGE / 2}};
        n = pwritev(fd, iov, 2, at);
        break;
    }
    default:
        for (int i = 0; i < WORDS; i++) map[p * WORDS + i] = buf[i];
        n = PAGE;
        break;
    }
    if (n != PAGE) { perror("coherence: write"); exit(1); }
}

static void *worker(void *arg) {
    int me = (int)(intptr_t)arg;
    uint64_t seed = 0x9E3779B97F4A7C15ull * (me + 1);
    uint64_t *buf = aligned_alloc(PAGE, PAGE);
    uint64_t *back = aligned_alloc(PAGE, PAGE);
    size_t mine = (pages - me + threads - 1) / threads;
    for (long op = 0; op < ops; op++) {
        size_t p = me + threads * (next_rand(&seed) % mine);
        uint32_t v = ++version[p];
        int how = rw ? (int)(next_rand(&seed) % 3) : (int)(next_rand(&seed) % 2);
        write_page(p, v, how, buf);
        uint64_t want = ((uint64_t)p << 32) | v;
        size_t w = next_rand(&seed) % WORDS;
        uint64_t got = map[p * WORDS + w];
        if (got != want) die("mapping after own write", p, want, got);
        if (rw || op % 4 == 0) {
            if (pread(fd, back, PAGE, (off_t)p * PAGE) != PAGE) { perror("coherence: pread"); exit(1); }
            if (back[w] != want) die("pread after own write", p, want, back[w]);
        }
        /* A foreign page: it must name itself. */
        size_t q = next_rand(&seed) % pages;
        uint64_t other = map[q * WORDS + next_rand(&seed) % WORDS];
        if (other >> 32 != q && other != 0) die("foreign page names another", q, (uint64_t)q << 32, other);
    }
    free(buf);
    free(back);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 7) { fprintf(stderr, "usage: coherence FILE PAGES THREADS OPS ro|rw LEDGER\n"); return 2; }
    pages = strtoull(argv[2], 0, 10);
    threads = atoi(argv[3]);
    ops = atol(argv[4]);
    rw = strcmp(argv[5], "rw") == 0;
    fd = open(argv[1], O_RDWR);
    if (fd < 0) { perror("coherence: open"); return 1; }
    version = calloc(pages, sizeof *version);
    /* Every page starts at version 0, written with write(2) (the file
     * position path). */
    uint64_t *buf = aligned_alloc(PAGE, PAGE);
    for (size_t p = 0; p < pages; p++) {
        fill(buf, p, 0);
        if (write(fd, buf, PAGE) != PAGE) { perror("coherence: write"); return 1; }
    }
    int prot = PROT_READ | (rw ? PROT_WRITE : 0);
    map = mmap(NULL, pages * PAGE, prot, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) { perror("coherence: mmap"); return 1; }
    pthread_t t[64];
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    /* Every page, through the mapping, at its final version. */
    for (size_t p = 0; p < pages; p++) {
        uint64_t want = ((uint64_t)p << 32) | version[p];
        for (int i = 0; i < WORDS; i += 97)
            if (map[p * WORDS + i] != want) die("final mapping", p, want, map[p * WORDS + i]);
    }
    if (rw && msync((void *)map, pages * PAGE, MS_SYNC) != 0) { perror("coherence: msync"); return 1; }
    if (munmap((void *)map, pages * PAGE) != 0) { perror("coherence: munmap"); return 1; }
    close(fd);
    FILE *l = fopen(argv[6], "wb");
    if (!l || fwrite(version, sizeof *version, pages, l) != pages || fclose(l) != 0) {
        perror("coherence: ledger");
        return 1;
    }
    return 0;
}
