#include "server/request_memory.h"

#include <malloc.h>

#include "memory/budget.h"
#include "server/api_error.h"

namespace fitllm::server {

RequestMemory::~RequestMemory() {
    if (total_ >= kTrimAfterBytes) malloc_trim(0);
}

memory::Charge RequestMemory::charge(uint64_t bytes, const std::string& what) {
    total_ += bytes;
    if (!pool_ || bytes == 0) return {};
    try {
        return pool_->charge(bytes, what);
    } catch (const memory::BudgetError& e) {
        const memory::Device& device = pool_->device();
        const uint64_t others = device.live() - pool_->live();  // the models' memory
        const uint64_t room = device.capacity() > others ? device.capacity() - others : 0;
        if (bytes > room) {
            throw ApiError(413, "invalid_request_error", "request_too_large",
                           what + " needs " + memory::format_size(bytes) +
                               ", more than the memory budget holds besides the models (" + memory::format_size(room) +
                               " of " + memory::format_size(device.capacity()) + ")");
        }
        throw ApiError(503, "server_busy", "over_budget",
                       what + " needs " + memory::format_size(bytes) +
                           " and other requests hold the memory budget's room now (" +
                           memory::format_size(device.available()) + " free of " +
                           memory::format_size(device.capacity()) + "); try again");
    }
}

}  // namespace fitllm::server
