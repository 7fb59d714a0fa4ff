/* Umap-style random reader, for the C-layer cost: maps FILE (made by
 * umap_vs_rust.sh) read-only through libumap.so and reads the first word of
 * READS random 4 KiB blocks, checking each; prints one JSON row.
 * Usage: umap_random FILE READS */
#include <time.h>
#include <umap/umap.h>
#include "../tests/c/common.h"

int main(int argc, char** argv) {
  CHECK(argc == 3, "usage: umap_random FILE READS");
  long reads = atol(argv[2]);
  int fd = open(argv[1], O_RDONLY);
  CHECK(fd >= 0, "open %s", argv[1]);
  off_t bytes = lseek(fd, 0, SEEK_END);
  unsigned char* base = umap(NULL, (size_t)bytes, PROT_READ, UMAP_PRIVATE, fd, 0);
  CHECK(base != UMAP_FAILED, "umap");
  uint64_t seed = 0x5eed, blocks = (uint64_t)bytes / BLOCK;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (long i = 0; i < reads; i++) {
    uint64_t b = xorshift(&seed) % blocks, w;
    memcpy(&w, base + b * BLOCK, 8);
    CHECK(w == block_word(b), "block %llu", (unsigned long long)b);
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
  printf("{\"system\":\"faultline via libumap.so (C)\",\"pattern\":\"random 4k reads\","
         "\"reads\":%ld,\"secs\":%.4f,\"reads_per_s\":%.0f}\n",
         reads, secs, reads / secs);
  CHECK(uunmap(base, (size_t)bytes) == 0, "uunmap");
  return 0;
}
