/* The native engine's late-loaded library (see engine.c): one hook point. */
#include <stdint.h>

static volatile uint64_t sink;

__attribute__((noinline, used)) void plugin_first_token(uint64_t id) {
    sink ^= id;
    __asm__ volatile("" ::: "memory");
}
