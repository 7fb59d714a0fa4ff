/* Helpers shared by the C test programs: failing loudly, a small PRNG, and
 * making the data files the programs read. POSIX only, so the programs
 * build against LLNL Umap as well as against faultline's libumap.so. */
#ifndef TEST_COMMON_H
#define TEST_COMMON_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCK 4096 /* the unit the files are written in */

#define CHECK(cond, ...)                                                    \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__,      \
              #cond);                                                       \
      fprintf(stderr, __VA_ARGS__);                                         \
      fprintf(stderr, " (errno %d: %s)\n", errno, strerror(errno));         \
      exit(1);                                                              \
    }                                                                       \
  } while (0)

static inline uint64_t xorshift(uint64_t* s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

/* The word a block's first 8 bytes hold in the files the tests make. */
static inline uint64_t block_word(uint64_t block) {
  return block * 0x9E3779B97F4A7C15ull ^ 0x0123456789ABCDEFull;
}

/* Creates `path` with `bytes` bytes (a multiple of BLOCK) whose every
 * block starts with block_word(its index); the rest is 0xA5. */
static inline void make_block_file(const char* path, uint64_t bytes) {
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  CHECK(fd >= 0, "open %s", path);
  unsigned char* buf = malloc(1 << 20);
  CHECK(buf != NULL, "malloc");
  for (uint64_t off = 0; off < bytes; off += 1 << 20) {
    uint64_t n = bytes - off < (1 << 20) ? bytes - off : (1 << 20);
    memset(buf, 0xA5, n);
    for (uint64_t b = 0; b < n / BLOCK; b++) {
      uint64_t w = block_word((off / BLOCK) + b);
      memcpy(buf + b * BLOCK, &w, 8);
    }
    CHECK(pwrite(fd, buf, n, (off_t)off) == (ssize_t)n, "pwrite");
  }
  free(buf);
  CHECK(fsync(fd) == 0, "fsync");
  close(fd);
}

/* Bytes rounded up to a multiple of `page`. */
static inline uint64_t round_up(uint64_t bytes, uint64_t page) {
  return (bytes + page - 1) / page * page;
}

#endif
