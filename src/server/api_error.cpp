#include "server/api_error.h"

namespace fitllm::server {

ApiError ApiError::invalid(const std::string& message, std::string code, std::optional<std::string> param) {
    return ApiError(400, "invalid_request_error", std::move(code), message, std::move(param));
}

ApiError ApiError::unsupported(const std::string& param, const std::string& why) {
    return ApiError(400, "invalid_request_error", "unsupported_parameter", param + ": " + why, param);
}

nlohmann::json ApiError::body() const {
    return error_body(what(), type_, code_, param_);
}

nlohmann::json error_body(const std::string& message, const std::string& type, const std::string& code,
                          const std::optional<std::string>& param) {
    return {{"error",
             {{"message", message},
              {"type", type},
              {"param", param ? nlohmann::json(*param) : nlohmann::json(nullptr)},
              {"code", code}}}};
}

}  // namespace fitllm::server
