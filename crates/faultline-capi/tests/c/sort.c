/* Umap sort of a file larger than the buffer: the file holds random
 * 64-bit keys; the program sorts them in place through the mapping (each of
 * 8 blocks with qsort, then an odd-even transposition of blocks, merging
 * two blocks at a time), flushes, unmaps, and checks with pread that the
 * file is sorted and holds the same keys (sum and xor).
 * Usage: sort DIR MIB */
#include <umap/umap.h>
#include "common.h"

#define NBLOCKS 8

static int cmp(const void* a, const void* b) {
  uint64_t x = *(const uint64_t*)a, y = *(const uint64_t*)b;
  return x < y ? -1 : x > y;
}

/* Merges sorted blocks a[0..n) and b[0..n) (copied out whole first, so
 * that each is touched once through the mapping, not once per key), then
 * writes the low half back to a and the high half to b. */
static void merge_split(uint64_t* a, uint64_t* b, size_t n, uint64_t* tmp) {
  uint64_t *x = tmp + 2 * n, *y = tmp + 3 * n;
  memcpy(x, a, n * 8);
  memcpy(y, b, n * 8);
  size_t i = 0, j = 0;
  for (size_t k = 0; k < 2 * n; k++)
    tmp[k] = (j == n || (i < n && x[i] <= y[j])) ? x[i++] : y[j++];
  memcpy(a, tmp, n * 8);
  memcpy(b, tmp + n, n * 8);
}

int main(int argc, char** argv) {
  CHECK(argc == 3, "usage: sort DIR MIB");
  char path[4096];
  snprintf(path, sizeof path, "%s/sort.dat", argv[1]);
  uint64_t psize = umapcfg_get_umap_page_size();
  uint64_t bytes = round_up((uint64_t)atoll(argv[2]) << 20, psize * NBLOCKS);
  size_t n = bytes / 8, per = n / NBLOCKS;

  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  CHECK(fd >= 0, "open");
  uint64_t* chunk = malloc(1 << 20);
  CHECK(chunk != NULL, "malloc");
  uint64_t seed = 0xfeed, sum = 0, xr = 0;
  for (uint64_t off = 0; off < bytes; off += 1 << 20) {
    for (size_t i = 0; i < (1 << 20) / 8; i++) {
      chunk[i] = xorshift(&seed);
      sum += chunk[i];
      xr ^= chunk[i];
    }
    CHECK(pwrite(fd, chunk, 1 << 20, (off_t)off) == 1 << 20, "pwrite");
  }

  uint64_t* keys = umap(NULL, bytes, PROT_READ | PROT_WRITE, UMAP_PRIVATE, fd, 0);
  CHECK(keys != UMAP_FAILED, "umap");
  for (int b = 0; b < NBLOCKS; b++) qsort(keys + b * per, per, 8, cmp);
  uint64_t* tmp = malloc(4 * per * 8);
  CHECK(tmp != NULL, "malloc");
  for (int round = 0; round < NBLOCKS; round++)
    for (int b = round % 2; b + 1 < NBLOCKS; b += 2)
      merge_split(keys + b * per, keys + (b + 1) * per, per, tmp);
  CHECK(umap_flush() == 0, "umap_flush");
  CHECK(uunmap(keys, bytes) == 0, "uunmap");

  uint64_t prev = 0, sum2 = 0, xr2 = 0;
  for (uint64_t off = 0; off < bytes; off += 1 << 20) {
    CHECK(pread(fd, chunk, 1 << 20, (off_t)off) == 1 << 20, "pread");
    for (size_t i = 0; i < (1 << 20) / 8; i++) {
      CHECK(chunk[i] >= prev, "not sorted at key %llu",
            (unsigned long long)(off / 8 + i));
      prev = chunk[i];
      sum2 += chunk[i];
      xr2 ^= chunk[i];
    }
  }
  CHECK(sum == sum2 && xr == xr2, "the keys changed");
  close(fd);
  printf("sort: %zu keys sorted (page %llu, buffer %llu pages)\n", n,
         (unsigned long long)psize,
         (unsigned long long)umapcfg_get_max_pages_in_buffer());
  return 0;
}
