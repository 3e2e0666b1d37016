/* Mock libcupti.so: the subset of CUPTI that libinferscope_cupti uses, with the real entry-point
 * names and record layouts (CUpti_ActivityKernel9, CUpti_CallbackData), so the shim runs its real
 * loading (cudarc's dlopen), callback and activity-buffer code. Kernels come from the mock libcuda.
 *
 * Environment knobs:
 *   MOCK_CUPTI_OTHER_SUBSCRIBER=1       cuptiSubscribe fails with MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
 *   MOCK_CUPTI_NO_TIMESTAMP_CALLBACK=1  cuptiActivityRegisterTimestampCallback is refused
 *   MOCK_CUPTI_WORKER_DELAY_MS=N        the completion worker sleeps N ms per buffer (overflow)
 *   MOCK_CUPTI_SKIP_CALLBACKS=1         count API callbacks but do not call the subscriber
 *                                       (the baseline of scripts/bench_shim.sh)
 *   MOCK_CUPTI_NO_ACTIVITY=1            synthesise no kernel records (isolates the callback path)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "mock.h"

enum {
    CUPTI_SUCCESS = 0,
    CUPTI_ERROR_INVALID_PARAMETER = 1,
    CUPTI_ERROR_INVALID_OPERATION = 7,
    CUPTI_ERROR_MAX_LIMIT_REACHED = 12,
    CUPTI_ERROR_NOT_SUPPORTED = 27,
    CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39,
};
#define KIND_MEMCPY 1
#define KIND_CONCURRENT_KERNEL 10

#pragma pack(push, 8)
typedef struct {
    uint32_t kind;
    uint8_t cacheConfig;
    uint8_t sharedMemoryConfig;
    uint16_t registersPerThread;
    uint32_t partitionedGlobalCacheRequested;
    uint32_t partitionedGlobalCacheExecuted;
    uint64_t start, end, completed;
    uint32_t deviceId, contextId, streamId;
    int32_t gridX, gridY, gridZ, blockX, blockY, blockZ;
    int32_t staticSharedMemory, dynamicSharedMemory;
    uint32_t localMemoryPerThread, localMemoryTotal;
    uint32_t correlationId;
    int64_t gridId;
    const char *name;
    void *reserved0;
    uint64_t queued, submitted;
    uint8_t launchType, isSharedMemoryCarveoutRequested, sharedMemoryCarveoutRequested, padding;
    uint32_t sharedMemoryExecuted;
    uint64_t graphNodeId;
    uint32_t shmemLimitConfig;
    uint32_t graphId;
    void *pAccessPolicyWindow;
    uint32_t channelID;
    uint32_t channelType;
    uint32_t clusterX, clusterY, clusterZ, clusterSchedulingPolicy;
    uint64_t localMemoryTotal_v2;
    uint32_t maxPotentialClusterSize, maxActiveClusters;
} Kernel9;
#pragma pack(pop)
/* Must match cudarc's CUpti_ActivityKernel9 (checked on the Rust side too). */
_Static_assert(sizeof(Kernel9) == 208, "Kernel9 size");
_Static_assert(offsetof(Kernel9, start) == 16, "start");
_Static_assert(offsetof(Kernel9, correlationId) == 92, "correlationId");
_Static_assert(offsetof(Kernel9, name) == 104, "name");
_Static_assert(offsetof(Kernel9, graphNodeId) == 144, "graphNodeId");
_Static_assert(offsetof(Kernel9, graphId) == 156, "graphId");

#pragma pack(push, 8)
typedef struct {
    uint32_t kind;
    uint8_t copyKind, srcKind, dstKind, flags;
    uint64_t bytes, start, end;
    uint32_t deviceId, contextId, streamId, correlationId, runtimeCorrelationId, pad;
    void *reserved0;
    uint64_t graphNodeId;
    uint32_t graphId, channelID, channelType, pad2;
} Memcpy5;
#pragma pack(pop)
_Static_assert(sizeof(Memcpy5) == 88, "Memcpy5 size");
_Static_assert(offsetof(Memcpy5, bytes) == 8, "bytes");
_Static_assert(offsetof(Memcpy5, correlationId) == 44, "correlationId");

