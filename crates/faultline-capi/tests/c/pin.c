/* Umap's umap_fetch_and_pin: the pinned pages stay in memory (mincore says
 * so) while the program reads the rest of a file larger than the buffer,
 * and read back right. With a buffer of one page nothing can be pinned
 * and the rest still read; the program says so and checks the reads only.
 * Usage: pin DIR MIB */
#include <sys/mman.h>
#include <umap/umap.h>
#include "common.h"

int main(int argc, char** argv) {
  CHECK(argc == 3, "usage: pin DIR MIB");
  char path[4096];
  snprintf(path, sizeof path, "%s/pin.dat", argv[1]);
  uint64_t psize = umapcfg_get_umap_page_size();
  uint64_t bytes = round_up((uint64_t)atoll(argv[2]) << 20, psize);
  uint64_t buffer = umapcfg_get_max_pages_in_buffer();
  make_block_file(path, bytes);
  int fd = open(path, O_RDWR);
  CHECK(fd >= 0, "open");
  unsigned char* base = umap(NULL, bytes, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
  CHECK(base != UMAP_FAILED, "umap");
  /* Pin half the buffer (at most 64 pages), leaving room for the rest. */
  uint64_t pinned = buffer / 2 < 64 ? buffer / 2 : 64;
  if (pinned > 0) umap_fetch_and_pin((char*)base, pinned * psize);
  for (int round = 0; round < 2; round++)
    for (uint64_t b = pinned * psize / BLOCK; b < bytes / BLOCK; b++) {
      uint64_t w;
      memcpy(&w, base + b * BLOCK, 8);
      CHECK(w == block_word(b), "block %llu reads %#llx", (unsigned long long)b,
            (unsigned long long)w);
    }
  if (pinned > 0) {
    size_t sys = (size_t)sysconf(_SC_PAGESIZE), n = pinned * psize / sys;
    unsigned char* vec = malloc(n);
    CHECK(vec != NULL, "malloc");
    CHECK(mincore(base, pinned * psize, vec) == 0, "mincore");
    for (size_t i = 0; i < n; i++) CHECK(vec[i] & 1, "pinned page %zu is not in memory", i);
    free(vec);
    uint64_t w;
    memcpy(&w, base + BLOCK, 8);
    CHECK(w == block_word(1), "pinned block reads %#llx", (unsigned long long)w);
  }
  CHECK(uunmap(base, bytes) == 0, "uunmap");
  close(fd);
  if (pinned > 0)
    printf("pin: %llu pages pinned stayed in memory\n", (unsigned long long)pinned);
  else
    printf("pin: a buffer of one page leaves nothing to pin; reads checked\n");
  return 0;
}
