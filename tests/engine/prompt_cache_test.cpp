// The scheduler's prompt cache (ContextConfig::n_cached_prompts): a request that shares a prefix
// with a finished one computes only the rest, gives the text it gives without the cache, and kept
// prompts give their cells back when requests need them. On the tiny Llama, and on the demo
// model (Gemma 3) for its sliding-window pools.
#include "engine/prompt_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "engine/scheduler.h"
#include "gguf/gguf_reader.h"
#include "model/model.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace fitllm::engine {
namespace {

struct Loaded {
    explicit Loaded(const std::filesystem::path& path)
        : file(gguf::GgufFile::open(path.string())),
          tokenizer(tokenizer::Tokenizer::from_gguf(file)),
          model(model::Model::load(file)) {}
    gguf::GgufFile file;
    tokenizer::Tokenizer tokenizer;
    std::unique_ptr<model::Model> model;
};

GenerationParams greedy(int max_tokens) {
    GenerationParams p;
    p.max_tokens = max_tokens;
    p.sampling.temperature = 0.0f;
    p.top_logprobs = 0;  // the sampled ids come back with the text
    return p;
}

std::vector<int32_t> sampled_ids(const Job::Update& u) {
    std::vector<int32_t> ids;
    for (const TokenLogprob& l : u.logprobs) ids.push_back(l.id);
    return ids;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

// The same tokens with the same log-probabilities, bit for bit (and the same top ones).
void expect_same_logprobs(const Job::Update& got, const Job::Update& want) {
    ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
    for (size_t i = 0; i < want.logprobs.size(); ++i) {
        EXPECT_EQ(got.logprobs[i].id, want.logprobs[i].id) << i;
        EXPECT_EQ(got.logprobs[i].logprob, want.logprobs[i].logprob) << i;
        EXPECT_EQ(got.logprobs[i].top, want.logprobs[i].top) << i;
    }
}

// Waits for the step after a job's end, which publishes the stats and keeps the prompt.
SchedulerStats settled(const Scheduler& s) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while ((!s.idle() || s.stats().n_active != 0) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return s.stats();
}

class PromptCache : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        llama_ = new Loaded(test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf");
        compute_ = new Compute(2);
    }
    static void TearDownTestSuite() {
        delete compute_;
        delete llama_;
    }
    static std::vector<int32_t> ids(const std::string& text, bool bos = true) {
        return llama_->tokenizer.tokenize(text, bos, false);
    }
    static Job::Update without_cache(const std::vector<int32_t>& prompt, int max_tokens, ContextConfig c) {
        c.n_cached_prompts = 0;
        Scheduler s(*llama_->model, llama_->tokenizer, c, {}, *compute_);
        return s.submit(prompt, greedy(max_tokens))->wait_all();
    }
    static Loaded* llama_;
    static Compute* compute_;
};
Loaded* PromptCache::llama_ = nullptr;
Compute* PromptCache::compute_ = nullptr;

TEST_F(PromptCache, AContinuedConversationComputesOnlyItsNewTokens) {
    const ContextConfig c{.n_ctx = 512, .n_seq = 2, .n_batch = 64, .n_cached_prompts = 2};
    Scheduler s(*llama_->model, llama_->tokenizer, c, {}, *compute_);
    const std::vector<int32_t> first = ids("Once upon a time there was a little fox who lived");
    const Job::Update a = s.submit(first, greedy(8))->wait_all();
    ASSERT_EQ(a.n_generated, 8);
    EXPECT_EQ(a.n_cached, 0);
    settled(s);

    // The next turn: the first prompt, its answer and more. The answer's last token was sampled
    // but never fed, so the cache holds all but that one.
    const std::vector<int32_t> next = concat(concat(first, sampled_ids(a)), ids(" and then the fox said", false));
    const Job::Update b = s.submit(next, greedy(8))->wait_all();
    EXPECT_EQ(b.n_cached, static_cast<int>(first.size()) + 7);
    EXPECT_EQ(b.text, without_cache(next, 8, c).text);
    const SchedulerStats st = settled(s);
    EXPECT_EQ(st.n_cache_hits, 1u);
    EXPECT_EQ(st.n_prompt_tokens_cached, first.size() + 7);
    EXPECT_EQ(st.n_prompt_tokens, first.size() + next.size() - (first.size() + 7));
    // The second turn holds all of the first: one prompt kept.
    EXPECT_EQ(st.n_cached_prompts, 1);
    EXPECT_EQ(st.cached_prompt_tokens, static_cast<int>(next.size()) + 7);
}

TEST_F(PromptCache, CachedCellsHoldTheBitsOfARecomputation) {
    // One token per pass in both: the kernels sum in the same order, so the logits after a cached
    // prefix are those of a recomputation, bit for bit.
    const ContextConfig c{.n_ctx = 256, .n_seq = 1, .n_batch = 1, .n_cached_prompts = 1};
    Scheduler s(*llama_->model, llama_->tokenizer, c, {}, *compute_);
    const std::vector<int32_t> first = ids("Once upon a time there was");
    const Job::Update a = s.submit(first, greedy(6))->wait_all();
    const std::vector<int32_t> next = concat(concat(first, sampled_ids(a)), ids(" and so", false));
    GenerationParams p = greedy(8);
    p.top_logprobs = 5;
    const Job::Update b = s.submit(next, p)->wait_all();
    ASSERT_EQ(b.n_cached, static_cast<int>(first.size()) + 5);

    ContextConfig plain = c;
    plain.n_cached_prompts = 0;
    Scheduler fresh(*llama_->model, llama_->tokenizer, plain, {}, *compute_);
    const Job::Update e = fresh.submit(next, p)->wait_all();
    expect_same_logprobs(b, e);
}

TEST_F(PromptCache, TheSamePromptAgainComputesOnlyItsLastToken) {
    const ContextConfig c{.n_ctx = 512, .n_seq = 1, .n_batch = 32, .n_cached_prompts = 1};
    Scheduler s(*llama_->model, llama_->tokenizer, c, {}, *compute_);
    std::string text;
    for (int i = 0; i < 6; ++i) text += "the story goes on and on ";
    const std::vector<int32_t> prompt = ids(text);
    ASSERT_GT(prompt.size(), 32u);  // fed in two chunks the first time
    const Job::Update a = s.submit(prompt, greedy(12))->wait_all();
    const Job::Update b = s.submit(prompt, greedy(12))->wait_all();
    EXPECT_EQ(b.n_cached, static_cast<int>(prompt.size()) - 1);
    EXPECT_EQ(a.text, b.text);
}

TEST_F(PromptCache, ARunningRequestSharesWhatItHasFed) {
    const ContextConfig c{.n_ctx = 1024, .n_seq = 2, .n_batch = 64, .n_cached_prompts = 1};
    Scheduler s(*llama_->model, llama_->tokenizer, c, {}, *compute_);
    std::string text;
    for (int i = 0; i < 8; ++i) text += "a shared system prompt that every request starts with, ";
    const std::vector<int32_t> shared = ids(text);
    GenerationParams long_run = greedy(600);
    long_run.top_logprobs = -1;
    auto first = s.submit(shared, long_run);
    while (first->wait(std::chrono::milliseconds(100)).text.empty() && s.stats().n_generated_tokens == 0) {
    }
    const std::vector<int32_t> second = concat(shared, ids(" and a question of its own", false));
    const Job::Update u = s.submit(second, greedy(8))->wait_all();
    first->cancel();
    EXPECT_EQ(u.n_cached, static_cast<int>(shared.size()));
    EXPECT_EQ(u.text, without_cache(second, 8, c).text);
}

TEST_F(PromptCache, EvictedPromptsComeBackFromHostMemoryBitForBit) {
    // One kept prompt: the second conversation evicts the first from the KV cache into host
    // memory, and the first's next turn copies it back. One token per pass, as in the
    // recomputation it is compared with.
    ContextConfig c{.n_ctx = 256, .n_seq = 1, .n_batch = 1, .n_cached_prompts = 1};
    c.prompt_cache_ram = 16u << 20;
    Scheduler s(*llama_->model, llama_->tokenizer, c, {}, *compute_);
    const std::vector<int32_t> first = ids("Once upon a time there was");
    const Job::Update a = s.submit(first, greedy(6))->wait_all();
    s.submit(ids("The quick brown fox"), greedy(6))->wait_all();
    SchedulerStats st = settled(s);
    EXPECT_EQ(st.n_saved_prompts, 1);
    EXPECT_GT(st.saved_prompt_bytes, 0u);
    EXPECT_LE(st.saved_prompt_bytes, c.prompt_cache_ram);

    const std::vector<int32_t> next = concat(concat(first, sampled_ids(a)), ids(" and so", false));
    GenerationParams p = greedy(8);
    p.top_logprobs = 5;
    const Job::Update b = s.submit(next, p)->wait_all();
    EXPECT_EQ(b.n_cached, static_cast<int>(first.size()) + 5);
    st = settled(s);
    EXPECT_EQ(st.n_cache_restores, 1u);
    // Host memory holds the second conversation now (the first's next turn took its cells): its
    // rows' bytes only, the first's given back when they were copied into cells.
    EXPECT_EQ(st.n_saved_prompts, 1);
    const size_t fox_fed = ids("The quick brown fox").size() + 5;
    EXPECT_EQ(st.saved_prompt_bytes,
              memory::PoolBuffer<std::byte>::bytes_for(fox_fed * s.cache().pool(0).cell_bytes()));

    ContextConfig plain = c;
    plain.n_cached_prompts = 0;
    plain.prompt_cache_ram = 0;
    Scheduler fresh(*llama_->model, llama_->tokenizer, plain, {}, *compute_);
    const Job::Update e = fresh.submit(next, p)->wait_all();
    expect_same_logprobs(b, e);
}

TEST_F(PromptCache, HostMemoryHoldsNoMoreThanItsLimit) {
    ContextConfig c{.n_ctx = 256, .n_seq = 1, .n_batch = 32, .n_cached_prompts = 1};
    Scheduler probe(*llama_->model, llama_->tokenizer, c, {}, *compute_);
    const size_t cell = probe.cache().pool(0).cell_bytes();
    c.prompt_cache_ram = 40 * cell;  // room for one prompt of ~30 tokens, not two
    Scheduler s(*llama_->model, llama_->tokenizer, c, {}, *compute_);
    for (const char* start :
         {"Once upon a time", "The quick brown fox", "In a hole in the ground", "Call me Ishmael"}) {
        s.submit(ids(start), greedy(20))->wait_all();
        const SchedulerStats st = settled(s);
        EXPECT_LE(st.saved_prompt_bytes, c.prompt_cache_ram);
        EXPECT_LE(st.n_saved_prompts, 1);
    }
    EXPECT_EQ(settled(s).n_saved_prompts, 1);
}

// --cache-disk: host memory with room for one prompt gives the older one to a file; its next turn
// reads it back (through host memory) and copies it into cells, bit for bit.
TEST_F(PromptCache, PromptsHostMemoryGivesUpComeBackFromDiskBitForBit) {
    const std::filesystem::path dir = std::filesystem::temp_directory_path() / "fitllm-disk-tier-test";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    ContextConfig c{.n_ctx = 256, .n_seq = 1, .n_batch = 1, .n_cached_prompts = 1};
    {
        Scheduler probe(*llama_->model, llama_->tokenizer, c, {}, *compute_);
        c.prompt_cache_ram = 20 * probe.cache().pool(0).cell_bytes() + 4096;  // one prompt of ~13 tokens
    }
    c.prompt_cache_disk = 16u << 20;
    c.prompt_cache_dir = dir.string();
    const std::vector<int32_t> first = ids("Once upon a time there was");
    Job::Update a;
    {
        Scheduler s(*llama_->model, llama_->tokenizer, c, {}, *compute_);
        a = s.submit(first, greedy(6))->wait_all();
        s.submit(ids("The quick brown fox"), greedy(6))->wait_all();      // evicts the first to host memory
        s.submit(ids("In a hole in the ground"), greedy(6))->wait_all();  // ... and on to disk
        SchedulerStats st = settled(s);
        EXPECT_EQ(st.n_saved_prompts, 1);
        ASSERT_EQ(st.n_disk_prompts, 1);
        EXPECT_GT(st.disk_prompt_bytes, 0u);
        EXPECT_LE(st.disk_prompt_bytes, c.prompt_cache_disk);
        // One directory of this scheduler's, one file in it.
        std::vector<std::filesystem::path> made(std::filesystem::directory_iterator(dir), {});
        ASSERT_EQ(made.size(), 1u);
        EXPECT_EQ(std::distance(std::filesystem::directory_iterator(made[0]), {}), 1);

        const std::vector<int32_t> next = concat(concat(first, sampled_ids(a)), ids(" and so", false));
        GenerationParams p = greedy(8);
        p.top_logprobs = 5;
        const Job::Update b = s.submit(next, p)->wait_all();
        EXPECT_EQ(b.n_cached, static_cast<int>(first.size()) + 5);
        st = settled(s);
        EXPECT_EQ(st.n_disk_reads, 1u);
        EXPECT_EQ(st.n_disk_failures, 0u);
        EXPECT_EQ(st.n_cache_restores, 1u);
        EXPECT_LE(st.saved_prompt_bytes, c.prompt_cache_ram);

        ContextConfig plain = c;
        plain.n_cached_prompts = 0;
        plain.prompt_cache_ram = 0;
        plain.prompt_cache_disk = 0;
        Scheduler fresh(*llama_->model, llama_->tokenizer, plain, {}, *compute_);
        const Job::Update e = fresh.submit(next, p)->wait_all();
        expect_same_logprobs(b, e);
    }
    // The scheduler's directory and files are gone with it.
    EXPECT_TRUE(std::filesystem::is_empty(dir));
    std::filesystem::remove_all(dir);
}

TEST_F(PromptCache, DiskHoldsNoMoreThanItsLimit) {
    ContextConfig c{.n_ctx = 256, .n_seq = 1, .n_batch = 32, .n_cached_prompts = 1};
    Scheduler probe(*llama_->model, llama_->tokenizer, c, {}, *compute_);
    const size_t cell = probe.cache().pool(0).cell_bytes();
    c.prompt_cache_ram = 40 * cell;   // one prompt of ~30 tokens
    c.prompt_cache_disk = 70 * cell;  // two at most
    Scheduler s(*llama_->model, llama_->tokenizer, c, {}, *compute_);
    for (const char* start : {"Once upon a time", "The quick brown fox", "In a hole in the ground", "Call me Ishmael",
                              "It was a bright cold day"}) {
        s.submit(ids(start), greedy(20))->wait_all();
        const SchedulerStats st = settled(s);
        EXPECT_LE(st.disk_prompt_bytes, c.prompt_cache_disk);
        EXPECT_LE(st.n_disk_prompts, 2);
    }
    const SchedulerStats st = settled(s);
    EXPECT_GE(st.n_disk_prompts, 1);
    EXPECT_EQ(st.n_disk_failures, 0u);
}

TEST_F(PromptCache, DiskNeedsHostMemoryAndAPlaceForItsFiles) {
    ContextConfig c{.n_ctx = 256, .n_seq = 1, .n_batch = 32, .n_cached_prompts = 1};
    c.prompt_cache_disk = 1u << 20;
    try {
        Scheduler s(*llama_->model, llama_->tokenizer, c, {}, *compute_);
        FAIL() << "expected ConfigError";
    } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("--cache-disk"), std::string::npos) << e.what();
    }
    c.prompt_cache_ram = 1u << 20;
    c.prompt_cache_dir = "/nonexistent/fitllm";
    try {
        Scheduler s(*llama_->model, llama_->tokenizer, c, {}, *compute_);
        FAIL() << "expected ConfigError";
    } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find("/nonexistent/fitllm"), std::string::npos) << e.what();
    }
}

