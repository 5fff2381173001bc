#include "engine/text_stream.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace fitllm::engine {
namespace {

// The length of the longest suffix of text that is a proper prefix of some stop string.
size_t stop_prefix_suffix(const std::string& text, const std::vector<std::string>& stop) {
    size_t best = 0;
    for (const std::string& s : stop) {
        for (size_t n = std::min(s.size() - 1, text.size()); n > best; --n) {
            if (text.compare(text.size() - n, n, s, 0, n) == 0) {
                best = n;
                break;
            }
        }
    }
    return best;
}

}  // namespace

TextStream::TextStream(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop)
    : detok_(tokenizer, /*remove_special=*/false, /*unparse_special=*/false), stop_(std::move(stop)) {
    for (const std::string& s : stop_) {
        if (s.empty()) throw std::invalid_argument("stop: an empty stop string");
    }
}

std::string TextStream::feed(int32_t id) {
    if (stopped_) return {};
    held_ += detok_.feed(id);
    size_t first = std::string::npos;
    for (const std::string& s : stop_) first = std::min(first, held_.find(s));
    if (first != std::string::npos) {
        stopped_ = true;
        std::string out = held_.substr(0, first);
        held_.clear();
        return out;
    }
    const size_t keep = stop_prefix_suffix(held_, stop_);
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

std::string TextStream::finish() {
    std::string out = stopped_ ? std::string() : std::move(held_) + detok_.flush();
    held_.clear();
    return out;
}

}  // namespace fitllm::engine
