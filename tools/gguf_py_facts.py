#!/usr/bin/env python3
"""Facts from PyPI's `gguf` package, as JSON, for fitllm's tests to compare against.

  gguf_py_facts.py types            -> {"types": {id: [name, block_elements, block_bytes]}, "file_types": {id: name}}
  gguf_py_facts.py summary FILE     -> architecture, tensor count, total tensor bytes, per-tensor offset/bytes
"""
import json
import sys

import gguf


def types() -> dict:
    return {
        "types": {int(t.value): [t.name, b, s] for t, (b, s) in gguf.GGML_QUANT_SIZES.items()},
        "file_types": {int(f.value): f.name for f in gguf.LlamaFileType},
    }


def summary(path: str) -> dict:
    reader = gguf.GGUFReader(path)
    arch = reader.fields["general.architecture"]
    tensors = [
        {"name": t.name, "type": int(t.tensor_type), "bytes": int(t.n_bytes),
         "offset": int(t.data_offset), "elements": int(t.n_elements),
         "shape": [int(d) for d in t.shape]}
        for t in reader.tensors
    ]
    return {
        "architecture": arch.contents(),
        "metadata_count": sum(1 for k in reader.fields if not k.startswith("GGUF.")),  # skip header pseudo-fields
        "tensor_count": len(tensors),
        "total_bytes": sum(t["bytes"] for t in tensors),
        "tensors": tensors,
    }


if __name__ == "__main__":
    if sys.argv[1] == "types":
        print(json.dumps(types()))
    elif sys.argv[1] == "summary":
        print(json.dumps(summary(sys.argv[2])))
    else:
        sys.exit(f"unknown command {sys.argv[1]}")
