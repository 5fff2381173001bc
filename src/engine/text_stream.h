#pragma once
// The text of generated tokens as it completes: a detokenizer (whole UTF-8 characters, cleaned
// spaces) and stop strings, whose possible beginnings are held back until the next tokens say
// whether they end the generation. The scheduler's requests and the public API's generations
// both stream their text through one.
//
//   TextStream text(tokenizer, {"\n\n"});
//   send(text.feed(id));            // for each generated token that is not end-of-generation
//   if (text.stopped()) ...         // a stop string came: the text before it was the last piece
//   send(text.finish());            // at the end: what was held back
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/detokenizer.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::engine {

class TextStream {
public:
    // Throws std::invalid_argument for an empty stop string. The tokenizer must outlive the stream.
    TextStream(const tokenizer::Tokenizer& tokenizer, std::vector<std::string> stop);

    // The text this token completes that cannot be the start of a stop string. When a stop string
    // appears, the text before it is returned, stopped() becomes true and the rest is dropped.
    std::string feed(int32_t id);
    bool stopped() const { return stopped_; }
    // What is held back (and the detokenizer's incomplete bytes), unless stopped; the stream is
    // then empty.
    std::string finish();

private:
    tokenizer::Detokenizer detok_;
    std::vector<std::string> stop_;
    std::string held_;
    bool stopped_ = false;
};

}  // namespace fitllm::engine
