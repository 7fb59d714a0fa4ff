/* Umap random-page reader: maps a file made here read-only and reads the
 * first word of random 4 KiB blocks, checking each against what was
 * written. Usage: random_reader DIR MIB READS */
#include <umap/umap.h>
#include "common.h"

int main(int argc, char** argv) {
  CHECK(argc == 4, "usage: random_reader DIR MIB READS");
  char path[4096];
  snprintf(path, sizeof path, "%s/random_reader.dat", argv[1]);
  uint64_t psize = umapcfg_get_umap_page_size();
  uint64_t bytes = round_up((uint64_t)atoll(argv[2]) << 20, psize);
  long reads = atol(argv[3]);
  make_block_file(path, bytes);

  int fd = open(path, O_RDONLY);
  CHECK(fd >= 0, "open");
  unsigned char* base = umap(NULL, bytes, PROT_READ, UMAP_PRIVATE, fd, 0);
  CHECK(base != UMAP_FAILED, "umap");
  uint64_t seed = 0x5eed, blocks = bytes / BLOCK;
  for (long i = 0; i < reads; i++) {
    uint64_t b = xorshift(&seed) % blocks;
    uint64_t w;
    memcpy(&w, base + b * BLOCK, 8);
    CHECK(w == block_word(b), "block %llu reads %#llx", (unsigned long long)b,
          (unsigned long long)w);
  }
  CHECK(uunmap(base, bytes) == 0, "uunmap");
  close(fd);
  printf("random_reader: %ld reads of %llu blocks ok (page %llu, buffer %llu pages)\n",
         reads, (unsigned long long)blocks, (unsigned long long)psize,
         (unsigned long long)umapcfg_get_max_pages_in_buffer());
  return 0;
}
