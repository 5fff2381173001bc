#include "server/json_body.h"

#include <vector>

#include "server/api_error.h"

namespace fitllm::server {
namespace {

using nlohmann::json;

// What glibc's malloc takes for a request of n bytes: 8 bytes of header, 16-byte steps, 32 at least.
uint64_t chunk(uint64_t n) {
    return std::max<uint64_t>(32, (n + 8 + 15) / 16 * 16);
}
// A std::string's heap (libstdc++ keeps up to 15 bytes inside the object).
uint64_t string_heap(uint64_t length) {
    return length > 15 ? chunk(length + 1) : 0;
}

// What a parsed value costs (libstdc++, 64-bit), for the bound:
constexpr uint64_t kRoot = 16;         // the top value (sizeof(json))
constexpr uint64_t kArraySlot = 48;    // an element: 16 bytes in a vector that grows by doubling (the
                                       // old and new storage both live while it grows)
constexpr uint64_t kArray = 32;        // the std::vector the value points to
constexpr uint64_t kObject = 64;       // the std::map the value points to
constexpr uint64_t kMember = 96;       // a map node: 32 of tree links, the key std::string, the value
constexpr uint64_t kStringValue = 48;  // the std::string the value points to
constexpr uint64_t kFixed = 4096;      // the parser's own state

// "[json.exception.parse_error.101] parse error at ..." -> "parse error at ...".
std::string without_prefix(const char* what) {
    std::string s = what;
    if (s.rfind("[json.exception.", 0) == 0) {
        const size_t end = s.find("] ");
        if (end != std::string::npos) s.erase(0, end + 2);
    }
    return s;
}

class Measure : public nlohmann::json_sax<json> {
public:
    explicit Measure(int max_depth) : max_depth_(max_depth) {}

    bool null() override { return value(0); }
    bool boolean(bool) override { return value(0); }
    bool number_integer(number_integer_t) override { return value(0); }
    bool number_unsigned(number_unsigned_t) override { return value(0); }
    bool number_float(number_float_t, const string_t&) override { return value(0); }
    bool string(string_t& s) override {
        longest_ = std::max<uint64_t>(longest_, s.size());
        return value(kStringValue + string_heap(s.size()));
    }
    bool binary(binary_t&) override { return value(0); }  // JSON text has none
    bool start_object(std::size_t) override { return open(false, kObject); }
    bool key(string_t& k) override {
        longest_ = std::max<uint64_t>(longest_, k.size());
        bytes_ += kMember + string_heap(k.size());
        return true;
    }
    bool end_object() override { return close(); }
    bool start_array(std::size_t) override { return open(true, kArray); }
    bool end_array() override { return close(); }
    bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
        if (error_.empty()) {
            error_ = "the request body is not valid JSON (at byte " + std::to_string(position) +
                     "): " + without_prefix(e.what());
        }
        return false;
    }

    const std::string& error() const { return error_; }
    int depth() const { return max_seen_; }
    // The values, the lexer's buffer and the string it is copied into while one is read.
    uint64_t bound() const { return kFixed + bytes_ + 2 * string_heap(longest_); }

private:
    bool value(uint64_t own) {
        bytes_ += own + (stack_.empty() ? kRoot : stack_.back() ? kArraySlot : 0);
        return true;
    }
    bool open(bool array, uint64_t own) {
        value(own);
        if (static_cast<int>(stack_.size()) >= max_depth_) {
            error_ = "the request body is not valid JSON here: it nests deeper than " + std::to_string(max_depth_) +
                     " levels";
            return false;
        }
        stack_.push_back(array);
        max_seen_ = std::max(max_seen_, static_cast<int>(stack_.size()));
        return true;
    }
    bool close() {
        if (!stack_.empty()) stack_.pop_back();
        return true;
    }

    const int max_depth_;
    std::vector<bool> stack_;  // true: an array
    int max_seen_ = 0;
    uint64_t bytes_ = 0;
    uint64_t longest_ = 0;
    std::string error_;
};

}  // namespace

JsonBody::JsonBody(std::string_view text, int max_depth) : text_(text) {
    if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
        throw ApiError::invalid("the request body is empty: expected a JSON object", "invalid_json");
    }
    Measure measure(max_depth);
    bool ok = false;
    try {
        ok = json::sax_parse(text.begin(), text.end(), &measure);
    } catch (const json::exception& e) {  // the SAX parser reports through parse_error; to be sure
        throw ApiError::invalid("the request body is not valid JSON: " + without_prefix(e.what()), "invalid_json");
    }
    if (!ok) {
        throw ApiError::invalid(measure.error().empty() ? "the request body is not valid JSON" : measure.error(),
                                "invalid_json");
    }
    memory_bound_ = measure.bound();
    depth_ = measure.depth();
}

json JsonBody::parse() const {
    try {
        return json::parse(text_.begin(), text_.end());
    } catch (const json::exception& e) {
        throw ApiError::invalid("the request body is not valid JSON: " + without_prefix(e.what()), "invalid_json");
    }
}

}  // namespace fitllm::server
