// Diagnosis only (tools/ggml_layer_diff/README.md; not built by CMake): runs llama.cpp (the
// llama-cpp-python build) over a prompt given as token ids and writes every f32 intermediate
// tensor of layers 0 and 1 that its eval callback sees to OUT_DIR/out/NAME_OP.bin: 4 int64 of
// shape (ne0..ne3), then the floats.
//   usage: dump_llama_cpp_tensors MODEL.gguf OUT_DIR ID...
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ggml-backend.h"
#include "ggml.h"
#include "llama.h"

static std::string out_dir;

static bool on_tensor(struct ggml_tensor* t, bool ask, void*) {
    const std::string name = t->name;
    const bool layer_0_or_1 = name.find("-0") != std::string::npos || name.find("-1") == name.size() - 2;
    const bool want =
        t->type == GGML_TYPE_F32 && (layer_0_or_1 || name.rfind("inp_", 0) == 0 || name.rfind("result", 0) == 0);
    if (ask) return want;
    if (!want) return true;
    if (!ggml_is_contiguous(t)) {
        std::printf("not contiguous, skipped: %s\n", t->name);
        return true;
    }
    std::vector<float> buf(ggml_nelements(t));
    ggml_backend_tensor_get(t, buf.data(), 0, ggml_nbytes(t));
    std::string file = out_dir + "/out/" + name + "_" + ggml_op_desc(t) + ".bin";
    for (char& c : file) {
        if (c == ' ') c = '_';
    }
    FILE* f = std::fopen(file.c_str(), "wb");
    if (f == nullptr) {
        std::printf("cannot write %s\n", file.c_str());
        std::exit(1);
    }
    const int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
    std::fwrite(ne, sizeof ne, 1, f);
    std::fwrite(buf.data(), 4, buf.size(), f);
    std::fclose(f);
    return true;
}

int main(int argc, char** argv) {
    if (argc < 4) {
        std::printf("usage: %s MODEL.gguf OUT_DIR ID...\n", argv[0]);
        return 2;
    }
    out_dir = argv[2];
    llama_backend_init();
    llama_model* model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (model == nullptr) return 1;
    std::vector<llama_token> ids;
    for (int i = 3; i < argc; ++i) ids.push_back(std::atoi(argv[i]));
    // The settings of tools/gen_model_goldens.py, so the graph is the goldens' graph.
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 2048;
    cp.n_batch = 2048;
    cp.n_ubatch = 512;
    cp.n_threads = 2;
    cp.n_threads_batch = 2;
    cp.cb_eval = on_tensor;
    cp.cb_eval_user_data = nullptr;
    llama_context* ctx = llama_init_from_model(model, cp);
    llama_batch batch = llama_batch_get_one(ids.data(), static_cast<int32_t>(ids.size()));
    if (llama_decode(ctx, batch) != 0) {
        std::printf("decode failed\n");
        return 1;
    }
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
