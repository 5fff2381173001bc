#pragma once
// Placement by tensor class (llama.cpp's --override-tensor / -ot, --cpu-moe, --n-cpu-moe): rules that
// keep tensors of offloaded layers in host memory. model::LoadOptions and engine::PlanParams carry
// them; model/offload.h applies them (experts_on_host). Internal to model/ and engine/.
#include <string>
#include <string_view>
#include <vector>

namespace fitllm::model {

// One rule: a tensor whose name `pattern` (an ECMAScript regular expression) is found in goes to
// `device`: "CPU" (the host) or the offload device's name, case-insensitive ("virtual", "cuda0" or
// "CUDA0"). The first rule that matches a tensor decides. `flag` is how the user gave it, for
// messages: "-ot exps=CPU", "--cpu-moe", "--n-cpu-moe 3".
struct TensorOverride {
    std::string pattern;
    std::string device;
    std::string flag;
};

// "REGEX=DEVICE[,REGEX=DEVICE...]" (llama.cpp's syntax: split at commas, each at its last '='), as
// given to `flag` ("-ot"). Throws std::invalid_argument naming the flag and the item for an item
// without '=' or with an empty pattern or device, or a pattern std::regex refuses.
std::vector<TensorOverride> parse_tensor_overrides(std::string_view list, std::string_view flag);

// llama.cpp's --cpu-moe (n_layers < 0: every layer) and --n-cpu-moe N (the first N layers): their
// routed experts' tensors (blk.<i>.ffn_{gate,up,down}_exps) on the host.
std::vector<TensorOverride> cpu_moe_overrides(int n_layers);

}  // namespace fitllm::model
