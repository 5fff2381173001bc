#pragma once
// The K transform file of a persistent prompt cache with shaped keys (engine/prompt_cache.h):
// keys-ID.fitllm-keys beside the prompt files, every layer's fitted transform (kv/key_transform.h)
// of each pool that shapes K, so that a later run stores its keys with the same transform and can
// read the earlier prompt files. A header (magic, version, layer count, the model's identity, the
// name's identity, the file's size, the hash of what follows), then per layer (pool by pool, layer
// by layer) a record (kind, heads, head size) and the transform's numbers
// (kv::KeyTransform::numbers(), whose sizes the record gives).
//
//   const uint64_t key = key_transform_file_key(model, layout, cache);
//   const std::string path = dir + "/" + key_transform_file_name(key);
//   KeyTransformLoad got = load_key_transform_file(fd, cache, model, key);  // at the start
//   ...
//   const uint64_t id = key_transforms_identity(cache);  // once every layer is fitted
//   std::string why = write_key_transform_file(temp, path, cache, model, key, id);
#include <cstdint>
#include <string>

#include "kv/cache.h"

namespace fitllm::engine {

// The identity a file's name carries: the model, the KV layout (kv_layout_identity()) and whether
// each pool limits its transform.
uint64_t key_transform_file_key(uint64_t model, uint64_t layout, const kv::ModelCache& cache);
std::string key_transform_file_name(uint64_t key);  // keys-KEY.fitllm-keys

// The identity of the transforms the pools that shape K hold (the hash a file of them carries);
// 0 while one is not fitted.
uint64_t key_transforms_identity(const kv::ModelCache& cache);

struct KeyTransformLoad {
    std::string why;        // empty when read: the pools hold the file's transforms
    uint64_t identity = 0;  // their key_transforms_identity() (0 when not read)
};
// Reads the file open at fd whole, checked against the cache, the model and the name's key, and
// then (only then) gives each pool layer that shapes K its transform. On failure why says what is
// wrong (truncated, corrupt, mismatched, not such a file) and where; the pools are untouched.
KeyTransformLoad load_key_transform_file(int fd, kv::ModelCache& cache, uint64_t model, uint64_t key);

// Writes the pools' transforms (identity: key_transforms_identity()) to `temp` (created, flocked,
// synced), then links it to `path`, never replacing a file there; temp is removed. Empty when
// path holds them, else why not.
std::string write_key_transform_file(const std::string& temp, const std::string& path, const kv::ModelCache& cache,
                                     uint64_t model, uint64_t key, uint64_t identity);

}  // namespace fitllm::engine
