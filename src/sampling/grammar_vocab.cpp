// GrammarVocab from a tokenizer, apart from grammar.cpp so that the grammar engine itself needs
// no tokenizer (the fuzz targets build it alone).
#include "sampling/grammar.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::sampling {

std::shared_ptr<const GrammarVocab> GrammarVocab::from_tokenizer(const tokenizer::Tokenizer& tokenizer) {
    const auto n = static_cast<int32_t>(tokenizer.vocab().size());
    std::vector<std::string> texts(static_cast<size_t>(n));
    std::vector<std::pair<std::string, int32_t>> specials;
    for (int32_t id = 0; id < n; ++id) {
        texts[size_t(id)] = tokenizer.token_to_piece(id, /*special=*/false);
        if (tokenizer.vocab().is_control(id) || tokenizer.vocab().is_user_defined(id))
            specials.emplace_back(tokenizer.vocab().text(id), id);
    }
    return std::make_shared<GrammarVocab>(texts, tokenizer.vocab().eog_tokens(), std::move(specials));
}

}  // namespace fitllm::sampling
