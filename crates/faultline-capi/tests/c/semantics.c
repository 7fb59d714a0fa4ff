/* Umap's API where faultline is right and Umap is not (see umap.h): errors
 * return UMAP_FAILED / -1 with a positive errno and never abort; offset is
 * honoured; a length that is not a multiple of the page size works;
 * UMAP_FIXED places the region; uunmap releases the range.
 * Usage: semantics DIR */
#include <sys/mman.h>
#include <umap/umap.h>
#include "common.h"

int main(int argc, char** argv) {
  CHECK(argc == 2, "usage: semantics DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/semantics.dat", argv[1]);
  uint64_t psize = umapcfg_get_umap_page_size();
  uint64_t bytes = 4 * psize;
  make_block_file(path, bytes);
  int fd = open(path, O_RDWR);
  CHECK(fd >= 0, "open");

  errno = 0;
  CHECK(umap(NULL, 0, PROT_READ, UMAP_PRIVATE, fd, 0) == UMAP_FAILED && errno == EINVAL,
        "length 0");
  errno = 0;
  CHECK(umap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0) == UMAP_FAILED && errno == EINVAL,
        "flags without UMAP_PRIVATE");
  errno = 0;
  CHECK(umap(NULL, bytes, PROT_READ | PROT_EXEC, UMAP_PRIVATE, fd, 0) == UMAP_FAILED &&
            errno == EINVAL,
        "PROT_EXEC");
  errno = 0;
  CHECK(umap(NULL, bytes, PROT_READ, UMAP_PRIVATE, -1, 0) == UMAP_FAILED && errno == EBADF,
        "fd -1");
  int ro = open(path, O_RDONLY);
  CHECK(ro >= 0, "open read-only");
  errno = 0;
  CHECK(umap(NULL, bytes, PROT_READ | PROT_WRITE, UMAP_PRIVATE, ro, 0) == UMAP_FAILED &&
            errno == EACCES,
        "PROT_WRITE on a read-only fd");
  errno = 0;
  CHECK(uunmap((void*)0x1000, 4096) == -1 && errno == EINVAL, "uunmap of no region");

  /* offset: the mapping starts at block 3 of the file. */
  unsigned char* at3 = umap(NULL, BLOCK, PROT_READ, UMAP_PRIVATE, ro, 3 * BLOCK);
  CHECK(at3 != UMAP_FAILED, "umap with an offset");
  uint64_t w;
  memcpy(&w, at3, 8);
  CHECK(w == block_word(3), "offset ignored: reads %#llx", (unsigned long long)w);
  CHECK(uunmap(at3, BLOCK) == 0, "uunmap");

  /* A length that is not a multiple of the page: rounded up. */
  unsigned char* odd = umap(NULL, bytes - 100, PROT_READ, UMAP_PRIVATE, ro, 0);
  CHECK(odd != UMAP_FAILED, "umap of an odd length");
  memcpy(&w, odd + bytes - BLOCK, 8);
  CHECK(w == block_word(bytes / BLOCK - 1), "last block reads %#llx", (unsigned long long)w);
  CHECK(uunmap(odd, bytes - 100) == 0, "uunmap");

  /* UMAP_FIXED into a range the program reserved. */
  unsigned char* want = mmap(NULL, bytes + psize, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(want != MAP_FAILED, "mmap");
  want = (unsigned char*)round_up((uint64_t)(uintptr_t)want, psize);
  unsigned char* fixed = umap(want, bytes, PROT_READ | PROT_WRITE, UMAP_PRIVATE | UMAP_FIXED, fd, 0);
  CHECK(fixed == want, "UMAP_FIXED placed it at %p, not %p", (void*)fixed, (void*)want);
  memcpy(&w, fixed + BLOCK, 8);
  CHECK(w == block_word(1), "fixed mapping reads %#llx", (unsigned long long)w);
  w = 42;
  memcpy(fixed + BLOCK, &w, 8);
  CHECK(uunmap(fixed, bytes) == 0, "uunmap");
  CHECK(pread(fd, &w, 8, BLOCK) == 8 && w == 42, "write-back on uunmap: %llu", (unsigned long long)w);
  /* uunmap released the range: a fresh mapping may take it. */
  void* again = mmap(want, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  CHECK(again == want, "the range is still mapped after uunmap");

  CHECK(umap_has_write_support() == 1, "write support");
  close(ro);
  close(fd);
  printf("semantics: ok\n");
  return 0;
}
