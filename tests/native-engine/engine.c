/* A tiny native "engine" for the user-defined probe tests: an HTTP/1.1 server whose connection
 * threads read chat requests and queue them, and one scheduler thread that admits up to SLOTS
 * requests, runs engine steps over the batch and streams one token per step per request as SSE.
 * The hook points are plain noinline functions, as a real engine's scheduler would have:
 *   engine_enqueue(uint64_t id)        on the thread that read the request
 *   engine_admit(struct task *t)       id at t->req->id (a pointer, then a nonzero offset)
 *   engine_step(int n_tokens)          one forward pass over the batch
 *   engine_first_token(uint64_t id)    the request's first token is ready
 *   engine_finish(uint64_t id)         the request is done
 * With PLUGIN, the engine loads that shared library (dlopen) once its first request is done, and
 * from then on also calls the library's plugin_first_token(uint64_t id): a hook point that is
 * not mapped when the agent first sees the process.
 * Usage: engine PORT [PLUGIN] */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SLOTS 2
#define TOKENS 6
#define STEP_US 4000
#define NOINLINE __attribute__((noinline, used))

struct request {
    uint64_t pad[3]; /* zero: a probe that dereferences it reads from NULL */
    uint64_t id;     /* offset 24 */
};

struct task {
    int32_t state;        /* 0 queued, 1 running, 2 done */
    int32_t prompt_len;
    struct request *req;  /* offset 8 */
    int produced;
    int written;
    struct task *next;
    pthread_cond_t cond;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work = PTHREAD_COND_INITIALIZER;
static struct task *queue_head, *queue_tail;
static struct task *running[SLOTS];
static uint64_t next_id = 100;
static volatile uint64_t sink;
static const char *plugin_path;
static void (*plugin_first_token)(uint64_t id);

NOINLINE void engine_enqueue(uint64_t id) { sink += id; __asm__ volatile("" ::: "memory"); }
NOINLINE void engine_admit(struct task *t) { sink += t->req->id; __asm__ volatile("" ::: "memory"); }
NOINLINE int engine_step(int n_tokens) {
    usleep(STEP_US);
    sink += (uint64_t)n_tokens;
    __asm__ volatile("" ::: "memory");
    return 0;
}
NOINLINE void engine_first_token(uint64_t id) { sink ^= id; __asm__ volatile("" ::: "memory"); }
NOINLINE void engine_finish(uint64_t id) { sink -= id; __asm__ volatile("" ::: "memory"); }

static void *scheduler(void *arg) {
    (void)arg;
    pthread_mutex_lock(&lock);
    for (;;) {
        int busy = 0;
        for (int i = 0; i < SLOTS; i++) {
            if (!running[i] && queue_head) {
                struct task *t = queue_head;
                queue_head = t->next;
                if (!queue_head) queue_tail = NULL;
                t->state = 1;
                running[i] = t;
                engine_admit(t);
            }
            if (running[i]) busy++;
        }
        if (!busy) {
            pthread_cond_wait(&work, &lock);
            continue;
        }
        int n_tokens = 0;
        for (int i = 0; i < SLOTS; i++)
            if (running[i]) n_tokens += running[i]->produced == 0 ? running[i]->prompt_len : 1;
        pthread_mutex_unlock(&lock);
        engine_step(n_tokens);
        pthread_mutex_lock(&lock);
        for (int i = 0; i < SLOTS; i++) {
            struct task *t = running[i];
            if (!t) continue;
            t->produced++;
            if (t->produced == 1) {
                engine_first_token(t->req->id);
                if (plugin_first_token) plugin_first_token(t->req->id);
            }
            if (t->produced == TOKENS) {
                engine_finish(t->req->id);
                if (plugin_path && !plugin_first_token) {
                    void *lib = dlopen(plugin_path, RTLD_NOW);
                    if (!lib) {
                        fprintf(stderr, "dlopen %s: %s\n", plugin_path, dlerror());
                        exit(1);
                    }
                    *(void **)&plugin_first_token = dlsym(lib, "plugin_first_token");
                    if (!plugin_first_token) exit(1);
                }
                t->state = 2;
                running[i] = NULL;
            }
            pthread_cond_signal(&t->cond);
        }
    }
    return NULL;
}

static int write_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n <= 0) return -1;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* One SSE event as one HTTP chunk. */
static int send_event(int fd, const char *data) {
    char buf[1024];
    int body = snprintf(buf + 16, sizeof buf - 32, "data: %s\n\n", data);
    int head = snprintf(buf, 16, "%x\r\n", body);
    memmove(buf + head, buf + 16, (size_t)body);
    memcpy(buf + head + body, "\r\n", 2);
    return write_all(fd, buf, (size_t)(head + body + 2));
}

