#pragma once
// The chat page served at GET / (src/server/web/index.html, embedded at build time).
#include <string_view>

namespace fitllm::server {

std::string_view web_page();

}  // namespace fitllm::server
