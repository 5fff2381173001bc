/* fitllm's C API: the C++ API (fitllm/fitllm.h) over opaque handles, for C and for any language
   that can call C. No exception crosses it: every call that can fail returns a fitllm_status, and
   fitllm_last_error() says what failed, on the calling thread, with the numbers of a budget error.
   Strings the library returns are freed with fitllm_string_free.

     fitllm_load_config load = fitllm_load_config_default();
     load.model_path = "model.gguf";
     load.mem = 2ull << 30;
     fitllm_engine* engine = NULL;
     if (fitllm_engine_load(&load, NULL, &engine) != FITLLM_OK) {
         fprintf(stderr, "%s\n", fitllm_last_error()->message);
         return 1;
     }
     char* text = NULL;
     fitllm_generate_options options = fitllm_generate_options_default();
     options.max_tokens = 32;
     fitllm_generate(engine, "Once upon a time", &options, NULL, NULL, &text);
     puts(text);
     fitllm_string_free(text);
     fitllm_engine_free(engine);
*/
#ifndef FITLLM_C_H
#define FITLLM_C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fitllm/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fitllm_status {
    FITLLM_OK = 0,
    FITLLM_ERROR = 1,        /* anything else: a file that cannot be read or run, a failed run */
    FITLLM_CONFIG_ERROR = 2, /* a setting refused (the message names it) */
    FITLLM_DOES_NOT_FIT = 3, /* the plan does not fit the budget: nothing was loaded */
    FITLLM_BUDGET_ERROR = 4, /* an allocation the budget had no room for, refused before it was made */
    FITLLM_BAD_ARGUMENT = 5  /* a null handle or pointer where one is needed */
} fitllm_status;

/* The last failure on this thread. bytes and budget: for FITLLM_DOES_NOT_FIT, the plan's bytes on
   the device and its budget; for FITLLM_BUDGET_ERROR, the bytes asked for and the device's
   capacity. Valid until the next failing call on the thread. */
typedef struct fitllm_error {
    fitllm_status status;
    const char* message; /* "" when nothing failed */
    const char* pool;    /* FITLLM_BUDGET_ERROR: the pool ("kv", "weights", ...); "" otherwise */
    uint64_t bytes;
    uint64_t budget;
} fitllm_error;
FITLLM_API const fitllm_error* fitllm_last_error(void);

FITLLM_API const char* fitllm_version(void);
FITLLM_API void fitllm_string_free(char* text);

/* LoadConfig and ContextConfig (fitllm/config.h): the _default() functions give the defaults;
   NULL strings mean "not set". */
typedef struct fitllm_load_config {
    const char* model_path;
    uint64_t mem; /* bytes; 0: what the system offers less a margin */
    bool fit;
    bool fit_may_shorten_context;
    bool mlock;
    int stream_layers;  /* -1: none (or what fit picks) */
    const char* device; /* "cuda0", "virtual", "virtual-unified"; NULL: none */
    int n_gpu_layers;   /* -2: not set; -1: as many as fit */
    uint64_t vram;
    bool kv_offload;
    bool unified;
} fitllm_load_config;

typedef struct fitllm_context_config {
    int n_ctx;
    int n_seq;
    int n_batch;
    const char* type_k; /* "f16", "q8_0", "q4_0", ...; NULL: f16 */
    const char* type_v;
    bool kv_rotation;
    const char* kv_spill_dir;
    uint64_t kv_resident;
    bool context_shift;
    int n_keep;
    int n_threads; /* 0: the physical cores */
} fitllm_context_config;

FITLLM_API fitllm_load_config fitllm_load_config_default(void);
FITLLM_API fitllm_context_config fitllm_context_config_default(void);

typedef struct fitllm_generate_options {
    int max_tokens;
    float temperature; /* <= 0: greedy */
    int top_k;
    float top_p;
    float min_p;
    float repeat_penalty;
    bool has_seed;
    uint64_t seed;
    const char* const* stop; /* n_stop strings that end the generation (not in the text) */
    size_t n_stop;
} fitllm_generate_options;
FITLLM_API fitllm_generate_options fitllm_generate_options_default(void);

typedef struct fitllm_chat_message {
    const char* role;
    const char* content;
} fitllm_chat_message;

/* Called with each piece of text as it completes (not NUL-terminated); false stops. */
typedef bool (*fitllm_text_callback)(const char* piece, size_t length, void* user_data);

typedef struct fitllm_engine fitllm_engine;

/* Plans and loads (context NULL: the defaults). On success *engine is the handle. */
FITLLM_API fitllm_status fitllm_engine_load(const fitllm_load_config* load, const fitllm_context_config* context,
                                            fitllm_engine** engine);
FITLLM_API void fitllm_engine_free(fitllm_engine* engine);

/* The plan without loading: its table (as `fitllm plan` prints it) in *text, whether it fits in
 *fits. */
FITLLM_API fitllm_status fitllm_plan(const fitllm_load_config* load, const fitllm_context_config* context, char** text,
                                     bool* fits);
/* The loaded engine's plan, as JSON. */
FITLLM_API fitllm_status fitllm_engine_plan_json(const fitllm_engine* engine, char** json);
/* What every pool of every device holds and held at most, as JSON. */
FITLLM_API fitllm_status fitllm_engine_memory_json(const fitllm_engine* engine, char** json);

/* Writes up to capacity token ids; *n_tokens gets how many the text has (call again with a
   larger buffer when it is over capacity). */
FITLLM_API fitllm_status fitllm_tokenize(const fitllm_engine* engine, const char* text, bool add_special,
                                         bool parse_special, int32_t* tokens, size_t capacity, size_t* n_tokens);
FITLLM_API fitllm_status fitllm_detokenize(const fitllm_engine* engine, const int32_t* tokens, size_t n_tokens,
                                           char** text);
FITLLM_API fitllm_status fitllm_apply_chat_template(const fitllm_engine* engine, const fitllm_chat_message* messages,
                                                    size_t n_messages, bool add_generation_prompt, char** prompt);

/* The continuation of prompt (or the reply to a conversation) in *text; on_text (may be NULL)
   gets each piece as it comes. options NULL: the defaults. */
FITLLM_API fitllm_status fitllm_generate(fitllm_engine* engine, const char* prompt,
                                         const fitllm_generate_options* options, fitllm_text_callback on_text,
                                         void* user_data, char** text);
FITLLM_API fitllm_status fitllm_chat(fitllm_engine* engine, const fitllm_chat_message* messages, size_t n_messages,
                                     const fitllm_generate_options* options, fitllm_text_callback on_text,
                                     void* user_data, char** text);

FITLLM_API fitllm_status fitllm_perplexity(fitllm_engine* engine, const char* text, int n_ctx, int n_chunks,
                                           double* ppl, double* ppl_error);

#ifdef __cplusplus
}
#endif

#endif /* FITLLM_C_H */
