/* softverbs: TEST DOUBLE software verbs provider. Extra symbols beyond the libibverbs ABI. */
#ifndef SOFTVERBS_H
#define SOFTVERBS_H
#include <stdint.h>

/* Live object counts; all zero after a clean teardown. */
struct softverbs_counters {
	uint64_t device_lists;
	uint64_t contexts;
	uint64_t pds;
	uint64_t cqs;
	uint64_t qps;
	uint64_t mrs;
	uint64_t rx_threads;
};

/* Fill *out with the current counts. Returns 0, or EINVAL when out is NULL. */
int softverbs_live_objects(struct softverbs_counters *out);

#endif
