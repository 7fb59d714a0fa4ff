/* The private-mapping oracle (tests/coherence.rs): maps FILE with
 * MAP_PRIVATE and PROT_WRITE, checks it reads the file, overwrites every
 * other word, reads everything back (after the budget evicted it to the
 * overlay), grows the mapping with mremap(MREMAP_MAYMOVE) and checks again,
 * drops the private copies with madvise(MADV_DONTNEED) and checks that the
 * file shows through again. The test checks the file never changed.
 * usage: private FILE PAGES; exit 0 and "private ok" when all held. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
int main(int argc, char **argv) {
    size_t pages = strtoull(argv[2], 0, 10), n = pages * 512;
    int fd = open(argv[1], O_RDONLY);
    uint64_t *orig = malloc(pages * 4096);
    if (pread(fd, orig, pages * 4096, 0) != (ssize_t)(pages * 4096)) { perror("pread"); return 1; }
    uint64_t *m = mmap(0, pages * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) { perror("mmap"); return 1; }
    for (size_t i = 0; i < n; i++) if (m[i] != orig[i]) { fprintf(stderr, "before write: word %zu\n", i); return 1; }
    for (size_t i = 0; i < n; i += 2) m[i] = ~orig[i];
    for (size_t i = 0; i < n; i++) { uint64_t want = i % 2 ? orig[i] : ~orig[i]; if (m[i] != want) { fprintf(stderr, "after write: word %zu\n", i); return 1; } }
    uint64_t *g = mremap(m, pages * 4096, pages * 2 * 4096, MREMAP_MAYMOVE);
    if (g == MAP_FAILED) { perror("mremap"); return 1; }
    for (size_t i = 0; i < n; i++) { uint64_t want = i % 2 ? orig[i] : ~orig[i]; if (g[i] != want) { fprintf(stderr, "after mremap: word %zu\n", i); return 1; } }
    if (madvise(g, pages * 4096, MADV_DONTNEED) != 0) { perror("madvise"); return 1; }
    for (size_t i = 0; i < n; i++) if (g[i] != orig[i]) { fprintf(stderr, "after DONTNEED: word %zu\n", i); return 1; }
    munmap(g, pages * 2 * 4096);
    puts("private ok");
    return 0;
}
