// Byte-level BPE (GPT-2 style), as llama.cpp's llm_tokenizer_bpe_session does it: pre-tokenize,
// write each piece's bytes as GPT-2 code points, then merge adjacent symbols lowest merge rank
// first (leftmost on ties) until no listed pair is left, and look the symbols up.
#include <algorithm>
#include <string>
#include <vector>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/segmenter.h"
#include "tokenizer/unicode.h"

namespace fitllm::tokenizer {
namespace {

// One symbol of the word being merged: a byte range of it, linked to its live neighbours.
struct Symbol {
    size_t offset;
    size_t length;  // 0 once merged into its left neighbour
    int prev;
    int next;  // -1 at either end
};

struct CandidateMerge {
    int rank;
    int left;
    int right;
    size_t length;  // left + right bytes when queued; differs later if either side changed
};

// Heap order: the lowest rank on top, then the leftmost pair.
bool comes_later(const CandidateMerge& a, const CandidateMerge& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
}

class BpeSegmenter final : public Segmenter {
public:
    BpeSegmenter(const Vocab& vocab, PreTokenizerType type)
        : vocab_(vocab), pre_tokenizer_(type), ignore_merges_(vocab.ignore_merges()) {}

    void tokenize(std::string_view fragment, std::vector<TokenId>& out) const override {
        const std::string text = reencode_utf8_leniently(fragment);
        std::vector<std::string_view> words;
        pre_tokenizer_.split(text, words);
        WordState state;
        for (const std::string_view word : words) {
            state.encoded = bytes_to_gpt2_unicode(word);
            encode_word(state, out);
        }
    }

private:
    // Scratch reused from word to word within one tokenize() call.
    struct WordState {
        std::string encoded;
        std::vector<Symbol> symbols;
        std::vector<CandidateMerge> queue;
    };

    void encode_word(WordState& state, std::vector<TokenId>& out) const {
        const std::string_view word = state.encoded;
        if (word.empty()) return;
        if (ignore_merges_) {
            const TokenId whole = vocab_.find(word);
            if (whole != kNoToken) {
                out.push_back(whole);
                return;
            }
        }

        auto& symbols = state.symbols;
        symbols.clear();
        for (size_t offset = 0; offset < word.size();) {
            const size_t length =
                std::min(utf8_length_from_lead_byte(static_cast<uint8_t>(word[offset])), word.size() - offset);
            const int index = static_cast<int>(symbols.size());
            symbols.push_back({offset, length, index - 1, offset + length == word.size() ? -1 : index + 1});
            offset += length;
        }

        auto& queue = state.queue;
        queue.clear();
        for (int i = 1; i < static_cast<int>(symbols.size()); ++i) queue_merge(word, symbols, i - 1, i, queue);

        while (!queue.empty()) {
            std::pop_heap(queue.begin(), queue.end(), comes_later);
            const CandidateMerge merge = queue.back();
            queue.pop_back();
            Symbol& left = symbols[static_cast<size_t>(merge.left)];
            Symbol& right = symbols[static_cast<size_t>(merge.right)];
            // Stale when either side has been merged away or has grown since the pair was queued.
            if (left.length == 0 || right.length == 0 || left.length + right.length != merge.length) continue;
            left.length += right.length;
            right.length = 0;
            left.next = right.next;
            if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = merge.left;
            queue_merge(word, symbols, left.prev, merge.left, queue);
            queue_merge(word, symbols, merge.left, left.next, queue);
        }

        for (int i = 0; i != -1; i = symbols[static_cast<size_t>(i)].next) {
            const Symbol& symbol = symbols[static_cast<size_t>(i)];
            const std::string_view text = word.substr(symbol.offset, symbol.length);
            const TokenId id = vocab_.find(text);
            if (id != kNoToken) {
                out.push_back(id);
                continue;
            }
            // A symbol the vocabulary lacks: llama.cpp looks each of its bytes up as a one-byte
            // token text and drops those it cannot find (so only ASCII survives; there is no <unk>).
            for (size_t b = 0; b < text.size(); ++b) {
                const TokenId byte_id = vocab_.find(text.substr(b, 1));
                if (byte_id != kNoToken) out.push_back(byte_id);
            }
        }
    }

    void queue_merge(std::string_view word, const std::vector<Symbol>& symbols, int left, int right,
                     std::vector<CandidateMerge>& queue) const {
        if (left < 0 || right < 0) return;
        const Symbol& l = symbols[static_cast<size_t>(left)];
        const Symbol& r = symbols[static_cast<size_t>(right)];
        const int rank = vocab_.merge_rank(word.substr(l.offset, l.length), word.substr(r.offset, r.length));
        if (rank < 0) return;
        queue.push_back({rank, left, right, l.length + r.length});
        std::push_heap(queue.begin(), queue.end(), comes_later);
    }

    const Vocab& vocab_;  // owned by the Tokenizer, which outlives its segmenter
    PreTokenizer pre_tokenizer_;
    bool ignore_merges_;
};

}  // namespace

std::unique_ptr<Segmenter> make_bpe_segmenter(const Vocab& vocab) {
    return std::make_unique<BpeSegmenter>(vocab, pre_tokenizer_type_for_name(vocab.pre()));
}

}  // namespace fitllm::tokenizer
