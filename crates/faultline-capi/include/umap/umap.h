/*
 * LLNL Umap's C API, served by faultline (libumap.so from
 * crates/faultline-capi/umap). Same declarations as Umap's umap/umap.h, so
 * programs written for Umap build unchanged; the C++-only umap_ex() with a
 * custom Umap::Store is not provided (use faultline.h's fl_map_store).
 * Differences from Umap (faultline is right where Umap is not):
 *  - umap() honours `offset`; `length` need not be a multiple of the page
 *    size (rounded up, as mmap does); errors return UMAP_FAILED with errno
 *    set (EINVAL, positive) and never abort the process;
 *  - uunmap() writes dirty pages back and releases the address range; if
 *    the write-back fails it returns -1 (errno EIO) and keeps the region;
 *  - UMAP_BUFSIZE of any size works (the pool is whole 2 MiB frames, so it
 *    is rounded up to them); UMAP_PAGESIZE is 4096 or 2097152.
 * See crates/faultline-capi/README.md.
 */
#ifndef _UMAP_H_
#define _UMAP_H_

#include <stddef.h>
#include <stdint.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

void* umap(void* addr, size_t length, int prot, int flags, int fd, off_t offset);

int uunmap(void* addr, size_t length);

int umap_flush();

struct umap_prefetch_item {
  void* page_base_addr;
};

int umap_has_write_support();

void umap_prefetch(int npages, struct umap_prefetch_item* page_array);
void umap_fetch_and_pin(char* paddr, uint64_t size);
uint64_t umapcfg_get_umap_page_size(void);
uint64_t umapcfg_get_max_fault_events(void);
uint64_t umapcfg_get_num_fillers(void);
uint64_t umapcfg_get_num_evictors(void);
uint64_t umapcfg_get_max_pages_in_buffer(void);
uint64_t umapcfg_get_read_ahead(void);
int      umapcfg_get_evict_low_water_threshold(void);
int      umapcfg_get_evict_high_water_threshold(void);

#ifdef __cplusplus
}
#endif

/*
 * flags
 */
#define UMAP_PRIVATE    MAP_PRIVATE
#define UMAP_FIXED      MAP_FIXED

/*
 * Return codes
 */
#define UMAP_FAILED (void *)-1
#endif /* _UMAP_H_ */