static size_t record_size(uint32_t kind) {
    return kind == KIND_MEMCPY ? sizeof(Memcpy5) : sizeof(Kernel9);
}

typedef struct {
    uint32_t callbackSite;
    const char *functionName;
    const void *functionParams;
    void *functionReturnValue;
    const char *symbolName;
    void *context;
    uint32_t contextUid;
    uint64_t *correlationData;
    uint32_t correlationId;
} CallbackData;

typedef void (*CallbackFunc)(void *userdata, int domain, uint32_t cbid, const void *data);
typedef void (*BufferRequested)(uint8_t **buffer, size_t *size, size_t *max_records);
typedef void (*BufferCompleted)(void *ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                size_t valid);
typedef uint64_t (*TimestampFunc)(void);

static CallbackFunc subscriber;
static void *subscriber_data;
static _Atomic int subscribed;
static uint8_t enabled_cb[8][1024];
static BufferRequested on_request;
static BufferCompleted on_complete;
static TimestampFunc timestamp_cb;
static _Atomic int kernels_enabled;
static _Atomic int memcpy_enabled;
static int any_activity_enabled;
static _Atomic uint64_t cb_calls;
static int skip_callbacks;

/* Activity state: one current buffer, a queue of full ones for the worker thread. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static uint8_t *cur;
static size_t cur_size, cur_valid;
#define QMAX 4096
static struct full { uint8_t *buf; size_t size, valid; } queue[QMAX];
static int qhead, qlen;
static uint64_t dropped;
static uint64_t last_end[64];
static pthread_t worker;
static int worker_started;
static int worker_delay_ms;
static int worker_busy;

static uint64_t realtime_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
/* Real CUPTI's default clock is CLOCK_REALTIME based; the timestamp callback replaces it. */
static uint64_t cupti_now(void) { return timestamp_cb ? timestamp_cb() : realtime_ns(); }

static void *worker_main(void *arg) {
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&lock);
        while (qlen == 0) pthread_cond_wait(&cond, &lock);
        struct full f = queue[qhead];
        qhead = (qhead + 1) % QMAX;
        qlen--;
        worker_busy = 1;
        pthread_mutex_unlock(&lock);
        if (worker_delay_ms) usleep((useconds_t)worker_delay_ms * 1000);
        on_complete(NULL, 0, f.buf, f.size, f.valid);
        pthread_mutex_lock(&lock);
        worker_busy = 0;
        pthread_cond_broadcast(&cond);
        pthread_mutex_unlock(&lock);
    }
    return NULL;
}

/* With `lock` held. */
static void retire_current(void) {
    if (!cur) return;
    if (qlen < QMAX) {
        queue[(qhead + qlen) % QMAX] = (struct full){cur, cur_size, cur_valid};
        qlen++;
        pthread_cond_broadcast(&cond);
    }
    cur = NULL;
    cur_size = cur_valid = 0;
}

static void tracer_api(int domain, uint32_t cbid, int site, const char *function, uint32_t corr) {
    if (!atomic_load(&subscribed) || domain < 0 || domain >= 8 || cbid >= 1024) return;
    if (!enabled_cb[domain][cbid]) return;
    CallbackData d = {
        .callbackSite = (uint32_t)site, .functionName = function,
        .symbolName = NULL, .correlationId = corr,
    };
    atomic_fetch_add(&cb_calls, 1);
    if (skip_callbacks) return; /* benchmark baseline: everything but the subscriber's work */
    subscriber(subscriber_data, domain, cbid, &d);
}

static int no_activity = -1;

/* With `lock` held: room for `size` bytes in the current buffer, or NULL (record dropped). */
static uint8_t *reserve(size_t size) {
    if (cur && cur_valid + size > cur_size) retire_current();
    if (!cur) {
        uint8_t *b = NULL;
        size_t sz = 0, maxr = 0;
        on_request(&b, &sz, &maxr);
        if (b && sz >= sizeof(Kernel9)) {
            cur = b;
            cur_size = sz;
            cur_valid = 0;
        }
    }
    if (!cur) {
        dropped++;
        return NULL;
    }
    uint8_t *p = cur + cur_valid;
    cur_valid += size;
    return p;
}

