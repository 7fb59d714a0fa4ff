/* Umap writer: maps a file read-write, writes a pattern over every block,
 * umap_flush()es and checks the file with pread while still mapped, writes
 * again, uunmap()s and checks again. Usage: writer DIR MIB */
#include <umap/umap.h>
#include "common.h"

static void fill(unsigned char* base, uint64_t bytes, uint64_t round) {
  for (uint64_t b = 0; b < bytes / BLOCK; b++) {
    uint64_t w = block_word(b) + round;
    memcpy(base + b * BLOCK, &w, 8);
    memcpy(base + b * BLOCK + BLOCK - 8, &w, 8);
  }
}

static void check_file(int fd, uint64_t bytes, uint64_t round) {
  unsigned char blk[BLOCK];
  for (uint64_t b = 0; b < bytes / BLOCK; b++) {
    CHECK(pread(fd, blk, BLOCK, (off_t)(b * BLOCK)) == BLOCK, "pread");
    uint64_t w = block_word(b) + round, first, last;
    memcpy(&first, blk, 8);
    memcpy(&last, blk + BLOCK - 8, 8);
    CHECK(first == w && last == w, "block %llu round %llu: %#llx %#llx",
          (unsigned long long)b, (unsigned long long)round,
          (unsigned long long)first, (unsigned long long)last);
  }
}

int main(int argc, char** argv) {
  CHECK(argc == 3, "usage: writer DIR MIB");
  char path[4096];
  snprintf(path, sizeof path, "%s/writer.dat", argv[1]);
  uint64_t bytes = round_up((uint64_t)atoll(argv[2]) << 20, umapcfg_get_umap_page_size());
  make_block_file(path, bytes);
  int fd = open(path, O_RDWR);
  CHECK(fd >= 0, "open");
  unsigned char* base = umap(NULL, bytes, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
  CHECK(base != UMAP_FAILED, "umap");
  fill(base, bytes, 1);
  CHECK(umap_flush() == 0, "umap_flush");
  check_file(fd, bytes, 1);
  fill(base, bytes, 2);
  CHECK(uunmap(base, bytes) == 0, "uunmap");
  check_file(fd, bytes, 2);
  close(fd);
  printf("writer: %llu blocks written, flushed and read back\n",
         (unsigned long long)(bytes / BLOCK));
  return 0;
}
