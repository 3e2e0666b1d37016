/* Mock libcuda.so.1 (the driver; the runtime's entry points are in the mock libcudart.so.12,
 * cudart.c, which calls the mock_runtime_* helpers here). Like the real driver, cuInit dlopens
 * CUDA_INJECTION64_PATH and calls its InitializeInjection. Launch functions report API
 * enter/exit and synthesise kernel activity through the tracer libcupti registered. Exported
 * like the real libcuda.so.1: unversioned symbols, soname libcuda.so.1. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mock.h"

typedef int CUresult;
typedef const char *CUfunction; /* the mock's function handle is its mangled name */
typedef struct mock_graph *CUgraphExec;
struct mock_graph {
    uint32_t id;
    int n;
    const char *names[16];
};

static const struct mock_tracer *_Atomic tracer;
static _Atomic uint32_t next_correlation = 1;
static _Atomic uint32_t next_graph = 1;
static pthread_once_t init_once = PTHREAD_ONCE_INIT;

void mock_cuda_set_tracer(const struct mock_tracer *t) { atomic_store(&tracer, t); }

static void load_injection(void) {
    const char *path = getenv("CUDA_INJECTION64_PATH");
    if (!path || !*path) return;
    void *h = dlopen(path, RTLD_NOW);
    if (!h) {
        fprintf(stderr, "mock libcuda: cannot load injection %s: %s\n", path, dlerror());
        return;
    }
    int (*init)(void) = (int (*)(void))dlsym(h, "InitializeInjection");
    if (!init) {
        fprintf(stderr, "mock libcuda: %s has no InitializeInjection\n", path);
        return;
    }
    if (init() != 1) fprintf(stderr, "mock libcuda: InitializeInjection did not return 1\n");
}

CUresult cuInit(unsigned flags) {
    (void)flags;
    pthread_once(&init_once, load_injection);
    return 0;
}

CUresult cuDriverGetVersion(int *v) {
    if (v) *v = 12080;
    return 0;
}

static uint32_t api_enter(int domain, uint32_t cbid, const char *fn) {
    uint32_t corr = atomic_fetch_add(&next_correlation, 1);
    const struct mock_tracer *t = atomic_load(&tracer);
    if (t) t->api(domain, cbid, SITE_ENTER, fn, corr);
    return corr;
}

static void api_exit(int domain, uint32_t cbid, const char *fn, uint32_t corr) {
    const struct mock_tracer *t = atomic_load(&tracer);
    if (t) t->api(domain, cbid, SITE_EXIT, fn, corr);
}

static void emit(const char *name, uint32_t corr, uint32_t stream, const uint32_t grid[3],
                 const uint32_t block[3], uint32_t shmem, uint32_t graph, uint64_t node) {
    const struct mock_tracer *t = atomic_load(&tracer);
    if (!t) return;
    struct mock_kernel k = {
        .name = name, .correlation_id = corr, .stream_id = stream,
        .grid = {grid[0], grid[1], grid[2]}, .block = {block[0], block[1], block[2]},
        .static_shared = 1024, .dynamic_shared = shmem,
        .graph_id = graph, .graph_node_id = node, .duration_ns = 2000,
    };
    t->kernel(&k);
}

/* A CUkernel (cuLibraryGetKernel, the runtime's cudaGetKernel): a small struct holding the
 * kernel's name, told apart from a CUfunction (the name itself) by its magic. The real driver
 * takes a CUkernel wherever a CUfunction goes. */
#define KERNEL_MAGIC 0x6b65726eu
struct mock_kernel_handle {
    uint32_t magic;
    const char *name;
};

static const char *function_name(CUfunction f) {
    const struct mock_kernel_handle *k = (const struct mock_kernel_handle *)f;
    if (k && k->magic == KERNEL_MAGIC) return k->name;
    return f;
}

/* Driver launches; `outer` is the runtime call's correlation id (0 when called directly).
 * As with the real stack, the kernel record carries the outermost API's correlation id. */
static CUresult driver_launch(uint32_t cbid, const char *fn, CUfunction f, const uint32_t grid[3],
                              const uint32_t block[3], unsigned shmem, uintptr_t stream,
                              uint32_t outer) {
    uint32_t corr = api_enter(DOMAIN_DRIVER, cbid, fn);
    emit(function_name(f), outer ? outer : corr, (uint32_t)stream, grid, block, shmem, 0, 0);
    api_exit(DOMAIN_DRIVER, cbid, fn, corr);
    return 0;
}

CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shmem, uintptr_t stream, void **params,
                        void **extra) {
    (void)params; (void)extra;
    const uint32_t g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
    return driver_launch(307, "cuLaunchKernel", f, g, b, shmem, stream, 0);
}

CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned shmem, uintptr_t stream,
                             void **params, void **extra) {
    (void)params; (void)extra;
    const uint32_t g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
    return driver_launch(442, "cuLaunchKernel_ptsz", f, g, b, shmem, stream, 0);
}

CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                   unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                   uintptr_t stream, void **params) {
    (void)params;
    const uint32_t g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
    return driver_launch(308, "cuLaunchCooperativeKernel", f, g, b, shmem, stream, 0);
}