static void tracer_memcpy(uint32_t corr, uint32_t stream, uint8_t copy_kind, uint64_t bytes) {
    if (!atomic_load(&memcpy_enabled)) return;
    uint64_t now = cupti_now();
    Memcpy5 r;
    memset(&r, 0, sizeof r);
    r.kind = KIND_MEMCPY;
    r.copyKind = copy_kind;
    r.bytes = bytes;
    r.start = now + 10000;
    r.end = now + 10000 + bytes; /* 1 byte/ns */
    r.streamId = stream;
    r.correlationId = corr;
    pthread_mutex_lock(&lock);
    uint8_t *p = reserve(sizeof r);
    if (p) memcpy(p, &r, sizeof r);
    pthread_mutex_unlock(&lock);
}

static void tracer_kernel(const struct mock_kernel *k) {
    if (no_activity < 0) {
        const char *v = getenv("MOCK_CUPTI_NO_ACTIVITY");
        no_activity = v && *v == '1';
    }
    if (no_activity || !atomic_load(&kernels_enabled)) return;
    uint64_t now = cupti_now();
    pthread_mutex_lock(&lock);
    uint8_t *slot = reserve(sizeof(Kernel9));
    if (!slot) {
        pthread_mutex_unlock(&lock);
        return;
    }
    uint32_t s = k->stream_id % 64;
    uint64_t start = now + 50000;
    if (start < last_end[s]) start = last_end[s];
    uint64_t end = start + k->duration_ns;
    last_end[s] = end;
    Kernel9 r;
    memset(&r, 0, sizeof r);
    r.kind = KIND_CONCURRENT_KERNEL;
    r.start = start;
    r.end = end;
    r.completed = end;
    r.deviceId = 0;
    r.contextId = 1;
    r.streamId = k->stream_id;
    r.gridX = (int32_t)k->grid[0]; r.gridY = (int32_t)k->grid[1]; r.gridZ = (int32_t)k->grid[2];
    r.blockX = (int32_t)k->block[0]; r.blockY = (int32_t)k->block[1]; r.blockZ = (int32_t)k->block[2];
    r.staticSharedMemory = (int32_t)k->static_shared;
    r.dynamicSharedMemory = (int32_t)k->dynamic_shared;
    r.correlationId = k->correlation_id;
    r.name = k->name;
    r.queued = now;
    r.submitted = now;
    r.graphNodeId = k->graph_node_id;
    r.graphId = k->graph_id;
    memcpy(slot, &r, sizeof r);
    pthread_mutex_unlock(&lock);
}

static const struct mock_tracer the_tracer = {tracer_api, tracer_kernel, tracer_memcpy};

/* --- the CUPTI API --- */
int cuptiGetVersion(uint32_t *v) {
    if (v) *v = 26;
    return CUPTI_SUCCESS;
}

int cuptiSubscribe(void **handle, CallbackFunc cb, void *userdata) {
    const char *other = getenv("MOCK_CUPTI_OTHER_SUBSCRIBER");
    if ((other && *other == '1') || atomic_load(&subscribed))
        return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    subscriber = cb;
    subscriber_data = userdata;
    const char *skip = getenv("MOCK_CUPTI_SKIP_CALLBACKS");
    skip_callbacks = skip && *skip == '1';
    *handle = (void *)&the_tracer;
    atomic_store(&subscribed, 1);
    mock_cuda_set_tracer(&the_tracer);
    return CUPTI_SUCCESS;
}

int cuptiUnsubscribe(void *handle) {
    (void)handle;
    atomic_store(&subscribed, 0);
    return CUPTI_SUCCESS;
}

int cuptiEnableCallback(uint32_t enable, void *handle, int domain, uint32_t cbid) {
    (void)handle;
    if (domain < 0 || domain >= 8 || cbid >= 1024) return CUPTI_ERROR_INVALID_PARAMETER;
    enabled_cb[domain][cbid] = enable ? 1 : 0;
    return CUPTI_SUCCESS;
}

