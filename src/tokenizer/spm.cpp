// SentencePiece BPE as llama.cpp runs it (llm_tokenizer_spm): start from one symbol per UTF-8
// character and keep merging the adjacent pair whose concatenation is the highest-scoring token
// (ties: leftmost first); what never became a token falls back to byte tokens (<0xNN>).
// The Tokenizer has already turned spaces into U+2581 and added any leading space.
#include <queue>

#include "tokenizer/segmenter.h"
#include "tokenizer/unicode.h"

namespace fitllm::tokenizer {
namespace {

struct Symbol {
    int prev;
    int next;
    size_t offset;  // into the fragment
    size_t length;  // 0 once merged into its left neighbour
};

struct Bigram {
    int left;
    int right;
    float score;
    size_t length;  // of the merged text, to spot pairs made stale by other merges
};

// Highest score on top; among equal scores the leftmost pair.
struct LowerPriority {
    bool operator()(const Bigram& a, const Bigram& b) const {
        return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
};

class SpmSegmenter final : public Segmenter {
public:
    explicit SpmSegmenter(const Vocab& vocab) : vocab_(vocab) {}

    void tokenize(std::string_view fragment, std::vector<TokenId>& out) const override {
        std::vector<Symbol> symbols;
        symbols.reserve(fragment.size());
        for (size_t offset = 0; offset < fragment.size();) {
            // llama.cpp trusts the lead byte (unicode_len_utf8), clamped to the text's end.
            const size_t length =
                std::min(utf8_length_from_lead_byte(static_cast<uint8_t>(fragment[offset])), fragment.size() - offset);
            const int index = static_cast<int>(symbols.size());
            symbols.push_back({index - 1, offset + length == fragment.size() ? -1 : index + 1, offset, length});
            offset += length;
        }

        std::vector<Bigram> storage;
        storage.reserve(symbols.size());
        std::priority_queue<Bigram, std::vector<Bigram>, LowerPriority> queue(LowerPriority{}, std::move(storage));
        auto try_add_bigram = [&](int left, int right) {
            if (left < 0 || right < 0) return;
            const Symbol& l = symbols[static_cast<size_t>(left)];
            const Symbol& r = symbols[static_cast<size_t>(right)];
            const std::string_view text = fragment.substr(l.offset, l.length + r.length);
            const TokenId id = vocab_.find(text);
            if (id == kNoToken) return;
            queue.push({left, right, vocab_.score(id), text.size()});
        };
        for (size_t i = 1; i < symbols.size(); ++i) try_add_bigram(static_cast<int>(i - 1), static_cast<int>(i));

        while (!queue.empty()) {
            const Bigram bigram = queue.top();
            queue.pop();
            Symbol& left = symbols[static_cast<size_t>(bigram.left)];
            Symbol& right = symbols[static_cast<size_t>(bigram.right)];
            if (left.length == 0 || right.length == 0 || left.length + right.length != bigram.length) continue;
            left.length += right.length;
            right.length = 0;
            left.next = right.next;
            if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = bigram.left;
            try_add_bigram(left.prev, bigram.left);
            try_add_bigram(bigram.left, left.next);
        }

        for (int i = symbols.empty() ? -1 : 0; i != -1; i = symbols[static_cast<size_t>(i)].next) {
            const Symbol& symbol = symbols[static_cast<size_t>(i)];
            const std::string_view text = fragment.substr(symbol.offset, symbol.length);
            const TokenId id = vocab_.find(text);
            if (id != kNoToken) {
                out.push_back(id);
                continue;
            }
            // Merges only ever make tokens, so this is one character the vocabulary lacks:
            // spelled as byte tokens (<0xNN>). llama.cpp has no answer for a vocabulary without
            // them (it throws); the unknown token, once per character, is what SentencePiece gives.
            const size_t first_byte = out.size();
            bool all_bytes = true;
            for (char byte : text) {
                const TokenId byte_id = vocab_.byte_token(static_cast<uint8_t>(byte));
                all_bytes = all_bytes && byte_id != kNoToken;
                out.push_back(byte_id);
            }
            if (!all_bytes) {
                out.resize(first_byte);
                if (vocab_.special().unk == kNoToken)
                    throw VocabError(
                        "SPM: the vocabulary has neither byte tokens (<0xNN>) nor an unknown token "
                        "for a character it lacks");
                out.push_back(vocab_.special().unk);
            }
        }
    }

private:
    const Vocab& vocab_;
};

}  // namespace

std::unique_ptr<Segmenter> make_spm_segmenter(const Vocab& vocab) {
    return std::make_unique<SpmSegmenter>(vocab);
}

}  // namespace fitllm::tokenizer
