/* A short C program on fitllm's C API (fitllm/fitllm_c.h): loads a model inside a 1 GiB budget
   and prints the greedy continuation of a prompt, as `fitllm run -m MODEL -p PROMPT -n N --temp 0`
   prints it on stdout.

     generate MODEL PROMPT [N]
*/
#include <fitllm/fitllm_c.h>
#include <stdio.h>
#include <stdlib.h>

static bool print_piece(const char* piece, size_t length, void* user_data) {
    (void)user_data;
    fwrite(piece, 1, length, stdout);
    fflush(stdout);
    return true;
}

int main(int argc, char** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL PROMPT [N]\n", argv[0]);
        return 2;
    }
    fitllm_load_config load = fitllm_load_config_default();
    load.model_path = argv[1];
    load.mem = 1ull << 30;
    fitllm_context_config context = fitllm_context_config_default();
    context.n_ctx = 512;
    fitllm_engine* engine = NULL;
    if (fitllm_engine_load(&load, &context, &engine) != FITLLM_OK) {
        fprintf(stderr, "generate: %s\n", fitllm_last_error()->message);
        return 1;
    }
    fitllm_generate_options options = fitllm_generate_options_default();
    options.max_tokens = argc > 3 ? atoi(argv[3]) : 32;
    options.temperature = 0.0f; /* greedy */
    fputs(argv[2], stdout);
    const fitllm_status status = fitllm_generate(engine, argv[2], &options, print_piece, NULL, NULL);
    putchar('\n');
    if (status != FITLLM_OK) fprintf(stderr, "generate: %s\n", fitllm_last_error()->message);
    fitllm_engine_free(engine);
    return status == FITLLM_OK ? 0 : 1;
}
