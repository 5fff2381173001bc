#pragma once
// The objects templates create or receive beside plain data: namespace() objects, the `loop`
// variable of a for loop, and the global functions of HF's chat-template environment.
#include <memory>
#include <string>

#include "chat/jinja_value.h"

namespace fitllm::chat::jinja {

// namespace(...): attributes a template may assign with `{% set ns.attr = value %}`.
class NamespaceObject : public Object {
public:
    explicit NamespaceObject(Dict attributes) : attributes_(std::move(attributes)) {}
    std::string type_name() const override { return "transformers.utils.chat_template_utils.TemplateNamespace"; }
    std::optional<Value> attribute(std::string_view name) const override;
    bool set_attribute(std::string_view name, Value value) override;
    std::string repr() const override { return "<Namespace " + to_repr(Value::dict(attributes_)) + ">"; }
    void clear() override {
        const Dict dropped = std::move(attributes_);  // destroyed here, its values disposed of
        attributes_ = Dict();
    }

private:
    Dict attributes_;
};

// jinja2's LoopContext for one pass over `items`; the evaluator moves it along with advance().
class LoopObject : public Object, public std::enable_shared_from_this<LoopObject> {
public:
    explicit LoopObject(Items items) : items_(std::move(items)) {}
    void advance() { ++index_; }
    std::string type_name() const override { return "jinja2.runtime.LoopContext"; }
    std::optional<Value> attribute(std::string_view name) const override;
    std::string repr() const override;

private:
    friend class LoopChanged;
    Items items_;
    size_t index_ = 0;
    mutable std::optional<Value> last_changed_;
};

// range, dict, namespace, raise_exception, strftime_now (and jinja2's lipsum, cycler and
// joiner, which fail as unsupported when called).
Dict builtin_globals();

}  // namespace fitllm::chat::jinja
