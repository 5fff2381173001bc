#pragma once
// The memory one request makes the server hold (its body, the parsed JSON, the rendered prompt,
// the tokenizer's work and the token ids), charged to the "requests" pool of the host device
// (the registry's budget), so that concurrent requests cannot add up past --mem: a request the
// budget has no room for is refused with a clear error instead.
//
//   RequestMemory memory(&registry.device().pool(kRequestPool));
//   memory::Charge c = memory.charge(bytes, "the request's JSON");  // or ApiError 413 / 503
//   ...                                                              // given back when c goes
#include <cstdint>
#include <string>

#include "memory/pool.h"

namespace fitllm::server {

inline constexpr const char* kRequestPool = "requests";
// After a request that charged this much, the heap's free pages go back to the system.
inline constexpr uint64_t kTrimAfterBytes = uint64_t{8} << 20;

class RequestMemory {
public:
    explicit RequestMemory(memory::Pool* pool) : pool_(pool) {}  // nullptr: nothing is charged
    // After a large request, gives the heap's free memory back to the system (malloc_trim), so
    // that what it used does not stay resident. Declare it before what it charges for.
    ~RequestMemory();
    RequestMemory(const RequestMemory&) = delete;
    RequestMemory& operator=(const RequestMemory&) = delete;

    // Charges bytes for `what` until the returned Charge goes. Throws ApiError: 413
    // (request_too_large) when they are more than the budget holds besides the models, 503
    // (over_budget, try again) when other requests hold the room now.
    memory::Charge charge(uint64_t bytes, const std::string& what);
    // The pool it charges (nullptr: none), for what charges as it grows (a chat template's render).
    memory::Pool* pool() const { return pool_; }
    // Counts bytes charged elsewhere (the body, by the transport) towards the trim.
    void note(uint64_t bytes) { total_ += bytes; }

private:
    memory::Pool* pool_;
    uint64_t total_ = 0;
};

}  // namespace fitllm::server