// --cache-dir with the model file's identity: the files outlive the scheduler. The first one's end
// writes the prompt it keeps in its cells to a file; the second takes it up at its start and
// answers the conversation's next turn from it, bit for bit as a recomputation.
class PersistentPromptCache : public PromptCache {
protected:
    void SetUp() override {
        dir_ = std::filesystem::temp_directory_path() /
               ("fitllm-persistent-prompts-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "-" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        std::filesystem::remove_all(dir_);
        std::filesystem::create_directories(dir_);
        c_.prompt_cache_ram = 16u << 20;
        c_.prompt_cache_disk = 16u << 20;
        c_.prompt_cache_dir = dir_.string();
        options_.prompt_cache_model = model_file_identity(llama_->file);
    }
    void TearDown() override { std::filesystem::remove_all(dir_); }
    std::vector<std::filesystem::path> files() const {
        std::vector<std::filesystem::path> out;
        for (const auto& e : std::filesystem::directory_iterator(dir_)) out.push_back(e.path());
        std::sort(out.begin(), out.end());
        return out;
    }
    // A first turn in a scheduler of its own, kept in a file when it ends.
    Job::Update first_turn(const std::vector<int32_t>& prompt, ContextConfig c, SchedulerOptions o) {
        Scheduler s(*llama_->model, llama_->tokenizer, c, o, *compute_);
        Job::Update a = s.submit(prompt, greedy(6))->wait_all();
        settled(s);
        return a;
    }
    // The next turn of `first` (answered a) in a scheduler that starts on the directory; expects
    // `cached` tokens taken from the files and the logprobs of a recomputation.
    SchedulerStats next_turn(const std::vector<int32_t>& first, const Job::Update& a, int cached) {
        const std::vector<int32_t> next = concat(concat(first, sampled_ids(a)), ids(" and so", false));
        GenerationParams p = greedy(8);
        p.top_logprobs = 5;
        Scheduler s(*llama_->model, llama_->tokenizer, c_, options_, *compute_);
        EXPECT_TRUE(s.prompt_cache().persistent());
        const Job::Update b = s.submit(next, p)->wait_all();
        EXPECT_EQ(b.n_cached, cached);
        const SchedulerStats st = settled(s);
        ContextConfig plain = c_;
        plain.n_cached_prompts = 0;
        plain.prompt_cache_ram = 0;
        plain.prompt_cache_disk = 0;
        Scheduler fresh(*llama_->model, llama_->tokenizer, plain, {}, *compute_);
        expect_same_logprobs(b, fresh.submit(next, p)->wait_all());
        return st;
    }
    std::filesystem::path dir_;
    ContextConfig c_{.n_ctx = 256, .n_seq = 1, .n_batch = 1, .n_cached_prompts = 1};
    SchedulerOptions options_;
};

TEST_F(PersistentPromptCache, ARestartedSchedulerAnswersTheNextTurnFromTheFiles) {
    const std::vector<int32_t> first = ids("Once upon a time there was");
    const Job::Update a = first_turn(first, c_, options_);
    // One whole file, in the directory itself.
    const std::vector<std::filesystem::path> made = files();
    ASSERT_EQ(made.size(), 1u);
    EXPECT_EQ(made[0].extension(), ".fitllm-prompt");
    EXPECT_TRUE(std::filesystem::is_regular_file(made[0]));

    const SchedulerStats st = next_turn(first, a, static_cast<int>(first.size()) + 5);
    EXPECT_EQ(st.n_disk_loaded, 1u);
    EXPECT_EQ(st.n_disk_reads, 1u);
    EXPECT_EQ(st.n_cache_restores, 1u);
    EXPECT_EQ(st.n_disk_failures, 0u);
    EXPECT_EQ(st.n_disk_foreign + st.n_disk_bad, 0u);
    // The second scheduler's end wrote the longer conversation; the file it read is gone.
    const std::vector<std::filesystem::path> after = files();
    ASSERT_EQ(after.size(), 1u);
    EXPECT_NE(after[0], made[0]);
}

TEST_F(PersistentPromptCache, FilesOfAnotherModelOrLayoutAndBrokenOnesAreSkipped) {
    const std::vector<int32_t> first = ids("Once upon a time there was");
    const Job::Update a = first_turn(first, c_, options_);
    const std::filesystem::path good = files().at(0);
    // Another model file's (its identity), another KV layout's (q8_0 V), both of other prompts.
    SchedulerOptions other = options_;
    other.prompt_cache_model = options_.prompt_cache_model + 1;
    first_turn(ids("The quick brown fox"), c_, other);
    ContextConfig q8 = c_;
    q8.type_v = KvType::q8_0;
    first_turn(ids("Call me Ishmael"), q8, options_);
    ASSERT_EQ(files().size(), 3u);
    // Broken copies of the good one: truncated in its rows, in its header, a token changed, and
    // files that are no prompt file at all.
    const auto copy = [&](const std::string& name) {
        const std::filesystem::path to = dir_ / name;
        std::filesystem::copy_file(good, to);
        return to;
    };
    const uint64_t size = std::filesystem::file_size(good);
    std::filesystem::resize_file(copy("rows-cut.fitllm-prompt"), size - 10);
    std::filesystem::resize_file(copy("head-cut.fitllm-prompt"), 40);
    {
        std::fstream f(copy("token.fitllm-prompt"), std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(64 + 4 + 4);  // the second token (after the pool's place count)
        f.put('\x7f');
    }
    {
        std::ofstream f(dir_ / "garbage.fitllm-prompt", std::ios::binary);
        f << std::string(4096, 'x');
    }
    std::ofstream(dir_ / "empty.fitllm-prompt").close();
    std::ofstream(dir_ / "notes.txt") << "not a prompt";

    const SchedulerStats st = next_turn(first, a, static_cast<int>(first.size()) + 5);
    EXPECT_EQ(st.n_disk_loaded, 1u);
    EXPECT_EQ(st.n_disk_foreign, 2u);
    EXPECT_EQ(st.n_disk_bad, 5u);
    EXPECT_EQ(st.n_disk_reads, 1u);
    EXPECT_EQ(st.n_disk_failures, 0u);
    // What is not this model's is left alone: the two foreign files, the five broken ones and the
    // text; the good one was read (and deleted), and the scheduler's end wrote the next turn.
    EXPECT_EQ(files().size(), 2u + 5u + 1u + 1u);
}

TEST_F(PersistentPromptCache, RowsThatDoNotMatchTheirHashAreComputedAgain) {
    const std::vector<int32_t> first = ids("Once upon a time there was");
    const Job::Update a = first_turn(first, c_, options_);
    const std::filesystem::path good = files().at(0);
    {
        std::fstream f(good, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(-3, std::ios::end);
        f.put('\x55');
    }
    const SchedulerStats st = next_turn(first, a, 0);
    EXPECT_EQ(st.n_disk_loaded, 1u);
    EXPECT_EQ(st.n_disk_reads, 0u);
    EXPECT_EQ(st.n_disk_failures, 1u);
}

TEST_F(PersistentPromptCache, TheStartTakesUpTheNewestFilesWithinItsLimit) {
    first_turn(ids("Once upon a time there was"), c_, options_);
    const std::filesystem::path older = files().at(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a later modification time
    const std::vector<int32_t> second = ids("The quick brown fox jumps over");
    const Job::Update a = first_turn(second, c_, options_);
    // The second took only the older file's first token (BOS): the file stays.
    ASSERT_EQ(files().size(), 2u);
    ContextConfig small = c_;
    small.prompt_cache_disk = std::max(std::filesystem::file_size(files()[0]), std::filesystem::file_size(files()[1])) +
                              std::min(std::filesystem::file_size(files()[0]), std::filesystem::file_size(files()[1])) -
                              1;
    c_ = small;
    const SchedulerStats st = next_turn(second, a, static_cast<int>(second.size()) + 5);
    EXPECT_EQ(st.n_disk_loaded, 1u);
    EXPECT_EQ(st.n_disk_reads, 1u);
    EXPECT_FALSE(std::filesystem::exists(older));  // the least recently used, deleted
}

TEST_F(PersistentPromptCache, SchedulersSharingTheDirectoryWriteFilesOfTheirOwn) {
    {
        Scheduler s1(*llama_->model, llama_->tokenizer, c_, options_, *compute_);
        Scheduler s2(*llama_->model, llama_->tokenizer, c_, options_, *compute_);
        s1.submit(ids("Once upon a time there was"), greedy(6))->wait_all();
        s2.submit(ids("The quick brown fox jumps over"), greedy(6))->wait_all();
        settled(s1);
        settled(s2);
    }
    ASSERT_EQ(files().size(), 2u);
    Scheduler s(*llama_->model, llama_->tokenizer, c_, options_, *compute_);
    EXPECT_EQ(s.stats().n_disk_loaded, 2u);
    EXPECT_EQ(s.stats().n_disk_bad, 0u);
}

// Whether one of the notes names `path` and says `what`.
bool noted(const std::vector<std::string>& notes, const std::filesystem::path& path, const std::string& what) {
    return std::any_of(notes.begin(), notes.end(), [&](const std::string& n) {
        return n.find(path.string()) != std::string::npos && n.find(what) != std::string::npos;
    });
}

void make_old(const std::filesystem::path& path) {
    std::filesystem::last_write_time(path, std::filesystem::file_time_type::clock::now() - std::chrono::hours(1));
}

// A crash mid-write leaves a temporary file (a dead writer's; a live one holds its flock), and a
// crashed cache that was not persistent leaves its whole directory. The next start removes them,
// and only them: not a live writer's, not one so new its writer may not have locked it yet, not a
// name the cache does not write.
TEST_F(PersistentPromptCache, TheStartRemovesWhatACrashedWriterLeft) {
    const std::vector<int32_t> first = ids("Once upon a time there was");
    const Job::Update a = first_turn(first, c_, options_);
    const std::filesystem::path good = files().at(0);
    const auto half_copy = [&](const std::string& name) {
        const std::filesystem::path to = dir_ / name;
        std::filesystem::copy_file(good, to);
        std::filesystem::resize_file(to, std::filesystem::file_size(good) / 2);
        return to;
    };
    const std::filesystem::path dead = half_copy("prompt-0123456789abcdef-3.fitllm-prompt.tmp");
    make_old(dead);
    const std::filesystem::path live = half_copy("prompt-fedcba9876543210-1.fitllm-prompt.tmp");
    make_old(live);
    const int live_fd = ::open(live.c_str(), O_RDONLY);
    ASSERT_GE(live_fd, 0);
    ASSERT_EQ(::flock(live_fd, LOCK_EX | LOCK_NB), 0);  // a writer at work
    const std::filesystem::path other = half_copy("notes.tmp");
    make_old(other);
    // A non-persistent cache's directory whose process died, and one whose process lives.
    const std::filesystem::path dead_dir = dir_ / "fitllm-prompts-AbC123";
    std::filesystem::create_directory(dead_dir);
    std::filesystem::copy_file(good, dead_dir / "prompt-1111111111111111-1.fitllm-prompt");
    make_old(dead_dir);
    const std::filesystem::path live_dir = dir_ / "fitllm-prompts-XyZ789";
    std::filesystem::create_directory(live_dir);
    make_old(live_dir);
    const int live_dir_fd = ::open(live_dir.c_str(), O_RDONLY | O_DIRECTORY);
    ASSERT_GE(live_dir_fd, 0);
    ASSERT_EQ(::flock(live_dir_fd, LOCK_EX | LOCK_NB), 0);
    // Just made: perhaps a writer between its open() and its flock().
    const std::filesystem::path young = half_copy("prompt-00000000000000aa-1.fitllm-prompt.tmp");
    {
        Scheduler s(*llama_->model, llama_->tokenizer, c_, options_, *compute_);
        const std::vector<std::string>& notes = s.prompt_cache().notes();
        EXPECT_FALSE(std::filesystem::exists(dead));
        EXPECT_TRUE(noted(notes, dead, "a temporary file of a write that did not finish"))
            << ::testing::PrintToString(notes);
        EXPECT_FALSE(std::filesystem::exists(dead_dir));
        EXPECT_TRUE(noted(notes, dead_dir, "removed with its 1 files")) << ::testing::PrintToString(notes);
        for (const auto& kept : {live, young, other, live_dir, good}) {
            EXPECT_TRUE(std::filesystem::exists(kept)) << kept;
            EXPECT_FALSE(noted(notes, kept, "removed")) << kept;
        }
        const SchedulerStats st = s.stats();
        EXPECT_EQ(st.n_disk_loaded, 1u);  // the good file, taken up as before
        EXPECT_EQ(st.n_disk_bad, 0u);     // temporaries are not prompt files
    }
    ::close(live_fd);
    ::close(live_dir_fd);
    // Once its writer is gone (the lock released) an old temporary goes at the next start; the good
    // file is still there (the first scheduler took it up but no request read it).
    make_old(young);
    const SchedulerStats st = next_turn(first, a, static_cast<int>(first.size()) + 5);
    EXPECT_EQ(st.n_disk_reads, 1u);
    EXPECT_FALSE(std::filesystem::exists(live));
    EXPECT_FALSE(std::filesystem::exists(live_dir));
    EXPECT_FALSE(std::filesystem::exists(young));
    EXPECT_TRUE(std::filesystem::exists(other));
}

// A non-persistent cache (no model identity) removes a crashed one's directory under --cache-dir
// too, and holds its own so that another start leaves it alone.
TEST_F(PersistentPromptCache, ADeadCachesDirectoryGoesAndALiveOneStays) {
    options_.prompt_cache_model = 0;
    const std::filesystem::path dead_dir = dir_ / "fitllm-prompts-q1w2e3";
    std::filesystem::create_directory(dead_dir);
    std::ofstream(dead_dir / "prompt-2222222222222222-7.fitllm-prompt.tmp") << "half";
    std::ofstream(dead_dir / "prompt-2222222222222222-6.fitllm-prompt") << "whole";
    make_old(dead_dir);
    Scheduler s1(*llama_->model, llama_->tokenizer, c_, options_, *compute_);
    EXPECT_FALSE(std::filesystem::exists(dead_dir));
    EXPECT_TRUE(noted(s1.prompt_cache().notes(), dead_dir, "removed with its 2 files"));
    const std::vector<std::filesystem::path> mine = files();
    ASSERT_EQ(mine.size(), 1u);
    make_old(mine[0]);
    Scheduler s2(*llama_->model, llama_->tokenizer, c_, options_, *compute_);
    EXPECT_TRUE(std::filesystem::exists(mine[0])) << "s1 lives: its directory stays";
    EXPECT_EQ(files().size(), 2u);
}

// A file truncated or corrupted after the start indexed it: ignored when a request would read it,
// with a warning naming it; the prompt is computed, the text the same.
TEST_F(PersistentPromptCache, AFileBrokenAfterTheStartIsIgnoredWithAWarning) {
    const std::vector<int32_t> first = ids("Once upon a time there was");
    const Job::Update a = first_turn(first, c_, options_);
    const std::filesystem::path good = files().at(0);
    const std::vector<int32_t> next = concat(concat(first, sampled_ids(a)), ids(" and so", false));
    ContextConfig plain = c_;
    plain.n_cached_prompts = 0;
    plain.prompt_cache_ram = 0;
    plain.prompt_cache_disk = 0;
    Scheduler fresh(*llama_->model, llama_->tokenizer, plain, {}, *compute_);
    const Job::Update want = fresh.submit(next, greedy(8))->wait_all();
    for (const bool truncate : {true, false}) {
        std::filesystem::path file = files().at(0);
        Scheduler s(*llama_->model, llama_->tokenizer, c_, options_, *compute_);
        ASSERT_EQ(s.stats().n_disk_loaded, 1u);
        if (truncate) {
            std::filesystem::resize_file(file, std::filesystem::file_size(file) - 100);
        } else {
            std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
            f.seekp(-1, std::ios::end);
            f.put('\x33');
        }
        ::testing::internal::CaptureStderr();
        const Job::Update b = s.submit(next, greedy(8))->wait_all();
        const SchedulerStats st = settled(s);
        const std::string log = ::testing::internal::GetCapturedStderr();
        EXPECT_EQ(b.n_cached, 0);
        EXPECT_EQ(b.text, want.text);
        EXPECT_EQ(st.n_disk_failures, 1u);
        EXPECT_EQ(st.n_disk_reads, 0u);
        EXPECT_NE(log.find("warning: prompt cache file " + file.string()), std::string::npos) << log;
        EXPECT_NE(log.find(truncate ? "truncated" : "do not match their hash"), std::string::npos) << log;
        EXPECT_FALSE(std::filesystem::exists(file)) << "a broken file of this cache's is deleted";
    }
    (void)good;
}

// Truncated and corrupt files found at the start are skipped, each named in the notes (the server
// logs them) with why.
TEST_F(PersistentPromptCache, BrokenFilesAreNamedInTheNotes) {
    first_turn(ids("Once upon a time there was"), c_, options_);
    const std::filesystem::path good = files().at(0);
    const auto broken = [&](const std::string& name, uint64_t size) {
        const std::filesystem::path to = dir_ / name;
        std::filesystem::copy_file(good, to);
        std::filesystem::resize_file(to, size);
        return to;
    };
    const std::filesystem::path rows = broken("prompt-a-1.fitllm-prompt", std::filesystem::file_size(good) - 1);
    const std::filesystem::path head = broken("prompt-a-2.fitllm-prompt", 63);
    const std::filesystem::path zero = broken("prompt-a-3.fitllm-prompt", 0);
    Scheduler s(*llama_->model, llama_->tokenizer, c_, options_, *compute_);
    const std::vector<std::string>& notes = s.prompt_cache().notes();
    for (const auto& p : {rows, head, zero}) {
        EXPECT_TRUE(noted(notes, p, "skipped, truncated")) << p << ": " << ::testing::PrintToString(notes);
        EXPECT_TRUE(std::filesystem::exists(p)) << "left alone";
    }
    EXPECT_EQ(s.stats().n_disk_bad, 3u);
    EXPECT_EQ(s.stats().n_disk_loaded, 1u);
}

// Quantized K/V (every -ctk type but the float ones, with their K transform): the host-memory and
// disk tiers keep the cells as stored and copy them back bit for bit. A fresh scheduler without
// the cache computing the next turn in full gives the same text and logprobs, bit for bit: it
// fits its K transform from the same first keys (the turn starts with the first request's
// tokens) and stores them as the first scheduler did, one token a pass.
TEST_F(PromptCache, QuantizedCellsComeBackFromHostMemoryAndDisk) {
    struct Types {
        KvType k, v;
    };
    for (const Types t :
         {Types{KvType::q8_0, KvType::q8_0}, Types{KvType::q4_0, KvType::q4_0}, Types{KvType::q4_1, KvType::q5_0},
          Types{KvType::q5_1, KvType::f16}, Types{KvType::iq4_nl, KvType::iq4_nl}, Types{KvType::f16, KvType::q8_0}}) {
        SCOPED_TRACE(std::string(kv_type_name(t.k)) + "/" + std::string(kv_type_name(t.v)));
        ContextConfig c{.n_ctx = 256, .n_seq = 1, .n_batch = 1, .type_k = t.k, .type_v = t.v, .n_cached_prompts = 1};
        {
            Scheduler probe(*llama_->model, llama_->tokenizer, c, {}, *compute_);
            c.prompt_cache_ram = 20 * probe.cache().pool(0).cell_bytes() + 4096;  // one prompt of ~13 tokens
        }
        c.prompt_cache_disk = 16u << 20;
        const std::vector<int32_t> first = ids("Once upon a time there was");
        Scheduler s(*llama_->model, llama_->tokenizer, c, {}, *compute_);
        const Job::Update a = s.submit(first, greedy(6))->wait_all();
        s.submit(ids("The quick brown fox"), greedy(6))->wait_all();      // the first to host memory
        s.submit(ids("In a hole in the ground"), greedy(6))->wait_all();  // ... and on to disk
        SchedulerStats st = settled(s);
        ASSERT_EQ(st.n_disk_prompts, 1);
        const std::vector<int32_t> next = concat(concat(first, sampled_ids(a)), ids(" and so", false));
        GenerationParams p = greedy(8);
        p.top_logprobs = 5;
        const Job::Update b = s.submit(next, p)->wait_all();
        EXPECT_EQ(b.n_cached, static_cast<int>(first.size()) + 5);
        st = settled(s);
        EXPECT_EQ(st.n_disk_reads, 1u);
        EXPECT_EQ(st.n_cache_restores, 1u);
        EXPECT_EQ(st.n_disk_failures, 0u);

        ContextConfig plain = c;
        plain.n_cached_prompts = 0;
        plain.prompt_cache_ram = 0;
        plain.prompt_cache_disk = 0;
        Scheduler fresh(*llama_->model, llama_->tokenizer, plain, {}, *compute_);
        const Job::Update want = fresh.submit(next, p)->wait_all();
        EXPECT_EQ(b.text, want.text);
        expect_same_logprobs(b, want);
    }
}

// Keys shaped by a K transform (a rotated quantized K: the diagonal kind for q8_0, the query-aware
// one for q4_0): the transform goes to a file beside the prompt files, and a restart reads it
// before it stores anything, so it stores keys as the first run did and reads that run's files.
// The restarted scheduler first answers another prompt (from which it would have fitted another
// transform), then the next turn of the first: taken from the file, with the logprobs, bit for
// bit, of the first run answering it from its cells and of a recomputation (whose transform is
// fitted from the same first keys).
TEST_F(PersistentPromptCache, RotatedQuantizedKeysComeBackAfterARestart) {
    for (const KvType t : {KvType::q8_0, KvType::q4_0}) {
        SCOPED_TRACE(std::string(kv_type_name(t)));
        for (const std::filesystem::path& f : files()) std::filesystem::remove(f);
        c_.type_k = t;
        c_.type_v = t;
        const std::vector<int32_t> first = ids("Once upon a time there was");
        const Job::Update a = first_turn(first, c_, options_);
        const std::vector<std::filesystem::path> made = files();
        ASSERT_EQ(made.size(), 2u);  // the prompt and the transform
        EXPECT_EQ(made[0].extension(), ".fitllm-keys");
        EXPECT_EQ(made[1].extension(), ".fitllm-prompt");
        const std::vector<int32_t> next = concat(concat(first, sampled_ids(a)), ids(" and so", false));
        GenerationParams p = greedy(8);
        p.top_logprobs = 5;
        // The first run's own next turn (from its cells), in a scheduler on another directory.
        Job::Update in_run;
        std::vector<float> fitted;  // layer 0's transform, as the first run fitted it
        {
            ContextConfig elsewhere = c_;
            elsewhere.prompt_cache_dir = (dir_ / "other").string();
            Scheduler s(*llama_->model, llama_->tokenizer, elsewhere, options_, *compute_);
            s.submit(first, greedy(6))->wait_all();
            settled(s);
            in_run = s.submit(next, p)->wait_all();
            EXPECT_EQ(in_run.n_cached, static_cast<int>(first.size()) + 5);
            settled(s);
            const kv::KeyTransform* key = s.cache().pool(0).key_transform(0);
            ASSERT_NE(key, nullptr);
            for (const std::span<const float> v : key->numbers()) fitted.insert(fitted.end(), v.begin(), v.end());
        }
        std::filesystem::remove_all(dir_ / "other");

        Scheduler s(*llama_->model, llama_->tokenizer, c_, options_, *compute_);
        EXPECT_EQ(s.stats().n_disk_loaded, 1u);
        EXPECT_EQ(s.stats().n_disk_foreign + s.stats().n_disk_bad, 0u)
            << ::testing::PrintToString(s.prompt_cache().notes());
        const kv::KeyTransform* key = s.cache().pool(0).key_transform(0);
        ASSERT_NE(key, nullptr) << "read before the first request";
        std::vector<float> read;
        for (const std::span<const float> v : key->numbers()) read.insert(read.end(), v.begin(), v.end());
        EXPECT_EQ(read, fitted);
        EXPECT_EQ(key->query_aware(), t == KvType::q4_0);
        s.submit(ids("The quick brown fox jumps over the lazy dog"), greedy(4))->wait_all();
        settled(s);
        const Job::Update b = s.submit(next, p)->wait_all();
        EXPECT_EQ(b.n_cached, static_cast<int>(first.size()) + 5);
        const SchedulerStats st = settled(s);
        EXPECT_EQ(st.n_disk_reads, 2u);  // the other prompt took the file's first token (BOS), then the turn
        EXPECT_EQ(st.n_disk_failures, 0u);
        expect_same_logprobs(b, in_run);
        ContextConfig plain = c_;
        plain.n_cached_prompts = 0;
        plain.prompt_cache_ram = 0;
        plain.prompt_cache_disk = 0;
        Scheduler fresh(*llama_->model, llama_->tokenizer, plain, {}, *compute_);
        expect_same_logprobs(b, fresh.submit(next, p)->wait_all());
    }
}

// The K transform file of a directory, when there is one.
std::filesystem::path keys_file(const std::filesystem::path& dir) {
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
        if (e.path().extension() == ".fitllm-keys") return e.path();
    }
    return {};
}

// A K transform file that is corrupt, truncated, of another model, missing, or valid but not the
// one the prompt files were written with: those files are not used (skipped, deleted), the
// transform file is named in a warning (and deleted when broken), and the next turn is computed
// in full, as a recomputation gives it. The run then writes its own transform and files, which
// the next run reads.
TEST_F(PersistentPromptCache, ABrokenOrForeignKeyTransformFileMakesItsPromptFilesGo) {
    c_.type_k = KvType::q4_0;
    c_.type_v = KvType::q4_0;
    const std::vector<int32_t> first = ids("Once upon a time there was");
    const std::vector<int32_t> other = ids("The quick brown fox jumps over the lazy dog");
    // A transform fitted from other keys (another first prompt), in a file of the same name.
    first_turn(other, c_, options_);
    const std::filesystem::path name = keys_file(dir_);
    ASSERT_FALSE(name.empty());
    const std::filesystem::path other_keys = dir_.string() + "-foreign-keys";
    std::filesystem::copy_file(name, other_keys, std::filesystem::copy_options::overwrite_existing);
    GenerationParams p = greedy(8);
    p.top_logprobs = 5;
    ContextConfig plain = c_;
    plain.n_cached_prompts = 0;
    plain.prompt_cache_ram = 0;
    plain.prompt_cache_disk = 0;

    enum class Break { flip, truncate, model, missing, foreign };
    for (const Break how : {Break::flip, Break::truncate, Break::model, Break::missing, Break::foreign}) {
        SCOPED_TRACE(static_cast<int>(how));
        for (const std::filesystem::path& f : files()) std::filesystem::remove(f);
        const Job::Update a = first_turn(first, c_, options_);
        const std::filesystem::path keys = keys_file(dir_);
        ASSERT_EQ(keys, name);
        const std::vector<std::filesystem::path> made = files();
        ASSERT_EQ(made.size(), 2u);
        const std::filesystem::path prompt = made[1];
        const uint64_t size = std::filesystem::file_size(keys);
        std::string why;
        switch (how) {
            case Break::flip: {
                std::fstream f(keys, std::ios::in | std::ios::out | std::ios::binary);
                f.seekg(static_cast<std::streamoff>(size / 2));
                const char c = static_cast<char>(f.get());
                f.seekp(static_cast<std::streamoff>(size / 2));
                f.put(static_cast<char>(c ^ 0x10));
                why = "corrupt:";  // (their hash, or a number that is not finite)
                break;
            }
            case Break::truncate:
                std::filesystem::resize_file(keys, size - 7);
                why = "truncated";
                break;
            case Break::model: {
                std::fstream f(keys, std::ios::in | std::ios::out | std::ios::binary);
                f.seekg(16);  // the model's identity
                const char c = static_cast<char>(f.get());
                f.seekp(16);
                f.put(static_cast<char>(c ^ 0x5a));
                why = "mismatched: of another model file";
                break;
            }
            case Break::missing:
                std::filesystem::remove(keys);
                break;
            case Break::foreign:
                std::filesystem::copy_file(other_keys, keys, std::filesystem::copy_options::overwrite_existing);
                break;
        }
        const std::vector<int32_t> next = concat(concat(first, sampled_ids(a)), ids(" and so", false));
        {
            Scheduler s(*llama_->model, llama_->tokenizer, c_, options_, *compute_);
            const std::vector<std::string>& notes = s.prompt_cache().notes();
            if (!why.empty()) {
                EXPECT_TRUE(noted(notes, keys, "warning: K transform file")) << ::testing::PrintToString(notes);
                EXPECT_TRUE(noted(notes, keys, why)) << ::testing::PrintToString(notes);
                EXPECT_FALSE(std::filesystem::exists(keys)) << "a broken transform file is deleted";
            }
            EXPECT_TRUE(
                noted(notes, prompt, how == Break::foreign ? "shaped by another K transform" : "not in the directory"))
                << ::testing::PrintToString(notes);
            EXPECT_FALSE(std::filesystem::exists(prompt)) << "its prompt file is deleted";
            EXPECT_EQ(s.stats().n_disk_loaded, 0u);
            EXPECT_EQ(s.stats().n_disk_foreign, 1u);
            EXPECT_EQ(s.stats().n_disk_bad, why.empty() ? 0u : 1u);
            const Job::Update b = s.submit(next, p)->wait_all();
            EXPECT_EQ(b.n_cached, 0);
            settled(s);
            if (how != Break::foreign) {  // it fitted its transform from the same first keys
                Scheduler fresh(*llama_->model, llama_->tokenizer, plain, {}, *compute_);
                expect_same_logprobs(b, fresh.submit(next, p)->wait_all());
            }
        }
        // That run's end wrote its files (and its transform, where it fitted one); the next reads them.
        ASSERT_EQ(files().size(), 2u);
        Scheduler s(*llama_->model, llama_->tokenizer, c_, options_, *compute_);
        EXPECT_EQ(s.stats().n_disk_loaded, 1u);
        EXPECT_EQ(s.stats().n_disk_foreign + s.stats().n_disk_bad, 0u);
    }
    std::filesystem::remove(other_keys);
}

// Without the model's identity, --cache-dir holds a directory of the scheduler's, gone with it.
TEST_F(PersistentPromptCache, NoIdentityNoFilesLeft) {
    options_.prompt_cache_model = 0;
    first_turn(ids("Once upon a time there was"), c_, options_);
    EXPECT_TRUE(files().empty());
}

TEST_F(PromptCache, NoneKeptWhenTurnedOff) {
    const ContextConfig c{.n_ctx = 256, .n_seq = 1, .n_batch = 32};
    Scheduler s(*llama_->model, llama_->tokenizer, c, {}, *compute_);
    const std::vector<int32_t> prompt = ids("Once upon a time");
    s.submit(prompt, greedy(4))->wait_all();
    EXPECT_EQ(s.submit(prompt, greedy(4))->wait_all().n_cached, 0);
    const SchedulerStats st = settled(s);
    EXPECT_EQ(st.kv_cells_used, 0);
    EXPECT_EQ(st.n_cached_prompts, 0);
}

TEST_F(PromptCache, KeptPromptsGiveTheirCellsBackToRequests) {
    // 128 cells; each request holds ~60: a kept prompt must go for every second one to fit.
    const ContextConfig c{.n_ctx = 128, .n_seq = 1, .n_batch = 64, .n_cached_prompts = 4};
    Scheduler s(*llama_->model, llama_->tokenizer, c, {}, *compute_);
    const std::vector<std::string> starts = {"Once upon a time", "The quick brown fox", "In a hole in the ground",
                                             "It was a bright cold day", "Call me Ishmael"};
    for (const std::string& start : starts) {
        const std::vector<int32_t> prompt = ids(start);
        const Job::Update u = s.submit(prompt, greedy(50))->wait_all();
        EXPECT_NE(u.reason, FinishReason::error) << start;
        EXPECT_EQ(u.text, without_cache(prompt, 50, c).text) << start;
        EXPECT_LE(s.stats().kv_cells_used, s.stats().kv_cells_total);
    }
    const SchedulerStats st = settled(s);
    EXPECT_GE(st.n_cache_evictions, 2u);
    EXPECT_GE(st.n_cached_prompts, 1);
    EXPECT_LE(st.n_cached_prompts, 2);
}

TEST_F(PromptCache, ConcurrentRequestsSharingPrefixesGiveTheirOwnTexts) {
    // Several conversations at once, each turn extending its own history, over a cache that keeps
    // fewer prompts than there are conversations: hits, misses and evictions mixed.
    const ContextConfig c{.n_ctx = 512, .n_seq = 3, .n_batch = 48, .n_cached_prompts = 2};
    Scheduler s(*llama_->model, llama_->tokenizer, c, {}, *compute_);
    std::vector<std::vector<int32_t>> history = {ids("Once upon a time"), ids("The quick brown fox"),
                                                 ids("In a hole in the ground"), ids("Call me Ishmael")};
    int n_hits = 0;
    for (int turn = 0; turn < 3; ++turn) {
        std::vector<std::shared_ptr<Job>> jobs;
        for (auto& h : history) jobs.push_back(s.submit(h, greedy(6)));
        for (size_t i = 0; i < jobs.size(); ++i) {
            const Job::Update u = jobs[i]->wait_all();
            ASSERT_EQ(u.n_generated, 6);
            EXPECT_EQ(u.text, without_cache(history[i], 6, c).text) << "conversation " << i << " turn " << turn;
            n_hits += u.n_cached > 0 ? 1 : 0;
            history[i] = concat(concat(history[i], sampled_ids(u)), ids(" and", false));
        }
    }
    EXPECT_GT(n_hits, 0);
    EXPECT_LE(settled(s).n_cached_prompts, 2);
}

TEST(PromptCacheWindow, AKeptPromptServesOnlyPrefixesItsWindowStillCovers) {
    const auto demo = test::demo_model();
    if (!demo) GTEST_SKIP() << "the demo model is not set up (scripts/setup.sh)";
    Loaded gemma(*demo);
    Compute compute(2);
    const ContextConfig c{.n_ctx = 2048, .n_seq = 1, .n_batch = 256, .n_cached_prompts = 2};
    Scheduler s(*gemma.model, gemma.tokenizer, c, {}, compute);
    ASSERT_GT(s.cache().n_pools(), 1) << "the demo model's sliding-window layers have a pool of their own";
    const int window = s.cache().pool(1).params().window;
    ASSERT_GT(window, 0);

    std::string text;
    while (static_cast<int>(gemma.tokenizer.tokenize(text, true, false).size()) < window + 200)
        text += "The river runs past the mill, and the miller counts the sacks of grain. ";
    const std::vector<int32_t> first = gemma.tokenizer.tokenize(text, true, false);
    const Job::Update a = s.submit(first, greedy(4))->wait_all();
    settled(s);

    // All of it and more: the window before the new tokens is kept.
    const std::vector<int32_t> next =
        concat(concat(first, sampled_ids(a)), gemma.tokenizer.tokenize(" Then", false, false));
    const Job::Update b = s.submit(next, greedy(4))->wait_all();
    EXPECT_EQ(b.n_cached, static_cast<int>(first.size()) + 3);
    ContextConfig plain = c;
    plain.n_cached_prompts = 0;
    Scheduler fresh(*gemma.model, gemma.tokenizer, plain, {}, compute);
    EXPECT_EQ(b.text, fresh.submit(next, greedy(4))->wait_all().text);
    settled(s);

    // A prefix that ends a window before the kept prompt's end: its window pool no longer holds
    // what the new tokens see, so it is computed again.
    const std::vector<int32_t> early = concat(std::vector<int32_t>(first.begin(), first.begin() + 100),
                                              gemma.tokenizer.tokenize(" Then", false, false));
    const Job::Update e = s.submit(early, greedy(4))->wait_all();
    EXPECT_EQ(e.n_cached, 0);
    EXPECT_EQ(e.text, fresh.submit(early, greedy(4))->wait_all().text);
}

TEST(PromptCacheWindow, WindowPoolsAndShapedKeysComeBackFromHostMemory) {
    const auto demo = test::demo_model();
    if (!demo) GTEST_SKIP() << "the demo model is not set up (scripts/setup.sh)";
    Loaded gemma(*demo);
    Compute compute(2);
    ContextConfig c{.n_ctx = 2048, .n_seq = 1, .n_batch = 256, .type_k = KvType::q8_0, .type_v = KvType::q8_0};
    c.n_cached_prompts = 1;
    c.prompt_cache_ram = 64u << 20;
    Scheduler s(*gemma.model, gemma.tokenizer, c, {}, compute);
    const int window = s.cache().pool(1).params().window;
    std::string text;
    while (static_cast<int>(gemma.tokenizer.tokenize(text, true, false).size()) < window + 100)
        text += "The river runs past the mill, and the miller counts the sacks of grain. ";
    const std::vector<int32_t> first = gemma.tokenizer.tokenize(text, true, false);
    const Job::Update a = s.submit(first, greedy(4))->wait_all();
    s.submit(gemma.tokenizer.tokenize("A different question altogether.", true, false), greedy(4))->wait_all();
    ASSERT_EQ(settled(s).n_saved_prompts, 1);

    const std::vector<int32_t> next =
        concat(concat(first, sampled_ids(a)), gemma.tokenizer.tokenize(" Then", false, false));
    const Job::Update b = s.submit(next, greedy(6))->wait_all();
    EXPECT_EQ(b.n_cached, static_cast<int>(first.size()) + 3);
    EXPECT_EQ(settled(s).n_cache_restores, 1u);
    ContextConfig plain = c;
    plain.n_cached_prompts = 0;
    plain.prompt_cache_ram = 0;
    Scheduler fresh(*gemma.model, gemma.tokenizer, plain, {}, compute);
    EXPECT_EQ(b.text, fresh.submit(next, greedy(6))->wait_all().text);
}

}  // namespace
}  // namespace fitllm::engine