static void serve(int fd) {
    char req[16384];
    size_t have = 0;
    for (;;) {
        char *end;
        while (!(end = memmem(req, have, "\r\n\r\n", 4))) {
            if (have == sizeof req) return;
            ssize_t n = read(fd, req + have, sizeof req - have);
            if (n <= 0) return;
            have += (size_t)n;
        }
        size_t head = (size_t)(end - req) + 4;
        size_t length = 0;
        char *cl = memmem(req, head, "Content-Length:", 15);
        if (cl) length = strtoul(cl + 15, NULL, 10);
        if (head + length > sizeof req) return;
        while (have < head + length) {
            ssize_t n = read(fd, req + have, sizeof req - have);
            if (n <= 0) return;
            have += (size_t)n;
        }
        struct request *r = calloc(1, sizeof *r);
        struct task *t = calloc(1, sizeof *t);
        if (!r || !t) return;
        pthread_cond_init(&t->cond, NULL);
        t->req = r;
        t->prompt_len = (int)length / 4 + 1;
        pthread_mutex_lock(&lock);
        r->id = next_id++;
        pthread_mutex_unlock(&lock);
        engine_enqueue(r->id); /* on the reading thread */
        pthread_mutex_lock(&lock);
        if (queue_tail) queue_tail->next = t; else queue_head = t;
        queue_tail = t;
        pthread_cond_signal(&work);
        pthread_mutex_unlock(&lock);

        const char *headers = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                              "Transfer-Encoding: chunked\r\n\r\n";
        int failed = write_all(fd, headers, strlen(headers));
        char event[512];
        pthread_mutex_lock(&lock);
        for (;;) {
            while (t->written == t->produced && t->state != 2) pthread_cond_wait(&t->cond, &lock);
            int ready = t->produced, done = t->state == 2;
            pthread_mutex_unlock(&lock);
            for (; t->written < ready; t->written++) {
                snprintf(event, sizeof event,
                         "{\"id\":\"chatcmpl-%llu\",\"object\":\"chat.completion.chunk\","
                         "\"model\":\"native\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"},"
                         "\"finish_reason\":null}]}",
                         (unsigned long long)r->id, t->written);
                if (!failed) failed = send_event(fd, event);
            }
            pthread_mutex_lock(&lock);
            if (done && t->written == t->produced) break;
        }
        pthread_mutex_unlock(&lock);
        snprintf(event, sizeof event,
                 "{\"id\":\"chatcmpl-%llu\",\"object\":\"chat.completion.chunk\",\"model\":\"native\","
                 "\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}],"
                 "\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"total_tokens\":%d}}",
                 (unsigned long long)r->id, t->prompt_len, TOKENS, t->prompt_len + TOKENS);
        if (!failed) failed = send_event(fd, event);
        if (!failed) failed = send_event(fd, "[DONE]");
        if (!failed) failed = write_all(fd, "0\r\n\r\n", 5);
        pthread_cond_destroy(&t->cond);
        free(t);
        free(r);
        if (failed) return;
        memmove(req, req + head + length, have - head - length);
        have -= head + length;
    }
}

static void *connection(void *arg) {
    int fd = (int)(intptr_t)arg;
    serve(fd);
    close(fd);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s PORT [PLUGIN]\n", argv[0]);
        return 2;
    }
    if (argc == 3) plugin_path = argv[2];
    signal(SIGPIPE, SIG_IGN);
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener, (struct sockaddr *)&addr, sizeof addr) || listen(listener, 64)) {
        perror("listen");
        return 1;
    }
    pthread_t sched;
    pthread_create(&sched, NULL, scheduler, NULL);
    printf("listening on %s\n", argv[1]);
    fflush(stdout);
    for (;;) {
        int fd = accept(listener, NULL, NULL);
        if (fd < 0) continue;
        pthread_t th;
        if (pthread_create(&th, NULL, connection, (void *)(intptr_t)fd) == 0)
            pthread_detach(th);
        else
            close(fd);
    }
}