int cuptiGetTimestamp(uint64_t *t) {
    *t = realtime_ns();
    return CUPTI_SUCCESS;
}

int cuptiActivityRegisterTimestampCallback(TimestampFunc f) {
    const char *no = getenv("MOCK_CUPTI_NO_TIMESTAMP_CALLBACK");
    if (no && *no == '1') return CUPTI_ERROR_NOT_SUPPORTED;
    if (any_activity_enabled) return CUPTI_ERROR_INVALID_OPERATION;
    timestamp_cb = f;
    return CUPTI_SUCCESS;
}

int cuptiActivityRegisterCallbacks(BufferRequested req, BufferCompleted done) {
    if (!req || !done) return CUPTI_ERROR_INVALID_PARAMETER;
    on_request = req;
    on_complete = done;
    return CUPTI_SUCCESS;
}

int cuptiActivityEnable(uint32_t kind) {
    if (!on_request) return CUPTI_ERROR_INVALID_OPERATION;
    any_activity_enabled = 1;
    if (kind == KIND_CONCURRENT_KERNEL) atomic_store(&kernels_enabled, 1);
    if (kind == KIND_MEMCPY) atomic_store(&memcpy_enabled, 1);
    pthread_mutex_lock(&lock);
    if (!worker_started) {
        const char *d = getenv("MOCK_CUPTI_WORKER_DELAY_MS");
        worker_delay_ms = d ? atoi(d) : 0;
        pthread_create(&worker, NULL, worker_main, NULL);
        pthread_detach(worker);
        worker_started = 1;
    }
    pthread_mutex_unlock(&lock);
    return CUPTI_SUCCESS;
}

int cuptiActivityDisable(uint32_t kind) {
    if (kind == KIND_CONCURRENT_KERNEL) atomic_store(&kernels_enabled, 0);
    return CUPTI_SUCCESS;
}

/* Completes the current buffer and every queued one on the calling thread, and waits for the
 * one the worker may be completing, so every record is delivered when it returns. */
int cuptiActivityFlushAll(uint32_t flag) {
    (void)flag;
    if (!on_complete) return CUPTI_SUCCESS;
    for (;;) {
        pthread_mutex_lock(&lock);
        retire_current();
        if (qlen == 0) {
            while (worker_busy) pthread_cond_wait(&cond, &lock);
            pthread_mutex_unlock(&lock);
            return CUPTI_SUCCESS;
        }
        struct full f = queue[qhead];
        qhead = (qhead + 1) % QMAX;
        qlen--;
        pthread_mutex_unlock(&lock);
        on_complete(NULL, 0, f.buf, f.size, f.valid);
    }
}

int cuptiActivityGetNextRecord(uint8_t *buffer, size_t valid, void **record) {
    if (!buffer || !record) return CUPTI_ERROR_INVALID_PARAMETER;
    uint8_t *next = buffer;
    if (*record) {
        uint32_t kind;
        memcpy(&kind, *record, sizeof kind);
        next = (uint8_t *)*record + record_size(kind);
    }
    uint32_t next_kind = 0;
    if (next + sizeof next_kind <= buffer + valid) memcpy(&next_kind, next, sizeof next_kind);
    if (next + sizeof next_kind > buffer + valid || next + record_size(next_kind) > buffer + valid) {
        *record = NULL;
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    }
    *record = next;
    return CUPTI_SUCCESS;
}

/* Records dropped since the previous call (no buffer available). */
int cuptiActivityGetNumDroppedRecords(void *ctx, uint32_t stream, size_t *n) {
    (void)ctx; (void)stream;
    pthread_mutex_lock(&lock);
    *n = (size_t)dropped;
    dropped = 0;
    pthread_mutex_unlock(&lock);
    return CUPTI_SUCCESS;
}

void mock_cupti_callback_stats(uint64_t *calls) { *calls = atomic_load(&cb_calls); }
