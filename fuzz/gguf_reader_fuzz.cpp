// libFuzzer target for the GGUF reader. The reader promises that a file which parses is safe
// to index, so on success this touches everything a caller could reach (every value, every
// array element shown, the first and last byte of every tensor) and then checks that the
// writer can reproduce the file: writing it back and parsing again must give the same keys,
// types, shapes and tensor bytes. A parse error is the expected outcome for most inputs; only
// fitllm::Error may escape the library, anything else (or a sanitizer report) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_value.h"
#include "gguf/gguf_writer.h"

namespace {

using fitllm::gguf::GgufFile;
using fitllm::gguf::GgufWriter;
using fitllm::gguf::TensorInfo;
using fitllm::gguf::Value;
using fitllm::gguf::ValueType;

// An invariant of the reader or writer is broken: report it the way libFuzzer understands.
[[noreturn]] void broken(const char* what, int line) {
    std::fprintf(stderr, "gguf_reader_fuzz: invariant broken at line %d: %s\n", line, what);
    std::abort();
}
#define FUZZ_CHECK(cond) ((cond) ? void(0) : broken(#cond, __LINE__))

// Reads a byte through a volatile sink so the compiler keeps the access for ASan to see.
volatile unsigned char g_sink;
void touch(const void* p) {
    g_sink = *static_cast<const volatile unsigned char*>(p);
}
void touch_ends(std::span<const std::byte> s) {
    if (s.empty()) return;
    touch(&s.front());
    touch(&s.back());
}
void touch_ends(std::string_view s) {
    touch_ends(std::as_bytes(std::span(s.data(), s.size())));
}

bool inside(std::span<const std::byte> part, std::span<const std::byte> whole) {
    if (part.empty()) return true;
    return part.data() >= whole.data() && part.size() <= whole.size() &&
           part.data() - whole.data() <= static_cast<std::ptrdiff_t>(whole.size() - part.size());
}

void touch_value(const GgufFile& f, const Value& v) {
    (void)v.to_display();
    (void)v.to_display(SIZE_MAX, SIZE_MAX);  // every element, every character
    FUZZ_CHECK(f.find(v.key()) == &v);       // keys are unique, so find() lands on this value
    FUZZ_CHECK(&f.at(v.key()) == &v);
    if (v.type() == ValueType::STRING) {
        const std::string_view s = v.get<std::string_view>();
        touch_ends(s);
        FUZZ_CHECK(inside(std::as_bytes(std::span(s.data(), s.size())), f.bytes()));
    } else if (v.is_array() && v.array_type() == ValueType::STRING) {
        FUZZ_CHECK(v.strings().size() == v.array_size());
        for (std::string_view s : v.strings()) touch_ends(s);
    } else if (v.is_array()) {
        const std::span<const std::byte> raw = v.raw_array_bytes();
        FUZZ_CHECK(raw.size() == v.array_size() * fitllm::gguf::scalar_size(v.array_type()));
        FUZZ_CHECK(inside(raw, f.bytes()));
        touch_ends(raw);
    } else {
        touch_ends(v.raw_scalar_bytes());
        // The lenient getters refuse some types (floats as int, bool as double, uint64 above
        // INT64_MAX) with KeyError: fine, as long as nothing else happens.
        try {
            (void)v.to_int();
        } catch (const fitllm::gguf::KeyError&) {
        }
        try {
            (void)v.to_double();
        } catch (const fitllm::gguf::KeyError&) {
        }
    }
}

void touch_tensor(const GgufFile& f, const TensorInfo& t) {
    FUZZ_CHECK(f.find_tensor(t.name) == &t);
    FUZZ_CHECK(t.data.size() == t.n_bytes);
    FUZZ_CHECK(t.offset % f.alignment() == 0);
    FUZZ_CHECK(inside(t.data, f.bytes()));
    if (!t.data.empty()) FUZZ_CHECK(t.data.data() == f.bytes().data() + f.data_offset() + t.offset);
    touch_ends(t.data);
}

std::vector<int64_t> dims_of(const TensorInfo& t) {
    return {t.ne.begin(), t.ne.begin() + t.n_dims};
}

std::vector<std::byte> rewrite(const GgufFile& f) {
    try {
        GgufWriter w(f.version());
        for (const Value& v : f.metadata()) w.add_value(v);
        for (const TensorInfo& t : f.tensors()) w.add_tensor(t.name, t.type, dims_of(t), t.data);
        return w.to_bytes();
    } catch (const fitllm::Error& e) {
        std::fprintf(stderr, "gguf_reader_fuzz: the writer refuses what the reader accepted: %s\n", e.what());
        std::abort();
    }
}

// Writes the parsed file back out and parses the result; both must describe the same model,
// and the writer's output is canonical: writing it out again gives the same bytes.
void check_round_trip(const GgufFile& f) {
    // The writer pads the header to the alignment even without tensors, so a (valid) vocab-only
    // file declaring a 2 GiB alignment would make it allocate 2 GiB: not what we test here.
    if (f.alignment() > (1u << 20)) return;
    // The reader accepts scalar tensors (n_dims 0, as ggml does); the writer wants 1 to 4
    // dimensions. Anything else the reader accepted, the writer must take too.
    for (const TensorInfo& t : f.tensors()) {
        if (t.n_dims == 0) return;
    }
    const std::vector<std::byte> bytes = rewrite(f);
    std::optional<GgufFile> parsed;
    try {
        parsed.emplace(GgufFile::parse(bytes, "round trip"));
    } catch (const fitllm::Error& e) {
        std::fprintf(stderr, "gguf_reader_fuzz: the writer's output does not parse: %s\n", e.what());
        std::abort();
    }
    const GgufFile& g = *parsed;
    FUZZ_CHECK(g.version() == f.version());
    FUZZ_CHECK(g.alignment() == f.alignment());
    FUZZ_CHECK(g.metadata().size() == f.metadata().size());
    for (size_t i = 0; i < f.metadata().size(); ++i) {
        const Value& a = f.metadata()[i];
        const Value& b = g.metadata()[i];
        FUZZ_CHECK(a.key() == b.key());
        FUZZ_CHECK(a.type_name() == b.type_name());
        FUZZ_CHECK(a.array_size() == b.array_size());
        FUZZ_CHECK(a.to_display(SIZE_MAX, SIZE_MAX) == b.to_display(SIZE_MAX, SIZE_MAX));
    }
    FUZZ_CHECK(g.tensors().size() == f.tensors().size());
    for (size_t i = 0; i < f.tensors().size(); ++i) {
        const TensorInfo& a = f.tensors()[i];
        const TensorInfo& b = g.tensors()[i];
        FUZZ_CHECK(a.name == b.name);
        FUZZ_CHECK(a.type == b.type);
        FUZZ_CHECK(a.n_dims == b.n_dims);
        FUZZ_CHECK(a.ne == b.ne);
        FUZZ_CHECK(a.n_elements == b.n_elements);
        FUZZ_CHECK(a.n_bytes == b.n_bytes);
        FUZZ_CHECK(a.data.size() == b.data.size());
        FUZZ_CHECK(a.data.empty() || std::memcmp(a.data.data(), b.data.data(), a.data.size()) == 0);
    }
    FUZZ_CHECK(rewrite(g) == bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto bytes = std::as_bytes(std::span(data, size));
    try {
        const GgufFile f = GgufFile::parse(bytes, "fuzz input");
        FUZZ_CHECK(f.version() == 2 || f.version() == 3);
        FUZZ_CHECK(f.alignment() != 0 && (f.alignment() & (f.alignment() - 1)) == 0);
        FUZZ_CHECK(f.data_offset() % f.alignment() == 0);
        FUZZ_CHECK(f.tensors().empty() || f.data_offset() <= f.size());
        for (const Value& v : f.metadata()) touch_value(f, v);
        for (const TensorInfo& t : f.tensors()) touch_tensor(f, t);
        (void)f.find("general.architecture");
        (void)f.find_tensor("token_embd.weight");
        check_round_trip(f);
    } catch (const fitllm::gguf::FormatError& e) {
        // Malformed input, reported as such: the expected outcome. The error must still point
        // into the file and name a field, or the user cannot find what is wrong.
        FUZZ_CHECK(e.offset() <= size);
        FUZZ_CHECK(!e.field().empty());
    } catch (const fitllm::Error&) {
        // Only FormatError is expected from parse(); other library errors (KeyError from a
        // getter) are not findings either.
    }
    return 0;
}