/* CUlaunchConfig as CUDA 12 lays it out (the launch uprobe reads it). */
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    uintptr_t hStream;
    void *attrs;
    unsigned numAttrs;
} CUlaunchConfig;
CUresult cuLaunchKernelEx(const CUlaunchConfig *c, CUfunction f, void **params, void **extra) {
    (void)params; (void)extra;
    const uint32_t g[3] = {c->gridDimX, c->gridDimY, c->gridDimZ};
    const uint32_t b[3] = {c->blockDimX, c->blockDimY, c->blockDimZ};
    return driver_launch(652, "cuLaunchKernelEx", f, g, b, c->sharedMemBytes, c->hStream, 0);
}

/* --- kernel handles: the mock's CUfunction is the kernel's interned name; a CUkernel is a
 * mock_kernel_handle (so the two handle kinds differ, as in the real driver). --- */
typedef struct mock_module *CUmodule;
typedef struct mock_module *CUlibrary;
typedef struct mock_kernel_handle *CUkernel;

/* A new CUkernel for `name` (exported for the mock runtime's cudaGetKernel). */
struct mock_kernel_handle *mock_kernel_of(const char *name) {
    struct mock_kernel_handle *k = calloc(1, sizeof *k);
    k->magic = KERNEL_MAGIC;
    k->name = name;
    return k;
}

static const char *intern(const char *name) {
    /* Names live as long as the process (the mock never unloads modules). */
    return strdup(name);
}

CUresult cuModuleLoadData(CUmodule *module, const void *image) {
    (void)image;
    *module = (CUmodule)calloc(1, 8);
    return 0;
}

CUresult cuModuleGetFunction(CUfunction *out, CUmodule module, const char *name) {
    (void)module;
    if (!out || !name) return 1;
    *out = intern(name);
    return 0;
}

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, void *jit_options,
                           void **jit_values, unsigned n_jit, void *lib_options,
                           void **lib_values, unsigned n_lib) {
    (void)code; (void)jit_options; (void)jit_values; (void)n_jit; (void)lib_options;
    (void)lib_values; (void)n_lib;
    *library = (CUlibrary)calloc(1, 8);
    return 0;
}

CUresult cuLibraryGetKernel(CUkernel *out, CUlibrary library, const char *name) {
    (void)library;
    if (!out || !name) return 1;
    *out = mock_kernel_of(intern(name));
    return 0;
}

CUresult cuKernelGetFunction(CUfunction *out, CUkernel kernel) {
    if (!out || !kernel) return 1;
    *out = kernel->name;
    return 0;
}

static CUresult driver_graph_launch(uint32_t cbid, const char *fn, CUgraphExec g,
                                    uintptr_t stream, uint32_t outer) {
    uint32_t corr = api_enter(DOMAIN_DRIVER, cbid, fn);
    /* One kernel record per node, all with the graph launch's correlation id. */
    static const uint32_t grid[3] = {64, 1, 1}, block[3] = {128, 1, 1};
    for (int i = 0; i < g->n; i++)
        emit(g->names[i], outer ? outer : corr, (uint32_t)stream, grid, block, 0, g->id,
             ((uint64_t)g->id << 32) | (uint64_t)(i + 1));
    api_exit(DOMAIN_DRIVER, cbid, fn, corr);
    return 0;
}

CUresult cuGraphLaunch(CUgraphExec g, uintptr_t stream) {
    return driver_graph_launch(514, "cuGraphLaunch", g, stream, 0);
}

CUresult cuGraphLaunch_ptsz(CUgraphExec g, uintptr_t stream) {
    return driver_graph_launch(515, "cuGraphLaunch_ptsz", g, stream, 0);
}

CUgraphExec mockGraphInstantiate(const char **names, int n) {
    struct mock_graph *g = calloc(1, sizeof *g);
    g->id = atomic_fetch_add(&next_graph, 1);
    g->n = n > 16 ? 16 : n;
    for (int i = 0; i < g->n; i++) g->names[i] = names[i];
    return g;
}

/* --- what the mock runtime (cudart.c) calls: its launches reach the driver through these
 * internal entry points, not the exported (probed) ones, as the real runtime's do through
 * cuGetProcAddress pointers. --- */
uint32_t mock_runtime_enter(uint32_t cbid, const char *fn) {
    return api_enter(DOMAIN_RUNTIME, cbid, fn);
}

void mock_runtime_exit(uint32_t cbid, const char *fn, uint32_t corr) {
    api_exit(DOMAIN_RUNTIME, cbid, fn, corr);
}

void mock_runtime_launch(const char *name, const uint32_t grid[3], const uint32_t block[3],
                         unsigned shmem, uintptr_t stream, uint32_t outer) {
    driver_launch(307, "cuLaunchKernel", name, grid, block, shmem, stream, outer);
}

void mock_runtime_graph_launch(CUgraphExec g, uintptr_t stream, uint32_t outer) {
    driver_graph_launch(514, "cuGraphLaunch", g, stream, outer);
}

const char *mock_function_name(const void *f) { return function_name((CUfunction)f); }

/* cuMemcpyHtoD_v2 (driver callback id 279); the mock copies nothing, it only reports. */
CUresult cuMemcpyHtoD_v2(uintptr_t dst, const void *src, size_t bytes) {
    (void)dst; (void)src;
    uint32_t corr = api_enter(DOMAIN_DRIVER, 279, "cuMemcpyHtoD_v2");
    const struct mock_tracer *t = atomic_load(&tracer);
    if (t) t->memcpy(corr, 0, 1, bytes);
    api_exit(DOMAIN_DRIVER, 279, "cuMemcpyHtoD_v2", corr);
    return 0;
}
