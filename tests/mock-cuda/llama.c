/* Mock libllama.so: just the step entry point inferscope hooks in llama.cpp builds,
 * `llama_decode(llama_context*, llama_batch)`, with the batch passed by value (on the stack,
 * n_tokens first, as in llama.cpp). Each call runs the step the mock engine registered. */
#include <stdint.h>

struct llama_batch {
    int32_t n_tokens;
    void *token, *embd, *pos, *n_seq_id, *seq_id, *logits;
};

static void (*step_fn)(int32_t n_tokens);

void mock_llama_set_step(void (*fn)(int32_t)) { step_fn = fn; }

__attribute__((noinline)) int32_t llama_decode(void *ctx, struct llama_batch batch) {
    (void)ctx;
    if (step_fn) step_fn(batch.n_tokens);
    return 0;
}
