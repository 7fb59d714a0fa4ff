/* Far memory from C: a region whose pages live in a real redis-server
 * (fl_map_redis), 8x the budget. Every block is written through the
 * mapping, the region flushed and freed, and a new region over the same
 * prefix must read every block back from Redis; a fresh prefix reads
 * zeros; bad arguments are errors with the cause. Usage: redis URL */
#include <faultline.h>
#include "common.h"

#define REGION (16u << 20)

int main(int argc, char** argv) {
  CHECK(argc == 2, "usage: redis URL");
  const char* url = argv[1];
  fl_config cfg = fl_config_default();
  cfg.budget = 2u << 20;
  cfg.workers = 2;
  fl_manager* mm = fl_manager_new(&cfg);
  CHECK(mm != NULL, "fl_manager_new: %s", fl_last_error());

  CHECK(fl_map_redis(mm, url, NULL, REGION, NULL) == NULL && strstr(fl_last_error(), "prefix"),
        "NULL prefix: %s", fl_last_error());

  fl_region* r = fl_map_redis(mm, url, "c", REGION, NULL);
  CHECK(r != NULL, "fl_map_redis: %s", fl_last_error());
  unsigned char* base = fl_region_addr(r);
  for (uint64_t b = 0; b < REGION / BLOCK; b++) {
    uint64_t w;
    memcpy(&w, base + b * BLOCK, 8);
    CHECK(w == 0, "a fresh region reads zeros, block %llu", (unsigned long long)b);
    w = block_word(b);
    memcpy(base + b * BLOCK, &w, 8);
  }
  CHECK(fl_region_flush(r) == 0, "flush: %s", fl_last_error());
  CHECK(fl_region_free(r) == 0, "free: %s", fl_last_error());

  r = fl_map_redis(mm, url, "c", REGION, NULL);
  CHECK(r != NULL, "fl_map_redis again: %s", fl_last_error());
  base = fl_region_addr(r);
  for (uint64_t b = 0; b < REGION / BLOCK; b++) {
    uint64_t w;
    memcpy(&w, base + b * BLOCK, 8);
    CHECK(w == block_word(b), "block %llu reads %#llx from Redis", (unsigned long long)b,
          (unsigned long long)w);
  }
  fl_stats st;
  CHECK(fl_manager_stats(mm, &st) == 0, "stats");
  CHECK(fl_region_free(r) == 0, "free");
  fl_manager_free(mm);
  printf("redis: %u blocks round-tripped through %s\n", REGION / BLOCK, url);
  return 0;
}
