/* A store written in C, plugged in through faultline.h: an in-memory
 * "remote" array of pages. The region is 8x the budget, so reclaim writes
 * pages back to the store and reads them again; the program checks every
 * word through the mapping and in the store after a flush, the stats, the
 * store's release, and error returns. Usage: c_store */
#include <faultline.h>
#include <sys/mman.h>
#include <stdatomic.h>
#include "common.h"

#define REGION (16u << 20)

typedef struct {
  unsigned char* bytes;
  atomic_long reads, writes, flushes;
  int released;
} mem_store;

static int st_read(void* user, uint64_t off, uint8_t* buf, size_t len) {
  mem_store* s = user;
  if (off + len > REGION) return EIO;
  memcpy(buf, s->bytes + off, len);
  atomic_fetch_add(&s->reads, 1);
  return 0;
}

static int st_write(void* user, uint64_t off, const uint8_t* buf, size_t len) {
  mem_store* s = user;
  if (off + len > REGION) return EIO;
  memcpy(s->bytes + off, buf, len);
  atomic_fetch_add(&s->writes, 1);
  return 0;
}

static int st_flush(void* user) {
  atomic_fetch_add(&((mem_store*)user)->flushes, 1);
  return 0;
}

static void st_release(void* user) { ((mem_store*)user)->released++; }

int main(void) {
  mem_store s = {.bytes = calloc(REGION, 1)};
  CHECK(s.bytes != NULL, "calloc");
  for (uint64_t b = 0; b < REGION / BLOCK; b++) {
    uint64_t w = block_word(b);
    memcpy(s.bytes + b * BLOCK, &w, 8);
  }

  fl_config cfg = fl_config_default();
  cfg.budget = 2u << 20;
  cfg.workers = 2;
  fl_manager* mm = fl_manager_new(&cfg);
  CHECK(mm != NULL, "fl_manager_new: %s", fl_last_error());

  /* Errors come back as values, with the cause, and in errno. */
  errno = 0;
  CHECK(fl_map_zero(mm, 0, NULL) == NULL && strlen(fl_last_error()) > 0 && errno == EINVAL,
        "len 0: errno %d", errno);
  fl_map_options bad = fl_map_options_default();
  bad.page_size = 8192;
  errno = 0;
  CHECK(fl_map_zero(mm, 1 << 20, &bad) == NULL && strstr(fl_last_error(), "8192") && errno == EINVAL,
        "page size 8192: %s, errno %d", fl_last_error(), errno);
  cfg.budget = 3u << 20;
  errno = 0;
  CHECK(fl_manager_new(&cfg) == NULL && strlen(fl_last_error()) > 0 && errno == EINVAL,
        "unaligned budget: errno %d", errno);

  fl_store_ops ops = {st_read, st_write, st_flush, st_release, &s};
  fl_region* r = fl_map_store(mm, &ops, REGION, NULL);
  CHECK(r != NULL, "fl_map_store: %s", fl_last_error());
  CHECK(fl_region_len(r) == REGION, "len");
  unsigned char* base = fl_region_addr(r);
  CHECK(fl_region_prefetch(r, REGION, BLOCK) == -EINVAL, "prefetch past the end");
  CHECK(fl_region_advise(r, MADV_RANDOM) == 0, "advise random: %s", fl_last_error());
  CHECK(fl_region_advise(r, MADV_DONTNEED) == -EINVAL && strstr(fl_last_error(), "MADV_RANDOM"),
        "advise DONTNEED is not an access pattern");
  CHECK(fl_region_advise(r, MADV_NORMAL) == 0, "advise normal");

  for (int round = 0; round < 2; round++)
    for (uint64_t b = 0; b < REGION / BLOCK; b++) {
      uint64_t w;
      memcpy(&w, base + b * BLOCK, 8);
      uint64_t want = round == 0 ? block_word(b) : ~block_word(b);
      CHECK(w == want, "round %d block %llu reads %#llx", round, (unsigned long long)b,
            (unsigned long long)w);
      if (round == 0) {
        w = ~w;
        memcpy(base + b * BLOCK, &w, 8);
      }
    }
  CHECK(fl_region_pin(r, 0, 1 << 20) >= 0, "pin: %s", fl_last_error());
  CHECK(fl_region_unpin(r, 0, 1 << 20) == 0, "unpin: %s", fl_last_error());
  CHECK(fl_region_flush(r) == 0, "flush: %s", fl_last_error());
  for (uint64_t b = 0; b < REGION / BLOCK; b++) {
    uint64_t w;
    memcpy(&w, s.bytes + b * BLOCK, 8);
    CHECK(w == ~block_word(b), "store block %llu holds %#llx", (unsigned long long)b,
          (unsigned long long)w);
  }
  fl_stats st;
  CHECK(fl_manager_stats(mm, &st) == 0, "stats");
  CHECK(st.faults > 0 && st.written_back > 0 && st.evicted > 0, "faults %llu written %llu evicted %llu",
        (unsigned long long)st.faults, (unsigned long long)st.written_back,
        (unsigned long long)st.evicted);
  CHECK(atomic_load(&s.writes) > 0 && atomic_load(&s.flushes) > 0, "store calls");
  CHECK(fl_region_free(r) == 0, "free: %s", fl_last_error());
  fl_manager_free(mm);
  CHECK(s.released == 1, "release called %d times", s.released);
  printf("c_store: %ld reads, %ld writes; faults %llu, evicted %llu\n", atomic_load(&s.reads),
         atomic_load(&s.writes), (unsigned long long)st.faults,
         (unsigned long long)st.evicted);
  return 0;
}
