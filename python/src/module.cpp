// fitllm._fitllm: nanobind bindings of the C++ API (fitllm/fitllm.h). The Python face is
// fitllm/__init__.py; errors become the exceptions it defines, with their numbers as attributes.
#include <fitllm/fitllm.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace {

// Raises the exception class `name` of the fitllm package with the message, and sets attributes.
template <class SetAttrs>
void raise(const char* name, const char* message, SetAttrs&& set_attrs) {
    nb::object type = nb::module_::import_("fitllm").attr(name);
    nb::object exc = type(message);
    set_attrs(exc);
    PyErr_SetObject(type.ptr(), exc.ptr());
}

void translate(const std::exception_ptr& p, void*) {
    try {
        std::rethrow_exception(p);
    } catch (const fitllm::DoesNotFitError& e) {
        raise("DoesNotFitError", e.what(), [&](nb::object& x) {
            x.attr("device") = e.device();
            x.attr("needed") = e.needed();
            x.attr("budget") = e.budget();
            x.attr("plan_text") = e.plan_text();
        });
    } catch (const fitllm::BudgetError& e) {
        raise("BudgetError", e.what(), [&](nb::object& x) {
            x.attr("pool") = e.pool();
            x.attr("requested") = e.requested();
            x.attr("capacity") = e.capacity();
            x.attr("in_use") = e.in_use();
        });
    } catch (const fitllm::ConfigError& e) {
        raise("ConfigError", e.what(), [](nb::object&) {});
    } catch (const fitllm::Error& e) {
        raise("Error", e.what(), [](nb::object&) {});
    }
}

nb::dict plan_dict(const fitllm::PlanReport& r) {
    nb::dict d;
    d["total"] = r.total;
    d["budget"] = r.budget;
    d["fits"] = r.fits;
    d["weights"] = r.weights;
    d["kv"] = r.kv;
    d["scratch"] = r.scratch;
    d["logits"] = r.logits;
    d["overhead"] = r.overhead;
    d["n_ctx"] = r.n_ctx;
    d["fit_steps"] = r.fit_steps;
    d["text"] = r.text;
    d["json"] = r.json;
    return d;
}

nb::dict completion_dict(const fitllm::Completion& c) {
    nb::dict d;
    d["text"] = c.text;
    d["tokens"] = c.tokens;
    d["finish_reason"] = std::string(fitllm::finish_reason_name(c.finish_reason));
    d["n_prompt"] = c.n_prompt;
    d["n_prompt_fed"] = c.n_prompt_fed;
    d["prompt_seconds"] = c.prompt_seconds;
    d["generate_seconds"] = c.generate_seconds;
    return d;
}

fitllm::GenerateOptions generate_options(int max_tokens, float temperature, int top_k, float top_p, float min_p,
                                         float repeat_penalty, std::optional<uint64_t> seed,
                                         std::vector<std::string> stop) {
    fitllm::GenerateOptions o;
    o.max_tokens = max_tokens;
    o.sampling.temperature = temperature;
    o.sampling.top_k = top_k;
    o.sampling.top_p = top_p;
    o.sampling.min_p = min_p;
    o.sampling.repeat_penalty = repeat_penalty;
    o.sampling.seed = seed;
    o.stop = std::move(stop);
    return o;
}

std::vector<fitllm::ChatMessage> chat_messages(const nb::list& messages) {
    std::vector<fitllm::ChatMessage> out;
    for (nb::handle m : messages) {
        out.push_back({nb::cast<std::string>(m["role"]), nb::cast<std::string>(m["content"])});
    }
    return out;
}

}  // namespace

