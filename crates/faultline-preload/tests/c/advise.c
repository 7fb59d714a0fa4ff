/* The access-pattern check (tests/lifecycle.rs). usage: advise FILE PAGES ADVICE
 * Maps FILE (served) read-only, gives the whole mapping ADVICE (`random`,
 * `sequential`, `normal` or `none`) with madvise(2), reads one byte of
 * every page in order, checks it against the file's pattern (byte i of
 * page p is (p * 7 + i) % 251), and prints "advise ok". The test compares
 * the faults each advice costs. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: advise FILE PAGES ADVICE\n"); return 2; }
    size_t pages = strtoull(argv[2], 0, 10);
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) { perror("open"); return 1; }
    volatile uint8_t *m = mmap(0, pages * 4096, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) { perror("mmap"); return 1; }
    int advice = -1;
    if (!strcmp(argv[3], "random")) advice = MADV_RANDOM;
    else if (!strcmp(argv[3], "sequential")) advice = MADV_SEQUENTIAL;
    else if (!strcmp(argv[3], "normal")) advice = MADV_NORMAL;
    else if (strcmp(argv[3], "none")) { fprintf(stderr, "advice %s?\n", argv[3]); return 2; }
    if (advice >= 0 && madvise((void *)m, pages * 4096, advice)) { perror("madvise"); return 1; }
    for (size_t p = 0; p < pages; p++) {
        size_t i = (p * 13) % 4096;
        if (m[p * 4096 + i] != (uint8_t)((p * 7 + i) % 251)) {
            fprintf(stderr, "page %zu byte %zu: %u\n", p, i, m[p * 4096 + i]);
            return 1;
        }
    }
    if (munmap((void *)m, pages * 4096)) { perror("munmap"); return 1; }
    printf("advise ok\n");
    return 0;
}
