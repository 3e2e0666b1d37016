/* Mock libcudart.so.12 (the CUDA runtime): the launch entry points the mock engines use,
 * exported as the real libcudart.so.12 exports them, under the version node `libcudart.so.12`
 * (cudart.map). Each reports its runtime API callback and reaches the mock driver through its
 * internal entry points (as the real runtime reaches the driver through cuGetProcAddress
 * pointers), so the kernel records carry the runtime call's correlation id. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>

typedef struct { unsigned x, y, z; } dim3;
typedef struct mock_graph *cudaGraphExec_t;
typedef struct mock_kernel_handle *cudaKernel_t;
/* cudaLaunchConfig_t as CUDA 12 lays it out. */
typedef struct {
    dim3 gridDim, blockDim;
    size_t dynamicSmemBytes;
    uintptr_t stream;
    void *attrs;
    unsigned numAttrs;
} cudaLaunchConfig_t;

uint32_t mock_runtime_enter(uint32_t cbid, const char *fn);
void mock_runtime_exit(uint32_t cbid, const char *fn, uint32_t corr);
void mock_runtime_launch(const char *name, const uint32_t grid[3], const uint32_t block[3],
                         unsigned shmem, uintptr_t stream, uint32_t outer);
void mock_runtime_graph_launch(cudaGraphExec_t g, uintptr_t stream, uint32_t outer);
const char *mock_function_name(const void *f);
cudaKernel_t mock_kernel_of(const char *name);

/* A runtime launch names its kernel by the host stub's address; the real runtime maps it to the
 * device function registered under the stub's (mangled) name. The mock finds that name with
 * dladdr (the engine exports its stubs); otherwise `func` is a cudaKernel_t or the name itself. */
static const char *stub_name(const void *func) {
    Dl_info info;
    if (dladdr(func, &info) && info.dli_sname && info.dli_saddr == func) return info.dli_sname;
    return mock_function_name(func);
}

static int launch(uint32_t cbid, const char *api, const void *func, dim3 grid, dim3 block,
                  size_t shmem, uintptr_t stream) {
    uint32_t corr = mock_runtime_enter(cbid, api);
    const uint32_t g[3] = {grid.x, grid.y, grid.z}, b[3] = {block.x, block.y, block.z};
    mock_runtime_launch(stub_name(func), g, b, (unsigned)shmem, stream, corr);
    mock_runtime_exit(cbid, api, corr);
    return 0;
}

int cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem,
                     uintptr_t stream) {
    (void)args;
    return launch(211, "cudaLaunchKernel_v7000", func, grid, block, shmem, stream);
}

int cudaLaunchKernel_ptsz(const void *func, dim3 grid, dim3 block, void **args, size_t shmem,
                          uintptr_t stream) {
    (void)args;
    return launch(214, "cudaLaunchKernel_ptsz_v7000", func, grid, block, shmem, stream);
}

int cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args) {
    (void)args;
    return launch(430, "cudaLaunchKernelExC_v11060", func, config->gridDim, config->blockDim,
                  config->dynamicSmemBytes, config->stream);
}

int cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config, const void *func, void **args) {
    (void)args;
    return launch(431, "cudaLaunchKernelExC_ptsz_v11060", func, config->gridDim,
                  config->blockDim, config->dynamicSmemBytes, config->stream);
}

int cudaGraphLaunch(cudaGraphExec_t g, uintptr_t stream) {
    uint32_t corr = mock_runtime_enter(311, "cudaGraphLaunch_v10000");
    mock_runtime_graph_launch(g, stream, corr);
    mock_runtime_exit(311, "cudaGraphLaunch_v10000", corr);
    return 0;
}

int cudaGraphLaunch_ptsz(cudaGraphExec_t g, uintptr_t stream) {
    uint32_t corr = mock_runtime_enter(312, "cudaGraphLaunch_ptsz_v10000");
    mock_runtime_graph_launch(g, stream, corr);
    mock_runtime_exit(312, "cudaGraphLaunch_ptsz_v10000", corr);
    return 0;
}

/* CUDA 12.1+: the cudaKernel_t (a CUkernel) of a host stub; CUDA 13 code launches through it. */
int cudaGetKernel(cudaKernel_t *out, const void *func) {
    if (!out || !func) return 1;
    *out = mock_kernel_of(stub_name(func));
    return 0;
}

int cudaDeviceSynchronize(void) { return 0; }
