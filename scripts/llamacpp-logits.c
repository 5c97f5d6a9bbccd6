// Prints llama.cpp's logits for a prompt of token ids, one JSON row per
// position, so scripts/gguf-check.sh can hold a GGUF written by
// scripts/gguf-from-checkpoint.py against the transformers reference logits of
// a fixture: the side-by-side benchmarks then compare the same model, not
// merely the same sizes.
//
//   llamacpp-logits MODEL.gguf ID [ID ...]
//
// Built by scripts/gguf-check.sh against the llama.cpp tree being
// benchmarked (its include/ and build/bin/libllama.so).
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf ID [ID ...]\n", argv[0]);
        return 2;
    }
    const int n_tokens = argc - 2;
    llama_backend_init();

    struct llama_model_params model_params = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], model_params);
    if (model == NULL) {
        fprintf(stderr, "%s: llama.cpp could not load it\n", argv[1]);
        return 1;
    }
    struct llama_context_params ctx_params = llama_context_default_params();
    ctx_params.n_ctx = (uint32_t)n_tokens + 16;
    ctx_params.n_batch = (uint32_t)n_tokens;
    ctx_params.n_ubatch = (uint32_t)n_tokens;
    struct llama_context *ctx = llama_init_from_model(model, ctx_params);
    if (ctx == NULL) {
        fprintf(stderr, "llama.cpp could not make a context\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    struct llama_batch batch = llama_batch_init(n_tokens, 0, 1);
    for (int i = 0; i < n_tokens; i++) {
        char *end = NULL;
        long id = strtol(argv[2 + i], &end, 10);
        if (*end != '\0' || id < 0 || id >= n_vocab) {
            fprintf(stderr, "token id %s is not in 0..%d\n", argv[2 + i], n_vocab);
            return 2;
        }
        batch.token[i] = (llama_token)id;
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;  // every position's logits, as the reference has
    }
    batch.n_tokens = n_tokens;
    if (llama_decode(ctx, batch) != 0) {
        fprintf(stderr, "llama_decode failed\n");
        return 1;
    }
    printf("[");
    for (int i = 0; i < n_tokens; i++) {
        const float *row = llama_get_logits_ith(ctx, i);
        printf(i ? ",\n[" : "[");
        for (int v = 0; v < n_vocab; v++) {
            printf(v ? ",%.7g" : "%.7g", row[v]);
        }
        printf("]");
    }
    printf("]\n");
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
