// The C API (fitllm/fitllm_c.h) over the C++ API: handles, status codes, and the last error per
// thread; no exception crosses it.
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "fitllm/fitllm.h"
#include "fitllm/fitllm_c.h"

struct fitllm_engine {
    fitllm::Engine engine;
};

namespace {

struct LastError {
    std::string message, pool;
    fitllm_error view{FITLLM_OK, "", "", 0, 0};
};

LastError& last_error() {
    thread_local LastError e;
    return e;
}

fitllm_status fail(fitllm_status status, const std::string& message, const std::string& pool = {}, uint64_t bytes = 0,
                   uint64_t budget = 0) {
    LastError& e = last_error();
    e.message = message;
    e.pool = pool;
    e.view = {status, e.message.c_str(), e.pool.c_str(), bytes, budget};
    return status;
}

// Runs f and turns what it throws into a status and the thread's last error.
template <class F>
fitllm_status call(F&& f) {
    try {
        f();
        return FITLLM_OK;
    } catch (const fitllm::DoesNotFitError& e) {
        return fail(FITLLM_DOES_NOT_FIT, e.what(), {}, e.needed(), e.budget());
    } catch (const fitllm::BudgetError& e) {
        return fail(FITLLM_BUDGET_ERROR, e.what(), e.pool(), e.requested(), e.capacity());
    } catch (const fitllm::ConfigError& e) {
        return fail(FITLLM_CONFIG_ERROR, e.what());
    } catch (const std::bad_alloc&) {
        return fail(FITLLM_ERROR, "out of memory");
    } catch (const std::exception& e) {
        return fail(FITLLM_ERROR, e.what());
    } catch (...) {
        return fail(FITLLM_ERROR, "unknown error");
    }
}

char* copy(const std::string& s) {
    char* out = static_cast<char*>(std::malloc(s.size() + 1));
    if (out == nullptr) throw std::bad_alloc();
    std::memcpy(out, s.data(), s.size());
    out[s.size()] = '\0';
    return out;
}

std::string str(const char* s) {
    return s ? std::string(s) : std::string();
}

fitllm::LoadConfig load_config(const fitllm_load_config& c) {
    fitllm::LoadConfig l;
    l.model_path = str(c.model_path);
    l.mem = c.mem;
    l.fit = c.fit;
    l.fit_may_shorten_context = c.fit_may_shorten_context;
    l.mlock = c.mlock;
    l.stream_layers = c.stream_layers;
    l.offload.device = str(c.device);
    l.offload.n_gpu_layers = c.n_gpu_layers;
    l.offload.vram = c.vram;
    l.offload.kv_offload = c.kv_offload;
    l.offload.unified = c.unified;
    return l;
}

fitllm::ContextConfig context_config(const fitllm_context_config* c) {
    fitllm::ContextConfig x;
    if (c == nullptr) return x;
    x.n_ctx = c->n_ctx;
    x.n_seq = c->n_seq;
    x.n_batch = c->n_batch;
    if (c->type_k) x.type_k = fitllm::parse_kv_type(c->type_k);
    if (c->type_v) x.type_v = fitllm::parse_kv_type(c->type_v);
    x.kv_rotation = c->kv_rotation;
    x.kv_spill_dir = str(c->kv_spill_dir);
    x.kv_resident = c->kv_resident;
    x.context_shift = c->context_shift;
    x.n_keep = c->n_keep;
    x.n_threads = c->n_threads;
    return x;
}

fitllm::GenerateOptions generate_options(const fitllm_generate_options* o) {
    fitllm::GenerateOptions g;
    const fitllm_generate_options d = o ? *o : fitllm_generate_options_default();
    g.max_tokens = d.max_tokens;
    g.sampling.temperature = d.temperature;
    g.sampling.top_k = d.top_k;
    g.sampling.top_p = d.top_p;
    g.sampling.min_p = d.min_p;
    g.sampling.repeat_penalty = d.repeat_penalty;
    if (d.has_seed) g.sampling.seed = d.seed;
    for (size_t i = 0; i < d.n_stop; ++i) g.stop.push_back(str(d.stop[i]));
    return g;
}

fitllm::TextCallback callback(fitllm_text_callback on_text, void* user) {
    if (on_text == nullptr) return {};
    return [on_text, user](std::string_view piece) { return on_text(piece.data(), piece.size(), user); };
}

std::vector<fitllm::ChatMessage> messages(const fitllm_chat_message* m, size_t n) {
    std::vector<fitllm::ChatMessage> out;
    for (size_t i = 0; i < n; ++i) out.push_back({str(m[i].role), str(m[i].content)});
    return out;
}

nlohmann::json memory_json(const fitllm::MemoryReport& r) {
    nlohmann::json devices = nlohmann::json::array();
    for (const fitllm::DeviceUsage& d : r.devices) {
        nlohmann::json pools = nlohmann::json::array();
        for (const fitllm::PoolUsage& p : d.pools)
            pools.push_back({{"name", p.name}, {"used", p.used}, {"peak", p.peak}});
        devices.push_back(
            {{"name", d.name}, {"capacity", d.capacity}, {"used", d.used}, {"peak", d.peak}, {"pools", pools}});
    }
    return {{"devices", devices}, {"plan_total", r.plan_total}, {"peak_rss", r.peak_rss}};
}

}  // namespace

