#pragma once
// An error an HTTP request gets back: the status and an OpenAI-style body,
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens",
//              "code": "context_length_exceeded"}}
// (param: the request field at fault, or null).
//
//   throw ApiError::invalid("messages[1].content: expected a string, got a number", "invalid_type",
//                           "messages[1].content");
//   throw ApiError::unsupported("tools", "tool calling is not implemented");
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "fitllm/error.h"

namespace fitllm::server {

class ApiError : public Error {
public:
    ApiError(int status, std::string type, std::string code, const std::string& message,
             std::optional<std::string> param = std::nullopt)
        : Error(message), status_(status), type_(std::move(type)), code_(std::move(code)), param_(std::move(param)) {}

    // 400 invalid_request_error; code defaults to "invalid_request".
    static ApiError invalid(const std::string& message, std::string code = "invalid_request",
                            std::optional<std::string> param = std::nullopt);
    // 400 invalid_request_error "unsupported_parameter": a field fitllm does not implement (or
    // not with this value); the message is "PARAM: WHY".
    static ApiError unsupported(const std::string& param, const std::string& why);

    int status() const { return status_; }
    const std::string& type() const { return type_; }
    const std::string& code() const { return code_; }
    const std::optional<std::string>& param() const { return param_; }
    nlohmann::json body() const;

private:
    int status_;
    std::string type_, code_;
    std::optional<std::string> param_;
};

// The error body for any status (also for errors that are not ApiErrors).
nlohmann::json error_body(const std::string& message, const std::string& type, const std::string& code,
                          const std::optional<std::string>& param = std::nullopt);

}  // namespace fitllm::server
