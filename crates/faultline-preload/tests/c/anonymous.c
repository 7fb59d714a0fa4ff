/* The anonymous-memory oracle (tests/coherence.rs). usage: anonymous MIB
 * Maps MIB of private anonymous memory, checks it reads zeros, writes
 * every word (its index, mixed), reads all back, grows it with
 * mremap(MREMAP_MAYMOVE), checks the old part and that the new part reads
 * zeros, unmaps. Prints "anonymous ok". */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
int main(int argc, char **argv) {
    size_t len = strtoull(argv[1], 0, 10) << 20, n = len / 8;
    uint64_t *m = mmap(0, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) { perror("mmap"); return 1; }
    for (size_t i = 0; i < n; i += 511) if (m[i]) { fprintf(stderr, "not zero: word %zu\n", i); return 1; }
    for (size_t i = 0; i < n; i++) m[i] = i * 0x9E3779B97F4A7C15ull;
    for (size_t i = 0; i < n; i++) if (m[i] != i * 0x9E3779B97F4A7C15ull) { fprintf(stderr, "word %zu\n", i); return 1; }
    uint64_t *g = mremap(m, len, 2 * len, MREMAP_MAYMOVE);
    if (g == MAP_FAILED) { perror("mremap"); return 1; }
    for (size_t i = 0; i < n; i++) if (g[i] != i * 0x9E3779B97F4A7C15ull) { fprintf(stderr, "after mremap: word %zu\n", i); return 1; }
    for (size_t i = n; i < 2 * n; i += 511) if (g[i]) { fprintf(stderr, "grown part not zero: word %zu\n", i); return 1; }
    if (munmap(g, 2 * len)) { perror("munmap"); return 1; }
    puts("anonymous ok");
    return 0;
}