NB_MODULE(_fitllm, m) {
    m.doc() = "fitllm's C++ API (include/fitllm/fitllm.h); use the fitllm package";
    nb::register_exception_translator(translate);
    m.attr("__version__") = fitllm::kVersion;
    m.def(
        "parse_size", [](std::string_view text) { return fitllm::parse_size(text); }, "text"_a);

    nb::class_<fitllm::Generation>(m, "Generation")
        .def(
            "next",
            [](fitllm::Generation& g) {
                nb::gil_scoped_release release;
                return g.next();
            },
            "the next piece of text, or None at the end")
        .def("cancel", &fitllm::Generation::cancel)
        .def_prop_ro("done", &fitllm::Generation::done)
        .def("result", [](const fitllm::Generation& g) { return completion_dict(g.result()); });

    nb::class_<fitllm::Engine>(m, "Engine")
        .def_static(
            "load",
            [](const std::string& path, uint64_t mem, bool fit, bool mlock, int stream_layers,
               const std::string& device, int n_gpu_layers, uint64_t vram, int n_ctx, int n_seq, int n_batch,
               const std::string& type_k, const std::string& type_v, bool kv_rotation, bool context_shift, int n_keep,
               int n_threads) {
                fitllm::LoadConfig load{
                    .model_path = path, .mem = mem, .fit = fit, .mlock = mlock, .stream_layers = stream_layers};
                load.offload.device = device;
                load.offload.n_gpu_layers = n_gpu_layers;
                load.offload.vram = vram;
                fitllm::ContextConfig context{.n_ctx = n_ctx,
                                              .n_seq = n_seq,
                                              .n_batch = n_batch,
                                              .type_k = fitllm::parse_kv_type(type_k),
                                              .type_v = fitllm::parse_kv_type(type_v),
                                              .kv_rotation = kv_rotation,
                                              .context_shift = context_shift,
                                              .n_keep = n_keep,
                                              .n_threads = n_threads};
                nb::gil_scoped_release release;
                return fitllm::Engine::load(load, context);
            },
            "path"_a, "mem"_a, "fit"_a, "mlock"_a, "stream_layers"_a, "device"_a, "n_gpu_layers"_a, "vram"_a, "n_ctx"_a,
            "n_seq"_a, "n_batch"_a, "type_k"_a, "type_v"_a, "kv_rotation"_a, "context_shift"_a, "n_keep"_a,
            "n_threads"_a)
        .def("plan", [](const fitllm::Engine& e) { return plan_dict(e.plan()); })
        .def_prop_ro("architecture", &fitllm::Engine::architecture)
        .def_prop_ro("n_vocab", &fitllm::Engine::n_vocab)
        .def_prop_ro("n_ctx", [](const fitllm::Engine& e) { return e.context().n_ctx; })
        .def_prop_ro("n_ctx_train", &fitllm::Engine::n_ctx_train)
        .def_prop_ro("chat_template_source", &fitllm::Engine::chat_template_source)
        .def("tokenize", &fitllm::Engine::tokenize, "text"_a, "add_special"_a = true, "parse_special"_a = false)
        .def(
            "detokenize",
            [](const fitllm::Engine& e, const std::vector<int32_t>& tokens) { return e.detokenize(tokens); },
            "tokens"_a)
        .def(
            "apply_chat_template",
            [](const fitllm::Engine& e, const nb::list& messages, bool add_generation_prompt) {
                return e.apply_chat_template(chat_messages(messages), add_generation_prompt);
            },
            "messages"_a, "add_generation_prompt"_a = true)
        .def(
            "start",
            [](fitllm::Engine& e, const std::string& prompt, int max_tokens, float temperature, int top_k, float top_p,
               float min_p, float repeat_penalty, std::optional<uint64_t> seed, std::vector<std::string> stop,
               bool add_special, bool parse_special) {
                fitllm::GenerateOptions o = generate_options(max_tokens, temperature, top_k, top_p, min_p,
                                                             repeat_penalty, seed, std::move(stop));
                o.add_special = add_special;
                o.parse_special = parse_special;
                nb::gil_scoped_release release;
                return e.start(prompt, o);
            },
            "prompt"_a, "max_tokens"_a, "temperature"_a, "top_k"_a, "top_p"_a, "min_p"_a, "repeat_penalty"_a,
            "seed"_a.none(), "stop"_a, "add_special"_a, "parse_special"_a, nb::keep_alive<0, 1>())
        .def(
            "generate_parallel",
            [](fitllm::Engine& e, const std::string& prompt, int n, int max_tokens, float temperature, int top_k,
               float top_p, float min_p, float repeat_penalty, std::optional<uint64_t> seed,
               std::vector<std::string> stop) {
                const fitllm::GenerateOptions o = generate_options(max_tokens, temperature, top_k, top_p, min_p,
                                                                   repeat_penalty, seed, std::move(stop));
                std::vector<fitllm::Completion> r;
                {
                    nb::gil_scoped_release release;
                    r = e.generate_parallel(prompt, n, o);
                }
                nb::list out;
                for (const fitllm::Completion& c : r) out.append(completion_dict(c));
                return out;
            },
            "prompt"_a, "n"_a, "max_tokens"_a, "temperature"_a, "top_k"_a, "top_p"_a, "min_p"_a, "repeat_penalty"_a,
            "seed"_a.none(), "stop"_a)
        .def(
            "perplexity",
            [](fitllm::Engine& e, const std::string& text, int n_ctx, int n_chunks, int n_batch, int n_seq) {
                fitllm::PerplexityResult r;
                {
                    nb::gil_scoped_release release;
                    r = e.perplexity(text, {.n_ctx = n_ctx, .n_chunks = n_chunks, .n_batch = n_batch, .n_seq = n_seq});
                }
                nb::dict d;
                d["ppl"] = r.ppl;
                d["ppl_error"] = r.ppl_error;
                d["n_chunks"] = r.n_chunks;
                d["n_scored"] = r.n_scored;
                return d;
            },
            "text"_a, "n_ctx"_a, "n_chunks"_a, "n_batch"_a, "n_seq"_a)
        .def("memory", [](const fitllm::Engine& e) {
            const fitllm::MemoryReport r = e.memory();
            nb::list devices;
            for (const fitllm::DeviceUsage& d : r.devices) {
                nb::list pools;
                for (const fitllm::PoolUsage& p : d.pools) {
                    nb::dict pd;
                    pd["name"] = p.name;
                    pd["used"] = p.used;
                    pd["peak"] = p.peak;
                    pools.append(pd);
                }
                nb::dict dd;
                dd["name"] = d.name;
                dd["capacity"] = d.capacity;
                dd["used"] = d.used;
                dd["peak"] = d.peak;
                dd["pools"] = pools;
                devices.append(dd);
            }
            nb::dict out;
            out["devices"] = devices;
            out["plan_total"] = r.plan_total;
            out["peak_rss"] = r.peak_rss;
            return out;
        });
}
