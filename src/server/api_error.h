#pragma once
// An error an HTTP request gets back: the status and an OpenAI-style body,
//   {"error": {"message": "...", "type": "invalid_request_error", "code": "context_length_exceeded"}}
//
//   throw ApiError::invalid("messages[1].content: expected a string, got a number");
#include <nlohmann/json.hpp>
#include <string>

#include "fitllm/error.h"

namespace fitllm::server {

class ApiError : public Error {
public:
    ApiError(int status, std::string type, std::string code, const std::string& message)
        : Error(message), status_(status), type_(std::move(type)), code_(std::move(code)) {}

    // 400 invalid_request_error; code defaults to "invalid_request".
    static ApiError invalid(const std::string& message, std::string code = "invalid_request");

    int status() const { return status_; }
    const std::string& type() const { return type_; }
    const std::string& code() const { return code_; }
    nlohmann::json body() const;

private:
    int status_;
    std::string type_, code_;
};

// The error body for any status (also for errors that are not ApiErrors).
nlohmann::json error_body(const std::string& message, const std::string& type, const std::string& code);

}  // namespace fitllm::server