extern "C" {

const fitllm_error* fitllm_last_error(void) {
    return &last_error().view;
}

const char* fitllm_version(void) {
    return fitllm::kVersion;
}

void fitllm_string_free(char* text) {
    std::free(text);
}

fitllm_load_config fitllm_load_config_default(void) {
    const fitllm::LoadConfig d;
    return {nullptr,
            d.mem,
            d.fit,
            d.fit_may_shorten_context,
            d.mlock,
            d.stream_layers,
            nullptr,
            d.offload.n_gpu_layers,
            d.offload.vram,
            d.offload.kv_offload,
            d.offload.unified};
}

fitllm_context_config fitllm_context_config_default(void) {
    const fitllm::ContextConfig d;
    return {d.n_ctx, d.n_seq,       d.n_batch,       nullptr,  nullptr,    d.kv_rotation,
            nullptr, d.kv_resident, d.context_shift, d.n_keep, d.n_threads};
}

fitllm_generate_options fitllm_generate_options_default(void) {
    const fitllm::GenerateOptions d;
    return {d.max_tokens,
            d.sampling.temperature,
            d.sampling.top_k,
            d.sampling.top_p,
            d.sampling.min_p,
            d.sampling.repeat_penalty,
            false,
            0,
            nullptr,
            0};
}

fitllm_status fitllm_engine_load(const fitllm_load_config* load, const fitllm_context_config* context,
                                 fitllm_engine** engine) {
    if (load == nullptr || engine == nullptr)
        return fail(FITLLM_BAD_ARGUMENT, "fitllm_engine_load: load and engine are needed");
    return call([&] {
        *engine = nullptr;
        *engine = new fitllm_engine{fitllm::Engine::load(load_config(*load), context_config(context))};
    });
}

void fitllm_engine_free(fitllm_engine* engine) {
    delete engine;
}

fitllm_status fitllm_plan(const fitllm_load_config* load, const fitllm_context_config* context, char** text,
                          bool* fits) {
    if (load == nullptr || text == nullptr) return fail(FITLLM_BAD_ARGUMENT, "fitllm_plan: load and text are needed");
    return call([&] {
        const fitllm::PlanReport r = fitllm::Engine::plan(load_config(*load), context_config(context));
        *text = copy(r.text);
        if (fits) *fits = r.fits;
    });
}

fitllm_status fitllm_engine_plan_json(const fitllm_engine* engine, char** json) {
    if (engine == nullptr || json == nullptr)
        return fail(FITLLM_BAD_ARGUMENT, "fitllm_engine_plan_json: null argument");
    return call([&] { *json = copy(engine->engine.plan().json); });
}

fitllm_status fitllm_engine_memory_json(const fitllm_engine* engine, char** json) {
    if (engine == nullptr || json == nullptr)
        return fail(FITLLM_BAD_ARGUMENT, "fitllm_engine_memory_json: null argument");
    return call([&] { *json = copy(memory_json(engine->engine.memory()).dump()); });
}

fitllm_status fitllm_tokenize(const fitllm_engine* engine, const char* text, bool add_special, bool parse_special,
                              int32_t* tokens, size_t capacity, size_t* n_tokens) {
    if (engine == nullptr || text == nullptr || n_tokens == nullptr || (tokens == nullptr && capacity > 0)) {
        return fail(FITLLM_BAD_ARGUMENT, "fitllm_tokenize: null argument");
    }
    return call([&] {
        const std::vector<int32_t> ids = engine->engine.tokenize(text, add_special, parse_special);
        *n_tokens = ids.size();
        for (size_t i = 0; i < ids.size() && i < capacity; ++i) tokens[i] = ids[i];
    });
}

fitllm_status fitllm_detokenize(const fitllm_engine* engine, const int32_t* tokens, size_t n_tokens, char** text) {
    if (engine == nullptr || text == nullptr || (tokens == nullptr && n_tokens > 0)) {
        return fail(FITLLM_BAD_ARGUMENT, "fitllm_detokenize: null argument");
    }
    return call([&] { *text = copy(engine->engine.detokenize(std::span<const int32_t>(tokens, n_tokens))); });
}

fitllm_status fitllm_apply_chat_template(const fitllm_engine* engine, const fitllm_chat_message* m, size_t n,
                                         bool add_generation_prompt, char** prompt) {
    if (engine == nullptr || prompt == nullptr || (m == nullptr && n > 0)) {
        return fail(FITLLM_BAD_ARGUMENT, "fitllm_apply_chat_template: null argument");
    }
    return call([&] { *prompt = copy(engine->engine.apply_chat_template(messages(m, n), add_generation_prompt)); });
}

fitllm_status fitllm_generate(fitllm_engine* engine, const char* prompt, const fitllm_generate_options* options,
                              fitllm_text_callback on_text, void* user_data, char** text) {
    if (engine == nullptr || prompt == nullptr) return fail(FITLLM_BAD_ARGUMENT, "fitllm_generate: null argument");
    return call([&] {
        const fitllm::Completion c =
            engine->engine.generate(prompt, generate_options(options), callback(on_text, user_data));
        if (text) *text = copy(c.text);
    });
}

fitllm_status fitllm_chat(fitllm_engine* engine, const fitllm_chat_message* m, size_t n,
                          const fitllm_generate_options* options, fitllm_text_callback on_text, void* user_data,
                          char** text) {
    if (engine == nullptr || (m == nullptr && n > 0)) return fail(FITLLM_BAD_ARGUMENT, "fitllm_chat: null argument");
    return call([&] {
        const fitllm::Completion c =
            engine->engine.chat(messages(m, n), generate_options(options), callback(on_text, user_data));
        if (text) *text = copy(c.text);
    });
}

fitllm_status fitllm_perplexity(fitllm_engine* engine, const char* text, int n_ctx, int n_chunks, double* ppl,
                                double* ppl_error) {
    if (engine == nullptr || text == nullptr || ppl == nullptr) {
        return fail(FITLLM_BAD_ARGUMENT, "fitllm_perplexity: null argument");
    }
    return call([&] {
        const fitllm::PerplexityResult r = engine->engine.perplexity(text, {.n_ctx = n_ctx, .n_chunks = n_chunks});
        *ppl = r.ppl;
        if (ppl_error) *ppl_error = r.ppl_error;
    });
}

}  // extern "C"
