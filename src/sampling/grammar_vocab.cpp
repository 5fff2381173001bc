// GrammarVocab from a tokenizer, apart from grammar.cpp so that the grammar engine itself needs
// no tokenizer (the fuzz targets build it alone).
#include "sampling/grammar.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::sampling {

std::shared_ptr<const GrammarVocab> GrammarVocab::from_tokenizer(const tokenizer::Tokenizer& tokenizer) {
    const auto n = static_cast<int32_t>(tokenizer.vocab().size());
    std::vector<std::string> texts(static_cast<size_t>(n));
    for (int32_t id = 0; id < n; ++id) texts[size_t(id)] = tokenizer.token_to_piece(id, /*special=*/false);
    return std::make_shared<GrammarVocab>(texts, tokenizer.vocab().eog_tokens());
}

}  // namespace fitllm::sampling
