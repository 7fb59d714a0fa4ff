/* Umap with many threads faulting at once: 16 threads read random blocks
 * of one read-write mapping (checking each) and write the blocks they own
 * (block % 16 == thread); then the file is flushed and every block checked
 * with pread. Usage: threads DIR MIB OPS */
#include <pthread.h>
#include <umap/umap.h>
#include "common.h"

#define THREADS 16

static unsigned char* base;
static uint64_t blocks;
static long ops;

static uint64_t written(uint64_t b) { return ~block_word(b); }

static void* worker(void* arg) {
  uint64_t t = (uint64_t)(uintptr_t)arg, seed = 0x1234 + t * 7919;
  for (long i = 0; i < ops; i++) {
    uint64_t b = xorshift(&seed) % blocks, w;
    memcpy(&w, base + b * BLOCK, 8);
    /* Another thread may have written its block already. */
    CHECK(w == block_word(b) || w == written(b), "block %llu reads %#llx",
          (unsigned long long)b, (unsigned long long)w);
    uint64_t mine = (b / THREADS) * THREADS + t;
    if (mine < blocks) {
      uint64_t v = written(mine);
      memcpy(base + mine * BLOCK, &v, 8);
    }
  }
  return NULL;
}

int main(int argc, char** argv) {
  CHECK(argc == 4, "usage: threads DIR MIB OPS");
  char path[4096];
  snprintf(path, sizeof path, "%s/threads.dat", argv[1]);
  uint64_t bytes = round_up((uint64_t)atoll(argv[2]) << 20, umapcfg_get_umap_page_size());
  ops = atol(argv[3]);
  blocks = bytes / BLOCK;
  make_block_file(path, bytes);
  int fd = open(path, O_RDWR);
  CHECK(fd >= 0, "open");
  base = umap(NULL, bytes, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
  CHECK(base != UMAP_FAILED, "umap");
  pthread_t th[THREADS];
  for (uint64_t t = 0; t < THREADS; t++)
    CHECK(pthread_create(&th[t], NULL, worker, (void*)(uintptr_t)t) == 0, "pthread_create");
  for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
  CHECK(umap_flush() == 0, "umap_flush");
  /* Every block reads the same through the mapping and the file. */
  for (uint64_t b = 0; b < blocks; b++) {
    uint64_t m, f;
    memcpy(&m, base + b * BLOCK, 8);
    CHECK(pread(fd, &f, 8, (off_t)(b * BLOCK)) == 8, "pread");
    CHECK(m == f && (m == block_word(b) || m == written(b)), "block %llu: %#llx vs file %#llx",
          (unsigned long long)b, (unsigned long long)m, (unsigned long long)f);
  }
  CHECK(uunmap(base, bytes) == 0, "uunmap");
  close(fd);
  printf("threads: %d threads x %ld ops ok\n", THREADS, ops);
  return 0;
}
