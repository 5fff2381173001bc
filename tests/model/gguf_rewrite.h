#pragma once
// Copies of the generated test models (tests/model/data/) with metadata or tensors changed, and
// what loading such a copy says: for the architectures' refusal tests.
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "model/hparams.h"
#include "model/model.h"
#include "test_support.h"

namespace fitllm::test {

inline gguf::GgufFile open_tiny(const std::string& name) {
    return gguf::GgufFile::open((source_dir() / "tests/model/data" / (name + ".gguf")).string());
}

// A copy of `source`, its metadata filtered by keep_key and extended by add, each tensor passed
// through tensor(name, bytes) (false drops it; the bytes may be changed).
struct Rewrite {
    std::function<bool(const std::string&)> keep_key = [](const std::string&) { return true; };
    std::function<void(gguf::GgufWriter&)> add = [](gguf::GgufWriter&) {};
    std::function<bool(const std::string&, std::vector<std::byte>&)> tensor =
        [](const std::string&, std::vector<std::byte>&) { return true; };
};

inline std::vector<std::byte> rewrite(const gguf::GgufFile& source, const Rewrite& r) {
    gguf::GgufWriter w;
    for (const gguf::Value& v : source.metadata()) {
        if (r.keep_key(std::string(v.key()))) w.add_value(v);
    }
    r.add(w);
    for (const gguf::TensorInfo& t : source.tensors()) {
        std::vector<std::byte> data(t.data.begin(), t.data.end());
        if (!r.tensor(std::string(t.name), data)) continue;
        w.add_tensor(t.name, t.type, std::span<const int64_t>(t.ne.data(), t.n_dims), std::move(data));
    }
    return w.to_bytes();
}

// The ModelError of loading bytes ("" when they load).
inline std::string load_error(const std::vector<std::byte>& bytes, const std::string& source = "model.gguf") {
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, source);
    try {
        model::Model::load(file);
    } catch (const model::ModelError& e) {
        return e.what();
    }
    return "";
}

}  // namespace fitllm::test
