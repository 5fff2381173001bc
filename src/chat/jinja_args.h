#pragma once
// Binds a call's positional and keyword arguments to a built-in's parameters the way Python
// does, with Python's messages for the ways a call can go wrong.
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja_value.h"
#include "chat/template_error.h"

namespace fitllm::chat::jinja {

struct Param {
    std::string_view name;
    std::optional<Value> default_value;  // nullopt: required
};

class BoundArgs {
public:
    BoundArgs(std::string_view function, const CallArgs& args, std::initializer_list<Param> params) {
        const std::vector<Param> list(params);
        values_.resize(list.size());
        if (args.positional.size() > list.size())
            throw EvalError(std::string(function) + "() takes at most " + std::to_string(list.size()) +
                            " argument(s) (" + std::to_string(args.positional.size()) + " given)");
        for (size_t i = 0; i < args.positional.size(); ++i) values_[i] = args.positional[i];
        for (const auto& [name, value] : args.keyword) {
            size_t i = 0;
            while (i < list.size() && list[i].name != name) ++i;
            if (i == list.size())
                throw EvalError(std::string(function) + "() got an unexpected keyword argument '" + name + "'");
            if (values_[i])
                throw EvalError(std::string(function) + "() got multiple values for argument '" + name + "'");
            values_[i] = value;
        }
        for (size_t i = 0; i < list.size(); ++i) {
            if (values_[i]) continue;
            if (!list[i].default_value)
                throw EvalError(std::string(function) + "() missing required argument '" + std::string(list[i].name) +
                                "'");
            values_[i] = *list[i].default_value;
        }
    }

    const Value& operator[](size_t i) const { return *values_[i]; }

private:
    std::vector<std::optional<Value>> values_;
};

}  // namespace fitllm::chat::jinja
