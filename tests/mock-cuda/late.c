/* A process that loads the CUDA driver only after the agent attached (as a Python engine
 * imports torch late): it waits for GO_FILE, dlopens libcuda.so, then looks up a kernel and
 * launches it every 10 ms until STOP_FILE appears. Prints how many launches it made.
 *
 *   late GO_FILE STOP_FILE */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

typedef int (*get_function_fn)(const char **, void *, const char *);
typedef int (*launch_fn)(const char *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, uintptr_t, void **, void **);

static int wait_for(const char *path) {
    for (int i = 0; access(path, F_OK) != 0; i++) {
        if (i > 6000) return 0;
        usleep(10000);
    }
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: late GO_FILE STOP_FILE\n");
        return 2;
    }
    printf("{\"ready\":true,\"pid\":%d}\n", getpid());
    fflush(stdout);
    if (!wait_for(argv[1])) return 1;
    void *cuda = dlopen("libcuda.so", RTLD_NOW);
    if (!cuda) {
        fprintf(stderr, "late: %s\n", dlerror());
        return 1;
    }
    get_function_fn get = (get_function_fn)dlsym(cuda, "cuModuleGetFunction");
    launch_fn launch = (launch_fn)dlsym(cuda, "cuLaunchKernel");
    if (!get || !launch) return 1;
    long n = 0;
    for (int i = 0; access(argv[2], F_OK) != 0 && i < 6000; i++) {
        const char *f = NULL;
        get(&f, NULL, "late_loaded_kernel");
        launch(f, 1, 1, 1, 32, 1, 1, 0, 0, NULL, NULL);
        n++;
        usleep(10000);
    }
    printf("{\"launches\":%ld}\n", n);
    fflush(stdout);
    return 0;
}
