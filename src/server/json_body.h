#pragma once
// A request's JSON body, checked before it is built: a first pass (nlohmann's SAX parser, which
// builds nothing) rejects malformed text of every kind (syntax, invalid UTF-8, numbers that
// overflow a double, nesting deeper than max_depth) and bounds the memory the parsed value will
// take, so that memory can be charged to the budget before it is allocated.
//
//   JsonBody body(req.body);                                  // or ApiError 400 invalid_json
//   memory::Charge c = request_memory.charge(body.memory_bound(), "the request's JSON");
//   nlohmann::json value = body.parse();
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

namespace fitllm::server {

// Deeper than any request of the API needs ({"messages": [{"content": [{"text": ...}]}]} is 4).
inline constexpr int kMaxJsonDepth = 64;

class JsonBody {
public:
    // Throws ApiError (400, code invalid_json) naming what is wrong and where.
    explicit JsonBody(std::string_view text, int max_depth = kMaxJsonDepth);

    // The heap bytes the parsed value takes at most (libstdc++'s containers and glibc's chunks,
    // growth and the parser's buffers included).
    uint64_t memory_bound() const { return memory_bound_; }
    int depth() const { return depth_; }
    nlohmann::json parse() const;

private:
    std::string_view text_;
    uint64_t memory_bound_ = 0;
    int depth_ = 0;
};

}  // namespace fitllm::server
