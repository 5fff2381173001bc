// The runtime matches its plan (issue 6): `fitllm run` as a child process over a matrix of
// models, contexts and KV types, and `fitllm serve` under 16 concurrent streamed clients; their
// peak resident set (VmHWM, from wait4's ru_maxrss) and, where a cgroup v1 memory controller is
// writable, their own cgroup's peak (memory.max_usage_in_bytes: RSS plus the page cache it brought
// in) are within max(5%, 32 MiB) of `fitllm plan`'s total for the same flags.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "test_support.h"

#ifndef FITLLM_UNDER_ASAN  // tests/CMakeLists.txt sets it in the sanitizer build
#define FITLLM_UNDER_ASAN 0
#endif

namespace fitllm {
namespace {

namespace fs = std::filesystem;

uint64_t tolerance(uint64_t plan) {
    return std::max<uint64_t>(plan / 20, uint64_t{32} << 20);
}

std::string mib(uint64_t bytes) {
    return std::to_string(static_cast<double>(bytes) / (1 << 20)) + " MiB";
}

std::string read_text(const fs::path& p) {
    std::ifstream in(p);
    std::string s;
    std::getline(in, s);
    return s;
}

// A child memory cgroup (v1) under this process's own, removed on destruction; nullopt with the
// reason in `why` where there is none to make.
class ChildCgroup {
public:
    static std::optional<ChildCgroup> make(std::string& why) {
        std::ifstream self("/proc/self/cgroup");
        std::string line, own;
        while (std::getline(self, line)) {
            const size_t a = line.find(':'), b = line.find(':', a + 1);
            if (a == std::string::npos || b == std::string::npos) continue;
            const std::string controllers = line.substr(a + 1, b - a - 1);
            if (("," + controllers + ",").find(",memory,") != std::string::npos) own = line.substr(b + 1);
        }
        const fs::path mount = "/sys/fs/cgroup/memory";
        if (own.empty() || !fs::exists(mount / "memory.max_usage_in_bytes")) {
            why = "no cgroup v1 memory controller here";
            return std::nullopt;
        }
        fs::path parent = mount / fs::path(own).relative_path();
        if (!fs::exists(parent)) parent = mount;
        const fs::path dir = parent / ("fitllm-plan-test-" + std::to_string(getpid()));
        if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
            why = "cannot create a memory cgroup under " + parent.string() + ": " + std::strerror(errno);
            return std::nullopt;
        }
        return ChildCgroup(dir);
    }
    ChildCgroup(ChildCgroup&& o) noexcept : dir_(std::move(o.dir_)) { o.dir_.clear(); }
    ~ChildCgroup() {
        if (!dir_.empty()) rmdir(dir_.c_str());
    }
    const fs::path& dir() const { return dir_; }
    std::optional<uint64_t> peak() const {
        const std::string s = read_text(dir_ / "memory.max_usage_in_bytes");
        if (s.empty()) return std::nullopt;
        return std::stoull(s);
    }
    // Page cache charged to the cgroup (memory.stat "cache"), bytes.
    uint64_t cache() const {
        std::ifstream in(dir_ / "memory.stat");
        std::string key;
        uint64_t value = 0;
        while (in >> key >> value) {
            if (key == "cache") return value;
        }
        return 0;
    }
    // A fresh peak for the next child: the pages earlier children left charged (page cache)
    // reclaimed, the peak set back to the usage.
    void reset_peak() const {
        std::ofstream(dir_ / "memory.force_empty") << "0";
        std::ofstream(dir_ / "memory.max_usage_in_bytes") << "0";
    }

private:
    explicit ChildCgroup(fs::path dir) : dir_(std::move(dir)) {}
    fs::path dir_;
};

struct Measured {
    int status = -1;
    uint64_t max_rss = 0;  // bytes: the child's VmHWM
    std::string output;
};

// Starts argv as a child (in the cgroup when given), stdout and stderr into a file.
pid_t start_child(const std::vector<std::string>& argv, const ChildCgroup* cgroup, const fs::path& out_file) {
    const pid_t pid = fork();
    if (pid == 0) {
        if (cgroup) {
            std::ofstream(cgroup->dir() / "cgroup.procs") << getpid() << std::flush;
        }
        const int fd = open(out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        std::vector<char*> args;
        for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
        args.push_back(nullptr);
        execv(args[0], args.data());
        _exit(127);
    }
    return pid;
}

// Waits for the child; wait4 gives its peak resident set.
Measured wait_child(pid_t pid, const fs::path& out_file) {
    Measured m;
    int status = 0;
    rusage ru{};
    if (pid > 0 && wait4(pid, &status, 0, &ru) == pid) {
        m.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        m.max_rss = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
    }
    std::ifstream in(out_file);
    m.output.assign(std::istreambuf_iterator<char>(in), {});
    return m;
}

Measured run_measured(const std::vector<std::string>& argv, const ChildCgroup* cgroup, const fs::path& out_file) {
    return wait_child(start_child(argv, cgroup, out_file), out_file);
}

// Drops the model file's pages from the page cache, so that the child's cgroup is charged for
// reading them; false when some stay (another process has them mapped).
bool evict_from_page_cache(const fs::path& path) {
    const int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) return false;
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    struct stat st {};
    bool evicted = false;
    if (fstat(fd, &st) == 0 && st.st_size > 0) {
        void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
        if (p != MAP_FAILED) {
            const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
            std::vector<unsigned char> vec((static_cast<size_t>(st.st_size) + page - 1) / page);
            size_t resident = 0;
            if (mincore(p, static_cast<size_t>(st.st_size), vec.data()) == 0) {
                for (const unsigned char v : vec) resident += v & 1;
                evicted = resident * page < (uint64_t{4} << 20);  // a few pages may be in use
            }
            munmap(p, static_cast<size_t>(st.st_size));
        }
    }
    close(fd);
    return evicted;
}

// Expects a child's peak resident set, and its cgroup's peak when it ran in one, within the
// tolerance of its plan, and prints them. A page is charged to the cgroup that first reads it:
// when another process read the model between the eviction and the child (tests running side by
// side), the child's cgroup was not charged for it and its peak says nothing about the plan.
// Returns whether the cgroup's peak was compared.
bool check_peaks(const std::string& what, uint64_t plan, uint64_t max_rss, const ChildCgroup* cgroup,
                 uint64_t resident_weights) {
    const auto diff = [](uint64_t a, uint64_t b) { return a > b ? a - b : b - a; };
    EXPECT_LE(diff(max_rss, plan), tolerance(plan)) << what << ", VmHWM " << mib(max_rss);
    std::printf("  %s: VmHWM %s", what.c_str(), mib(max_rss).c_str());
    bool compared = false;
    if (cgroup && cgroup->cache() + (uint64_t{4} << 20) < resident_weights) {
        std::printf("  (cgroup peak not compared: the model's pages were read by another process)");
    } else if (cgroup) {
        const std::optional<uint64_t> peak = cgroup->peak();
        EXPECT_TRUE(peak.has_value()) << what;
        if (peak) {
            EXPECT_LE(diff(*peak, plan), tolerance(plan)) << what << ", cgroup peak " << mib(*peak);
            std::printf(", cgroup peak %s", mib(*peak).c_str());
            compared = true;
        }
    }
    std::printf("\n");
    return compared;
}

struct Case {
    fs::path model;
    int n_ctx;
    std::string kv;
    int streamed = 0;  // --stream-layers
};

TEST(PlanVsPeak, RunStaysWithinToleranceOfItsPlan) {
    if (FITLLM_UNDER_ASAN) {
        GTEST_SKIP() << "built with AddressSanitizer: its shadow memory and quarantine are not part of the plan";
    }
    std::vector<fs::path> models = {test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf",
                                    test::source_dir() / "tests/model/data/tiny-qwen2-q4_k_m.gguf"};
    const auto demo = test::demo_model();
    if (demo) models.push_back(*demo);
    std::vector<Case> cases;
    for (const fs::path& m : models) {
        for (const int c : {512, 4096}) {
            for (const char* kv : {"f16", "q8_0", "q4_0"}) cases.push_back({m, c, kv});
        }
    }
    if (demo) {  // streamed layers: resident weights, stream buffers and their reads planned too
        cases.push_back({*demo, 512, "f16", 9});
        cases.push_back({*demo, 4096, "q8_0", 17});
    }
    std::string no_cgroup;
    std::optional<ChildCgroup> cgroup = ChildCgroup::make(no_cgroup);
    const test::TempDir tmp;
    // About 100 tokens: more than a batch of -b 64, so the scratch of a whole batch is used.
    std::string prompt = "The";
    for (int i = 0; i < 24; ++i) prompt += " quick brown fox";
    int cgroup_checked = 0;
    for (const Case& c : cases) {
        const std::vector<std::string> settings = {"-m",
                                                   c.model.string(),
                                                   "-c",
                                                   std::to_string(c.n_ctx),
                                                   "-b",
                                                   "64",
                                                   "-t",
                                                   "2",
                                                   "-ctk",
                                                   c.kv,
                                                   "-ctv",
                                                   c.kv,
                                                   "--stream-layers",
                                                   std::to_string(c.streamed)};
        std::vector<std::string> plan_argv = {test::fitllm_exe(), "plan", "--json"};
        plan_argv.insert(plan_argv.end(), settings.begin(), settings.end());
        const Measured plan_run = run_measured(plan_argv, nullptr, tmp / "plan.json");
        ASSERT_EQ(plan_run.status, 0) << plan_run.output;
        const auto host = nlohmann::json::parse(plan_run.output)["devices"][0];
        const uint64_t plan = host["total"].get<uint64_t>();
        const uint64_t resident_weights = host["weights_resident"].get<uint64_t>();

        std::vector<std::string> run_argv = {test::fitllm_exe(), "run", "-p", prompt, "-n", "4", "--temp", "0"};
        run_argv.insert(run_argv.end(), settings.begin(), settings.end());
        bool use_cgroup = cgroup.has_value();
        if (use_cgroup) {
            cgroup->reset_peak();
            use_cgroup = evict_from_page_cache(c.model);
        }
        const Measured run = run_measured(run_argv, use_cgroup ? &*cgroup : nullptr, tmp / "run.txt");
        const std::string what = c.model.filename().string() + " -c " + std::to_string(c.n_ctx) + " KV " + c.kv +
                                 (c.streamed ? " " + std::to_string(c.streamed) + " layers streamed" : "") + ": plan " +
                                 mib(plan) + ", tolerance " + mib(tolerance(plan));
        ASSERT_EQ(run.status, 0) << what << "\n" << run.output;
        EXPECT_NE(run.output.find("plan "), std::string::npos) << run.output;
        if (check_peaks(what, plan, run.max_rss, use_cgroup ? &*cgroup : nullptr, resident_weights)) ++cgroup_checked;
    }
    if (!demo) GTEST_SKIP() << "checked the tiny models only: the demo model is absent (scripts/setup.sh)";
    if (cgroup_checked == 0) {
        GTEST_SKIP() << "VmHWM checked; the cgroup's peak not: "
                     << (cgroup ? "the model files stay in the page cache (another process maps or reads them)"
                                : no_cgroup);
    }
}

// `fitllm serve` with 4 slots under 16 concurrent streamed clients (two requests each) peaks
// within the tolerance of the plan of its model: `fitllm plan` with the same -c, -np, -b and -t.
TEST(PlanVsPeak, ServeStaysWithinToleranceOfItsPlan) {
    if (FITLLM_UNDER_ASAN) {
        GTEST_SKIP() << "built with AddressSanitizer: its shadow memory and quarantine are not part of the plan";
    }
    const auto demo = test::demo_model();
    const fs::path model = demo ? *demo : test::source_dir() / "tests/model/data/tiny-llama-q8_0.gguf";
    const std::vector<std::string> settings = {"-m", model.string(), "-c", "2048", "-np", "4", "-b", "256", "-t", "2"};
    const test::TempDir tmp;
    std::vector<std::string> plan_argv = {test::fitllm_exe(), "plan", "--json"};
    plan_argv.insert(plan_argv.end(), settings.begin(), settings.end());
    const Measured plan_run = run_measured(plan_argv, nullptr, tmp / "plan.json");
    ASSERT_EQ(plan_run.status, 0) << plan_run.output;
    const auto host = nlohmann::json::parse(plan_run.output)["devices"][0];
    const uint64_t plan = host["total"].get<uint64_t>();
    const uint64_t resident_weights = host["weights_resident"].get<uint64_t>();

    std::string no_cgroup;
    std::optional<ChildCgroup> cgroup = ChildCgroup::make(no_cgroup);
    bool use_cgroup = cgroup.has_value();
    if (use_cgroup) {
        cgroup->reset_peak();
        use_cgroup = evict_from_page_cache(model);
    }
    std::vector<std::string> serve_argv = {test::fitllm_exe(), "serve", "--port", "0"};
    serve_argv.insert(serve_argv.end(), settings.begin(), settings.end());
    const fs::path log = tmp / "serve.txt";
    const pid_t pid = start_child(serve_argv, use_cgroup ? &*cgroup : nullptr, log);
    ASSERT_GT(pid, 0);
    // The port from "listening on http://127.0.0.1:PORT", then "ready" once the model is loaded.
    int port = 0;
    bool ready = false;
    for (int i = 0; i < 600 && !ready; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        std::ifstream in(log);
        const std::string text((std::istreambuf_iterator<char>(in)), {});
        const size_t at = text.find("listening on http://127.0.0.1:");
        if (at != std::string::npos) port = std::atoi(text.c_str() + at + 30);
        ready = port > 0 && text.find("; ready") != std::string::npos;
        if (text.find("error") != std::string::npos) break;
    }
    if (!ready) {
        kill(pid, SIGKILL);
        const Measured failed = wait_child(pid, log);
        FAIL() << "fitllm serve did not become ready:\n" << failed.output;
    }

    std::string prompt = "Once upon a time";
    for (int i = 0; i < 20; ++i) prompt += " the story went on";
    const nlohmann::json body = {{"prompt", prompt}, {"max_tokens", 24}, {"temperature", 0.7}, {"stream", true}};
    std::vector<std::thread> clients;
    std::vector<int> events(16, 0), failures(16, 0);
    for (int c = 0; c < 16; ++c) {
        clients.emplace_back([&, c] {
            for (int r = 0; r < 2; ++r) {
                const test::HttpResult res = test::http_request(port, "POST", "/v1/completions", body.dump());
                if (res.status != 200) ++failures[size_t(c)];
                for (size_t at = res.response.find("data: "); at != std::string::npos;
                     at = res.response.find("data: ", at + 1)) {
                    ++events[size_t(c)];
                }
            }
        });
    }
    for (std::thread& t : clients) t.join();
    kill(pid, SIGTERM);
    const Measured served = wait_child(pid, log);
    ASSERT_EQ(served.status, 0) << served.output;
    for (int c = 0; c < 16; ++c) {
        EXPECT_EQ(failures[size_t(c)], 0) << "client " << c;
        EXPECT_GT(events[size_t(c)], 2 * 2) << "client " << c;  // each stream: tokens, the end, [DONE]
    }
    const std::string what = model.filename().string() + " serve -c 2048 -np 4, 16 clients: plan " + mib(plan) +
                             ", tolerance " + mib(tolerance(plan));
    use_cgroup = check_peaks(what, plan, served.max_rss, use_cgroup ? &*cgroup : nullptr, resident_weights);
    if (!demo) GTEST_SKIP() << "checked the tiny model only: the demo model is absent (scripts/setup.sh)";
    if (!use_cgroup) {
        GTEST_SKIP() << "VmHWM checked; the cgroup's peak not: "
                     << (cgroup ? "the model file stays in the page cache (another process maps or reads it)"
                                : no_cgroup);
    }
}

}  // namespace
}  // namespace fitllm
