#include "server/api_error.h"

#include <algorithm>

namespace fitllm::server {

ApiError ApiError::invalid(const std::string& message, std::string code, std::optional<std::string> param) {
    return ApiError(400, "invalid_request_error", std::move(code), message, std::move(param));
}

namespace {

// A field name as the message shows it: as it is, or JSON-escaped and quoted when it holds a
// control character (a NUL would end the message's C string).
std::string printable(const std::string& name) {
    const bool plain = !name.empty() && std::none_of(name.begin(), name.end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x20 || c == 0x7F;
    });
    return plain ? name : nlohmann::json(name).dump();
}

}  // namespace

ApiError ApiError::unsupported(const std::string& param, const std::string& why) {
    return ApiError(400, "invalid_request_error", "unsupported_parameter", printable(param) + ": " + why, param);
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
