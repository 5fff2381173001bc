#include "server/api_error.h"

namespace fitllm::server {

ApiError ApiError::invalid(const std::string& message, std::string code) {
    return ApiError(400, "invalid_request_error", std::move(code), message);
}

nlohmann::json ApiError::body() const {
    return error_body(what(), type_, code_);
}

nlohmann::json error_body(const std::string& message, const std::string& type, const std::string& code) {
    return {{"error", {{"message", message}, {"type", type}, {"code", code}}}};
}

}  // namespace fitllm::server
