/* Shared between the mock libcuda.so and the mock libcupti.so (test doubles for NVIDIA's
 * libraries, used only by inferscope's shim tests). The real CUPTI hooks into the real driver;
 * here libcupti registers a tracer with libcuda at cuptiSubscribe. */
#ifndef INFERSCOPE_MOCK_H
#define INFERSCOPE_MOCK_H
#include <stdint.h>

#define DOMAIN_DRIVER 1
#define DOMAIN_RUNTIME 2
#define SITE_ENTER 0
#define SITE_EXIT 1

struct mock_kernel {
    const char *name; /* mangled, interned for the life of the process */
    uint32_t correlation_id;
    uint32_t stream_id;
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t static_shared, dynamic_shared;
    uint32_t graph_id;
    uint64_t graph_node_id;
    uint64_t duration_ns;
};

struct mock_tracer {
    void (*api)(int domain, uint32_t cbid, int site, const char *function, uint32_t correlation_id);
    void (*kernel)(const struct mock_kernel *k);
    /* copy_kind as CUPTI's CUpti_ActivityMemcpyKind (1 = HtoD, 2 = DtoH, ...) */
    void (*memcpy)(uint32_t correlation_id, uint32_t stream_id, uint8_t copy_kind, uint64_t bytes);
};

/* Exported by libcuda.so. */
void mock_cuda_set_tracer(const struct mock_tracer *t);
/* Exported by libcupti.so: API callbacks delivered so far. */
void mock_cupti_callback_stats(uint64_t *calls);
#endif
