#pragma once
// The one exception type that crosses module boundaries. Modules derive their own
// (gguf::FormatError, io::IoError, ...) so callers can catch precisely or broadly.
#include <stdexcept>
#include <string>

namespace fitllm {

class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

}  // namespace fitllm
