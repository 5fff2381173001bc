#include "server/endpoints.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <optional>
#include <random>

#include "chat/chat_template.h"
#include "chat/template_error.h"
#include "engine/job.h"
#include "memory/budget.h"
#include "sampling/grammar.h"
#include "server/api_error.h"
#include "server/chat_output.h"
#include "server/chat_request.h"
#include "server/completion.h"
#include "server/json_body.h"
#include "server/model_settings.h"
#include "server/prompt_bounds.h"
#include "server/request.h"
#include "server/request_memory.h"

namespace fitllm::server {

namespace {

using nlohmann::json;

std::string random_id(const char* prefix) {
    static std::atomic<uint64_t> counter{0};
    thread_local std::mt19937_64 rng(std::random_device{}());
    char buf[40];
    std::snprintf(buf, sizeof buf, "%s%012llx%04llx", prefix,
                  static_cast<unsigned long long>(rng() & 0xffffffffffffULL),
                  static_cast<unsigned long long>(counter.fetch_add(1) & 0xffff));
    return buf;
}

// The usage of n choices: the prompt once (its cached tokens: what the prompt cache gave the
// first choice; the others share the first's cells), the tokens generated summed.
json usage_json(const Job::Update& first, int n_generated) {
    return {{"prompt_tokens", first.n_prompt},
            {"completion_tokens", n_generated},
            {"total_tokens", first.n_prompt + n_generated},
            {"prompt_tokens_details", {{"cached_tokens", first.n_cached}}}};
}

json finish_reason_json(FinishReason r) {
    if (r == FinishReason::stop || r == FinishReason::length) return finish_reason_name(r);
    return nullptr;
}

// A token's text as the answer spells it, and its bytes (a token may hold part of a character).
json token_json(const LoadedModel& m, int32_t id, float logprob) {
    const std::string piece = m.tokenizer().token_to_piece(id, /*special=*/false);
    json bytes = json::array();
    for (const char ch : piece) bytes.push_back(static_cast<unsigned char>(ch));
    return {{"token", piece}, {"logprob", logprob}, {"bytes", bytes}};
}

// The logprobs of a choice: chat's {"content": [...], "refusal": null}, a text completion's
// {"tokens", "token_logprobs", "top_logprobs", "text_offset"} (offsets into the generated text);
// null when none were asked for.
json logprobs_json(const Completion& c, const std::vector<engine::TokenLogprob>& entries, size_t text_offset = 0) {
    if (c.top_logprobs < 0) return nullptr;
    const LoadedModel& m = *c.model;
    if (c.chat) {
        json content = json::array();
        for (const engine::TokenLogprob& e : entries) {
            json t = token_json(m, e.id, e.logprob);
            json top = json::array();
            for (const auto& [id, lp] : e.top) top.push_back(token_json(m, id, lp));
            t["top_logprobs"] = std::move(top);
            content.push_back(std::move(t));
        }
        return {{"content", std::move(content)}, {"refusal", nullptr}};
    }
    json tokens = json::array(), token_logprobs = json::array(), top_logprobs = json::array(), offsets = json::array();
    for (const engine::TokenLogprob& e : entries) {
        const std::string piece = m.tokenizer().token_to_piece(e.id, /*special=*/false);
        tokens.push_back(piece);
        token_logprobs.push_back(e.logprob);
        json top = json::object();
        for (const auto& [id, lp] : e.top) top[m.tokenizer().token_to_piece(id, false)] = lp;
        top_logprobs.push_back(std::move(top));
        offsets.push_back(text_offset);
        text_offset += piece.size();
    }
    return {{"tokens", std::move(tokens)},
            {"token_logprobs", std::move(token_logprobs)},
            {"top_logprobs", std::move(top_logprobs)},
            {"text_offset", std::move(offsets)}};
}

// One event of a stream: choice `index`'s text so far in this update, or its end.
json stream_chunk(const Completion& c, size_t index, const std::string& text, bool first, const json& finish,
                  const json& logprobs = nullptr) {
    json choice = {{"index", index}, {"finish_reason", finish}};
    if (c.chat) {
        json delta = json::object();
        if (first) delta["role"] = "assistant";
        if (!text.empty() || (first && finish.is_null())) delta["content"] = text;
        choice["delta"] = delta;
    } else {
        choice["text"] = text;
    }
    choice["logprobs"] = logprobs;
    return {{"id", c.id},
            {"object", c.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", c.created},
            {"model", c.model->id()},
            {"choices", json::array({choice})}};
}

std::string sse(const json& event) {
    return "data: " + dump_json(event) + "\n\n";
}

// A call's id: the model's own, else a new one (Mistral's templates want 9 letters and digits).
std::string call_id(const Completion& c, const ToolCall& call) {
    if (!call.id.empty()) return call.id;
    if (c.output && c.output->tools == ToolCallFormat::mistral) {
        static constexpr char kAlnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        thread_local std::mt19937_64 rng(std::random_device{}());
        std::string id(9, 'a');
        for (char& ch : id) ch = kAlnum[rng() % (sizeof kAlnum - 1)];
        return id;
    }
    return random_id("call_");
}

// OpenAI's tool_calls; in a stream each carries its index (first: the index of calls[0]).
json tool_calls_json(const Completion& c, const std::vector<ToolCall>& calls, std::optional<size_t> first) {
    json out = json::array();
    for (size_t i = 0; i < calls.size(); ++i) {
        json call = {{"id", call_id(c, calls[i])},
                     {"type", "function"},
                     {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
        if (first) call["index"] = *first + i;
        out.push_back(std::move(call));
    }
    return out;
}

// A stream event of a split chat answer: reasoning_content, content and tool_calls deltas.
json delta_chunk(const Completion& c, size_t index, const OutputDelta& d, bool first, size_t& n_calls,
                 const json& logprobs) {
    json chunk = stream_chunk(c, index, d.content, first, nullptr, logprobs);
    json& delta = chunk["choices"][0]["delta"];
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.calls.empty()) {
        delta["tool_calls"] = tool_calls_json(c, d.calls, n_calls);
        n_calls += d.calls.size();
    }
    return chunk;
}

json whole_choice(const Completion& c, size_t index, const Answer& a) {
    const std::string& text = a.text;
    json choice = {{"index", index}, {"finish_reason", finish_reason_json(a.end.reason)}};
    if (c.chat) {
        // The nullable fields as the OpenAI spec shows them: no refusal, no tool calls.
        choice["message"] = {{"role", "assistant"}, {"content", text}, {"refusal", nullptr}};
        if (c.output) {
            const ParsedOutput p = split_output(text, *c.output);
            json& message = choice["message"];
            message["content"] = p.content.empty() && !p.calls.empty() ? json(nullptr) : json(p.content);
            if (!p.reasoning.empty()) message["reasoning_content"] = p.reasoning;
            if (!p.calls.empty()) {
                message["tool_calls"] = tool_calls_json(c, p.calls, std::nullopt);
                choice["finish_reason"] = "tool_calls";
            }
        }
    } else {
        choice["text"] = text;
    }
    choice["logprobs"] = logprobs_json(c, a.logprobs);
    return choice;
}

json whole_answer(const Completion& c, const std::vector<Answer>& answers) {
    json choices = json::array();
    int n_generated = 0;
    for (size_t i = 0; i < answers.size(); ++i) {
        choices.push_back(whole_choice(c, i, answers[i]));
        n_generated += answers[i].end.n_generated;
    }
    return {{"id", c.id},
            {"object", c.chat ? "chat.completion" : "text_completion"},
            {"created", c.created},
            {"model", c.model->id()},
            {"choices", std::move(choices)},
            {"usage", usage_json(answers.front().end, n_generated)}};
}

// The answer's text is charged in steps of at least this many bytes.
constexpr uint64_t kAnswerChargeStep = 4096;
// What a token's log probability takes in an answer, at most: {"token": "...", "logprob": ...,
// "bytes": [...]} with a token of up to 48 bytes (prompt_bounds.h) is under 400.
constexpr uint64_t kLogprobJsonBytes = 400;

// The error of a whole answer whose text the budget cannot hold (refused is what
// RequestMemory::charge threw): 507 when the text alone is more than the budget holds besides
// the models, else 503 (requests, this one's included, hold the room now; try again).
ApiError answer_over_budget(const memory::Pool& pool, uint64_t bytes, int n_generated, const ApiError& refused) {
    const memory::Device& device = pool.device();
    const uint64_t others = device.live() - pool.live();  // the models' memory
    const uint64_t room = device.capacity() > others ? device.capacity() - others : 0;
    const std::string what =
        "the answer's text grew to " + memory::format_size(bytes) + " after " + std::to_string(n_generated) + " tokens";
    if (bytes > room || refused.status() == 413) {
        return ApiError(507, "insufficient_memory", "answer_too_large",
                        what + ", more than the memory budget holds besides the models (" + memory::format_size(room) +
                            " of " + memory::format_size(device.capacity()) +
                            "); ask for fewer max_tokens or stream the answer",
                        "max_tokens");
    }
    return ApiError(503, "server_busy", "over_budget",
                    what + " and the memory budget has no room for more now (" +
                        memory::format_size(device.available()) + " free of " + memory::format_size(device.capacity()) +
                        ", requests hold " + memory::format_size(pool.live()) + "); try again or stream the answer");
}

ApiError context_exceeded(const BoundedTokens& t, size_t text_bytes, size_t longest, int n_ctx, bool chat) {
    std::string what;
    if (t.by_size) {
        what = "the prompt has " + std::to_string(text_bytes) + " bytes of text, so at least " +
               std::to_string(t.at_least) + " tokens (no token of this model stands for more than " +
               std::to_string(longest) + " bytes)";
    } else {
        what = "the prompt has " + std::string(t.counted_in_pieces ? "about " : "") + std::to_string(t.at_least) +
               " tokens";
    }
    return ApiError::invalid(
        what + "; this model's context is " + std::to_string(n_ctx) + " tokens, which leaves no room to generate",
        "context_length_exceeded", chat ? "messages" : "prompt");
}

}  // namespace

json parse_charged(const HttpRequest& req, RequestMemory& memory, memory::Charge& charge) {
    const JsonBody text(req.body);
    charge = memory.charge(text.memory_bound(), "the request's JSON");
    return text.parse();
}

std::string dump_json(const json& j) {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void set_json(HttpResponse& res, int status, const json& body) {
    res.status = status;
    res.content_type = "application/json";
    res.body = dump_json(body);
}

size_t LongestTokens::of(const std::shared_ptr<LoadedModel>& model) {
    std::lock_guard lock(mutex_);
    auto& [weak, longest] = known_[model->id()];
    if (weak.lock() != model) {
        weak = model;
        longest = longest_token_bytes(model->tokenizer());
    }
    return longest;
}

memory::Pool* Endpoints::request_pool() {
    return &registry_.device().pool(kRequestPool);
}

void Endpoints::tokenize(HttpRequest& req, HttpResponse& res) {
    RequestMemory memory(request_pool());
    memory.note(req.body.size());
    memory::Charge json_charge;
    const json body = parse_charged(req, memory, json_charge);
    if (!body.is_object()) throw ApiError::invalid("the request body: expected a JSON object", "invalid_type");
    const auto content = body.find("content");
    if (content == body.end() || !content->is_string()) {
        throw ApiError::invalid("content: required, a string", "invalid_type", "content");
    }
    auto boolean = [&](const char* name, bool fallback) {
        const auto it = body.find(name);
        if (it == body.end() || it->is_null()) return fallback;
        if (!it->is_boolean()) {
            throw ApiError::invalid(std::string(name) + ": expected a boolean", "invalid_type", name);
        }
        return it->get<bool>();
    };
    const bool add_special = boolean("add_special", false);
    const bool parse_special = boolean("parse_special", true);
    const std::shared_ptr<LoadedModel> m = registry_.acquire(model_field(body));
    const std::string& text = content->get_ref<const std::string&>();
    // Bounded by the body's size; the tokenizer's work and the answer's text are charged.
    const BoundedTokens t =
        tokenize_within(m->tokenizer(), text, add_special, parse_special, SIZE_MAX, /*longest_token=*/0, &memory);
    const memory::Charge answer = memory.charge(t.ids.size() * 12 + 64, "the answer");
    std::string out = "{\"tokens\":[";
    for (size_t i = 0; i < t.ids.size(); ++i) {
        if (i) out += ',';
        out += std::to_string(t.ids[i]);
    }
    out += "]}";
    res.status = 200;
    res.body = std::move(out);
}

void Endpoints::detokenize(HttpRequest& req, HttpResponse& res) {
    RequestMemory memory(request_pool());
    memory.note(req.body.size());
    memory::Charge json_charge;
    const json body = parse_charged(req, memory, json_charge);
    if (!body.is_object()) throw ApiError::invalid("the request body: expected a JSON object", "invalid_type");
    const auto tokens = body.find("tokens");
    if (tokens == body.end() || !tokens->is_array()) {
        throw ApiError::invalid("tokens: required, an array of token ids", "invalid_type", "tokens");
    }
    const std::shared_ptr<LoadedModel> m = registry_.acquire(model_field(body));
    const int n_vocab = m->model().n_vocab();
    // The text is at most the longest token per id, and its JSON escaped at most 6 bytes per byte.
    const size_t longest = std::max<size_t>(longest_.of(m), 64);
    const memory::Charge answer = memory.charge(tokens->size() * (4 + 7 * longest), "the detokenized text");
    std::vector<int32_t> ids;
    ids.reserve(tokens->size());
    for (size_t i = 0; i < tokens->size(); ++i) {
        const json& t = (*tokens)[i];
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= n_vocab) {
            throw ApiError::invalid("tokens[" + std::to_string(i) + "]: " + dump_json(t) +
                                        " is not a token id of this model (0.." + std::to_string(n_vocab - 1) + ")",
                                    "invalid_value", "tokens[" + std::to_string(i) + "]");
        }
        ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    set_json(res, 200, {{"content", m->tokenizer().detokenize(ids, false, false)}});
}

void Endpoints::submit(Completion& c, CompletionRequest& request, RequestMemory& memory) {
    LoadedModel& m = *c.model;
    const int n_ctx = m.scheduler().n_ctx();
    const size_t max_prompt = static_cast<size_t>(n_ctx - 1);
    const size_t longest = longest_.of(c.model);

    std::vector<int32_t> prompt;
    if (request.chat) {
        // Refused by the messages' size before the template renders them.
        size_t bytes = 0;
        for (const auto& message : request.messages) bytes += message["content"].get_ref<const std::string&>().size();
        if (longest > 0 && (bytes + longest - 1) / longest > max_prompt) {
            BoundedTokens t;
            t.over = t.by_size = true;
            t.at_least = (bytes + longest - 1) / longest;
            throw context_exceeded(t, bytes, longest, n_ctx, request.chat);
        }
        std::string text;
        // The render's values are this request's memory too, charged as they grow.
        chat::RenderOptions options = m.render_options();
        options.pool = memory.pool();
        const TemplateTraits traits = prepare_render(request, m.chat_template().tmpl, options);
        force_tool_call(request, traits);
        try {
            text = m.chat_template().tmpl.render(request.messages, options);
        } catch (const chat::TemplateError& e) {
            throw ApiError::invalid(std::string("messages: the model's chat template refused them: ") + e.what(),
                                    "template_error", "messages");
        } catch (const memory::BudgetError& e) {
            throw ApiError(503, "server_busy", "over_budget",
                           std::string("messages: rendering the chat template: ") + e.what() + "; try again");
        }
        request.messages = {};
        c.output = output_options(request, traits, text);
        const memory::Charge rendered = memory.charge(text.size(), "the rendered prompt");
        BoundedTokens t = tokenize_within(m.tokenizer(), text, /*add_special=*/false, /*parse_special=*/true,
                                          max_prompt, longest, &memory);
        if (t.over) throw context_exceeded(t, text.size(), longest, n_ctx, request.chat);
        prompt = std::move(t.ids);
    } else if (request.prompt_is_tokens) {
        prompt = std::move(request.prompt_tokens);
        for (const int32_t id : prompt) {
            if (id >= m.model().n_vocab()) {
                throw ApiError::invalid("prompt: token id " + std::to_string(id) + " is outside the vocabulary (" +
                                            std::to_string(m.model().n_vocab()) + " tokens)",
                                        "invalid_value", "prompt");
            }
        }
        if (prompt.size() > max_prompt) {
            BoundedTokens t;
            t.over = true;
            t.at_least = prompt.size();
            throw context_exceeded(t, 0, longest, n_ctx, request.chat);
        }
    } else {
        BoundedTokens t = tokenize_within(m.tokenizer(), request.prompt, /*add_special=*/true,
                                          /*parse_special=*/true, max_prompt, longest, &memory);
        if (t.over) throw context_exceeded(t, request.prompt.size(), longest, n_ctx, request.chat);
        prompt = std::move(t.ids);
    }
    if (prompt.empty()) {
        throw ApiError::invalid("prompt: no tokens to start from", "invalid_value",
                                request.chat ? "messages" : "prompt");
    }
    for (const auto& [id, bias] : request.params.sampling.logit_bias) {
        if (id >= m.model().n_vocab()) {
            throw ApiError::invalid("logit_bias: token id " + std::to_string(id) + " is outside the vocabulary (" +
                                        std::to_string(m.model().n_vocab()) + " tokens)",
                                    "invalid_value", "logit_bias");
        }
    }
    const int n_prompt = static_cast<int>(prompt.size());
    GenerationParams params = std::move(request.params);
    params.max_tokens = request.max_tokens.value_or(n_ctx - n_prompt);
    const auto n = static_cast<size_t>(request.n);
    if (params.sampling.grammar) {
        // A matcher per choice.
        params.sampling.grammar_vocab = m.scheduler().grammar_vocab();
        // Its token references (<|channel|>) name special tokens of this model.
        for (const std::string& t : params.sampling.grammar->tokens()) {
            if (params.sampling.grammar_vocab->special_token(t) < 0) {
                throw ApiError::invalid("grammar: the token reference " + t +
                                            " names no control or user-defined token of the model's vocabulary",
                                        "invalid_grammar", "grammar");
            }
        }
        c.grammar = memory.charge(
            n * sampling::GrammarMatcher::memory_bound(*params.sampling.grammar, *params.sampling.grammar_vocab),
            n > 1 ? "the grammars of " + std::to_string(n) + " choices" : std::string("the grammar"));
    }
    // Choice i samples with seed + i (a seed asked for), skipping the value that asks for a
    // random one; without a seed each draws its own.
    std::vector<GenerationParams> choices(n, params);
    if (params.sampling.seed != sampling::kRandomSeed) {
        uint64_t seed = params.sampling.seed;
        for (GenerationParams& p : choices) {
            if (seed == sampling::kRandomSeed) ++seed;
            p.sampling.seed = seed++;
        }
    }
    try {
        c.jobs = m.scheduler().submit_group(std::move(prompt), std::move(choices));
    } catch (const QueueFullError& e) {
        throw ApiError(429, "server_busy", "queue_full", e.what());
    } catch (const std::invalid_argument& e) {
        throw ApiError::invalid(std::string("max_tokens: ") + e.what(), "context_length_exceeded", "max_tokens");
    } catch (const sampling::SamplingError& e) {
        throw ApiError::invalid(e.what(), "invalid_value");
    }
}

void Endpoints::send_whole(Completion& c, HttpRequest& req, HttpResponse& res,
                           json (*render)(const Completion&, const std::vector<Answer>&)) {
    const std::optional<std::vector<Answer>> answers = wait_whole(c, req);
    if (!answers) {
        res.status = 499;  // nobody to answer
        return;
    }
    set_json(res, 200, render(c, *answers));
}

std::optional<std::vector<Answer>> Endpoints::wait_whole(Completion& c, HttpRequest& req) {
    // The whole answer once every choice ends, with the status they end with (nothing is sent
    // before); a client that hangs up meanwhile cancels them, which frees their slots before the
    // scheduler's next step. The texts held meanwhile are charged as they grow; when the budget
    // refuses them the jobs are cancelled and the client gets the error instead of a cut answer.
    RequestMemory memory(request_pool());
    std::vector<memory::Charge> text_charges;
    uint64_t charged = 0, held = 0;
    // The log probabilities as the answer will spell them out.
    const uint64_t logprob_bytes = kLogprobJsonBytes * static_cast<uint64_t>(1 + std::max(c.top_logprobs, 0));
    int n_generated = 0;  // by the choices that ended
    std::vector<Answer> answers(c.jobs.size());
    for (size_t i = 0; i < c.jobs.size(); ++i) {
        Answer& a = answers[i];
        while (true) {
            Job::Update u = c.jobs[i]->wait(kPoll);
            if (!u.text.empty() && !c.first_text) c.first_text = std::chrono::steady_clock::now();
            a.text += u.text;
            held += u.text.size() + u.logprobs.size() * logprob_bytes;
            for (engine::TokenLogprob& e : u.logprobs) a.logprobs.push_back(std::move(e));
            if (held > charged) {
                const uint64_t step = std::max<uint64_t>(held - charged, kAnswerChargeStep);
                try {
                    text_charges.push_back(memory.charge(step, "the answer's text"));
                } catch (const ApiError& e) {
                    c.cancel();
                    throw answer_over_budget(*request_pool(), charged + step, n_generated + u.n_generated, e);
                }
                charged += step;
            }
            if (u.finished) {
                finished(c, u, i == 0);
                if (u.reason == FinishReason::error) {
                    c.cancel();
                    throw ApiError(500, "server_error", "generation_failed", "generation failed: " + u.error);
                }
                if (u.reason == FinishReason::cancelled) {
                    c.cancel();
                    throw ApiError(503, "server_error", "cancelled", "the request was cancelled (server stopping)");
                }
                n_generated += u.n_generated;
                a.end = std::move(u);
                break;
            }
            if (req.client_gone()) {
                c.cancel();
                return std::nullopt;
            }
        }
    }
    return answers;
}

void Endpoints::finished(const Completion& c, const Job::Update& u, bool first) {
    registry_.touch(c.model->id());
    metrics_.count_tokens(first ? static_cast<uint64_t>(u.n_prompt) : 0, static_cast<uint64_t>(u.n_generated));
}

void Endpoints::completion(bool chat, HttpRequest& req, HttpResponse& res) {
    auto c = std::make_shared<Completion>();
    c->chat = chat;
    {
        // What the request makes the server hold until its job is submitted, charged.
        RequestMemory memory(request_pool());
        memory.note(req.body.size());
        CompletionRequest request;
        memory::Charge request_charge;
        {
            const JsonBody text(req.body);
            const memory::Charge dom = memory.charge(text.memory_bound(), "the request's JSON");
            request_charge = memory.charge(text.memory_bound(), "the request's fields");  // its copies of the strings
            json body = text.parse();
            // A created model's system prompt and parameters are the request's defaults (as Ollama's /v1).
            apply_created_settings(registry_, body, chat ? Api::OpenAiChat : Api::OpenAiText);
            request = parse_completion_request(body, chat);
            if (!request.schema_pointer.empty()) {
                // The schema again, with its keys in order: properties come as it lists them.
                const memory::Charge ordered = memory.charge(text.memory_bound(), "the request's JSON, in order");
                order_schema_grammar(request, req.body);
            }
        }
        req.free_body();
        c->stream = request.stream;
        c->include_usage = request.include_usage;
        c->top_logprobs = request.params.top_logprobs;
        c->model = registry_.acquire(request.model);
        if (const int slots = c->model->scheduler().context().n_seq; request.n > slots) {
            throw ApiError::invalid("n: " + std::to_string(request.n) + " choices; this server decodes at most " +
                                        std::to_string(slots) +
                                        " sequences together (its -np), so at most that many choices a request",
                                    "invalid_value", "n");
        }
        c->id = random_id(chat ? "chatcmpl-" : "cmpl-");
        c->created = static_cast<int64_t>(std::time(nullptr));
        submit(*c, request, memory);
    }

    if (!c->stream) return send_whole(*c, req, res, whole_answer);

    // Streaming: one event per piece of text as it comes, each naming its choice (index); a
    // client that goes away cancels the jobs, which frees their slots before the scheduler's next
    // step.
    res.status = 200;
    res.content_type = "text/event-stream";
    res.headers.emplace_back("Cache-Control", "no-cache");
    res.stream = [this, c](BodyWriter& out) {
        struct ChoiceStream {
            bool first = true;
            size_t offset = 0;                           // a text completion's text_offset
            std::vector<engine::TokenLogprob> logprobs;  // not sent yet: they go with the next text
            std::optional<OutputSplitter> splitter;      // reasoning and tool calls, split as they come
            size_t n_calls = 0;
            Job::Update last;  // its counts
            bool done = false;
        };
        std::vector<ChoiceStream> choices(c->jobs.size());
        for (ChoiceStream& s : choices) {
            if (c->output) s.splitter.emplace(*c->output);
        }
        while (true) {
            if (out.client_gone()) return c->cancel();
            std::string events;
            bool waited = false, failed = false;
            for (size_t k = 0; k < choices.size() && !failed; ++k) {
                ChoiceStream& s = choices[k];
                if (s.done) continue;
                // The first running choice waits; the others' text of the same steps is there.
                Job::Update u = c->jobs[k]->wait(waited ? std::chrono::milliseconds(0) : kPoll);
                waited = true;
                for (engine::TokenLogprob& e : u.logprobs) s.logprobs.push_back(std::move(e));
                if (s.first && u.pieces.empty()) u.pieces.emplace_back();  // the role comes first
                for (size_t i = 0; i < u.pieces.size(); ++i) {
                    // A token's text a piece, mostly: each piece takes the next token's log
                    // probability, the last piece of the update all that are left.
                    json lp = nullptr;
                    if (!u.pieces[i].empty() && !s.logprobs.empty()) {
                        const size_t n = i + 1 == u.pieces.size() ? s.logprobs.size() : 1;
                        const std::vector<engine::TokenLogprob> some(s.logprobs.begin(), s.logprobs.begin() + n);
                        lp = logprobs_json(*c, some, s.offset);
                        for (const auto& e : some) s.offset += c->model->tokenizer().token_to_piece(e.id, false).size();
                        s.logprobs.erase(s.logprobs.begin(), s.logprobs.begin() + n);
                    }
                    if (s.splitter) {
                        const OutputDelta d = s.splitter->feed(u.pieces[i]);
                        if (d.empty() && lp.is_null() && !s.first) continue;  // held: it may be markup
                        events += sse(delta_chunk(*c, k, d, s.first, s.n_calls, lp));
                    } else {
                        events += sse(stream_chunk(*c, k, u.pieces[i], s.first, nullptr, lp));
                    }
                    s.first = false;
                }
                if (!u.finished) {
                    s.last = std::move(u);
                    continue;
                }
                finished(*c, u, k == 0);
                s.done = true;
                if (u.reason == FinishReason::error || u.reason == FinishReason::cancelled) {
                    events += sse(error_body("generation " + std::string(finish_reason_name(u.reason)) +
                                                 (u.error.empty() ? "" : ": " + u.error),
                                             "server_error", "generation_failed"));
                    failed = true;  // the other choices end with it
                    c->cancel();
                } else {
                    if (s.splitter) {
                        const OutputDelta d = s.splitter->finish();
                        if (!d.empty()) events += sse(delta_chunk(*c, k, d, false, s.n_calls, nullptr));
                    }
                    json end =
                        stream_chunk(*c, k, "", false, finish_reason_json(u.reason),
                                     s.logprobs.empty() ? json(nullptr) : logprobs_json(*c, s.logprobs, s.offset));
                    if (s.n_calls > 0) end["choices"][0]["finish_reason"] = "tool_calls";
                    events += sse(end);
                }
                s.last = std::move(u);
            }
            const bool all_done =
                failed || std::all_of(choices.begin(), choices.end(), [](const ChoiceStream& s) { return s.done; });
            if (all_done) {
                if (c->include_usage) {
                    int n_generated = 0;
                    for (const ChoiceStream& s : choices) n_generated += s.last.n_generated;
                    json usage = stream_chunk(*c, 0, "", false, nullptr);
                    usage["choices"] = json::array();
                    usage["usage"] = usage_json(choices.front().last, n_generated);
                    events += sse(usage);
                }
                events += "data: [DONE]\n\n";
            }
            if (!events.empty() && !out.write(events)) return c->cancel();
            if (all_done) return;
        }
    };
}

}  // namespace fitllm::server
