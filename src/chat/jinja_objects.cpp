#include "chat/jinja_objects.h"

#include <functional>

#include "chat/jinja_args.h"
#include "chat/py_text.h"
#include "chat/render_budget.h"
#include "chat/template_error.h"

namespace fitllm::chat::jinja {
namespace {

// HF's TemplateNamespace refuses underscore names, so templates cannot reach Python internals.
void check_namespace_name(const Value& name) {
    if (name.is_string() && !name.as_string().empty() && name.as_string()[0] == '_')
        throw EvalError("Chat templates cannot store underscore-prefixed attributes on a namespace, but got " +
                        py::repr(name.as_string()) + ". Please rename the attribute.");
}

class Function : public Callable {
public:
    using Body = std::function<Value(const CallArgs&, CallContext&)>;
    Function(std::string name, Body body) : name_(std::move(name)), body_(std::move(body)) {}
    std::string describe() const override { return "function " + name_; }
    Value call(CallArgs args, CallContext& context) const override { return body_(args, context); }

private:
    std::string name_;
    Body body_;
};

Value function(std::string name, Function::Body body) {
    return Value::callable(std::make_shared<Function>(std::move(name), std::move(body)));
}

int64_t range_int(const Value& v) {
    if (v.is_undefined()) fail_undefined(v);
    if (!v.is_int() && !v.is_bool())
        throw EvalError("'" + type_name(v) + "' object cannot be interpreted as an integer");
    return v.as_int();
}

Value range(const CallArgs& args) {
    if (!args.keyword.empty()) throw EvalError("range() takes no keyword arguments");
    const auto& p = args.positional;
    if (p.empty() || p.size() > 3)
        throw EvalError("range expected at most 3 arguments, got " + std::to_string(p.size()));
    const int64_t start = p.size() == 1 ? 0 : range_int(p[0]);
    const int64_t stop = range_int(p.size() == 1 ? p[0] : p[1]);
    const int64_t step = p.size() == 3 ? range_int(p[2]) : 1;
    if (step == 0) throw EvalError("range() arg 3 must not be zero");
    // Unsigned: stop - start overflows int64 for range(-2**63, 2**63 - 1), never uint64.
    const bool up = step > 0;
    const uint64_t span = up ? (stop > start ? static_cast<uint64_t>(stop) - static_cast<uint64_t>(start) : 0)
                             : (start > stop ? static_cast<uint64_t>(start) - static_cast<uint64_t>(stop) : 0);
    const uint64_t stride = up ? static_cast<uint64_t>(step) : 0 - static_cast<uint64_t>(step);
    const uint64_t count = span / stride + (span % stride != 0);
    constexpr uint64_t kMaxRange = 100000;  // jinja2's sandbox limit
    if (count > kMaxRange) throw EvalError("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    ValueList out;
    out.reserve(static_cast<size_t>(count));
    for (uint64_t i = 0; i < count; ++i)  // start + i * step, in modular arithmetic: always within [start, stop)
        out.push_back(
            Value::integer(static_cast<int64_t>(static_cast<uint64_t>(start) + i * static_cast<uint64_t>(step))));
    return Value::list(std::move(out));
}

// Python's dict(*args, **kwargs), also behind namespace().
Dict make_dict(const CallArgs& args, std::string_view function_name) {
    if (args.positional.size() > 1)
        throw EvalError(std::string(function_name) + " expected at most 1 argument, got " +
                        std::to_string(args.positional.size()));
    Dict d;
    if (!args.positional.empty()) {
        const Value& source = args.positional[0];
        if (source.is_undefined()) fail_undefined(source);  // dict() asks it for .keys() first
        if (source.is_dict()) {
            d = source.as_dict();
        } else {
            for (const Value& pair : iterate(source)) {
                const Items kv = iterate(pair);
                if (kv.size() != 2)
                    throw EvalError("dictionary update sequence element has length " + std::to_string(kv.size()) +
                                    "; 2 is required");
                d.set(kv[0], kv[1]);
            }
        }
    }
    for (const auto& [k, v] : args.keyword) d.set(Value::string(k), v);
    return d;
}

}  // namespace

std::optional<Value> NamespaceObject::attribute(std::string_view name) const {
    if (const Value* v = attributes_.find(name)) return *v;
    return std::nullopt;
}

bool NamespaceObject::set_attribute(std::string_view name, Value value) {
    check_namespace_name(Value::string(std::string(name)));
    attributes_.set(Value::string(std::string(name)), std::move(value));
    return true;
}

class LoopChanged : public Callable {
public:
    explicit LoopChanged(std::shared_ptr<const LoopObject> loop) : loop_(std::move(loop)) {}
    std::string describe() const override { return "bound method LoopContext.changed"; }
    Value call(CallArgs args, CallContext&) const override {
        const Value current = Value::tuple(args.positional);
        if (loop_->last_changed_ && equals(*loop_->last_changed_, current)) return Value::boolean(false);
        loop_->last_changed_ = current;
        return Value::boolean(true);
    }

private:
    std::shared_ptr<const LoopObject> loop_;
};

std::optional<Value> LoopObject::attribute(std::string_view name) const {
    const auto n = static_cast<int64_t>(items_.size());
    const auto i = static_cast<int64_t>(index_);
    if (name == "index") return Value::integer(i + 1);
    if (name == "index0") return Value::integer(i);
    if (name == "revindex") return Value::integer(n - i);
    if (name == "revindex0") return Value::integer(n - i - 1);
    if (name == "first") return Value::boolean(i == 0);
    if (name == "last") return Value::boolean(i == n - 1);
    if (name == "length") return Value::integer(n);
    if (name == "depth") return Value::integer(1);
    if (name == "depth0") return Value::integer(0);
    if (name == "previtem") return i > 0 ? items_[index_ - 1] : Value::undefined("there is no previous item");
    if (name == "nextitem") return i + 1 < n ? items_[index_ + 1] : Value::undefined("there is no next item");
    if (name == "cycle") {
        const size_t at = index_;
        return function("cycle", [at](const CallArgs& args, CallContext&) {
            if (args.positional.empty()) throw EvalError("no items for cycling given");
            return args.positional[at % args.positional.size()];
        });
    }
    if (name == "changed") return Value::callable(std::make_shared<LoopChanged>(shared_from_this()));
    return std::nullopt;
}

std::string LoopObject::repr() const {
    return "<LoopContext " + std::to_string(index_ + 1) + "/" + std::to_string(items_.size()) + ">";
}

Dict builtin_globals() {
    Dict g;
    g.set(Value::string("range"), function("range", [](const CallArgs& args, CallContext&) { return range(args); }));
    g.set(Value::string("dict"),
          function("dict", [](const CallArgs& args, CallContext&) { return Value::dict(make_dict(args, "dict")); }));
    g.set(Value::string("namespace"), function("namespace", [](const CallArgs& args, CallContext& context) {
              Dict attributes = make_dict(args, "namespace");
              for (const auto& entry : attributes.entries()) check_namespace_name(entry.first);
              auto object = std::make_shared<NamespaceObject>(std::move(attributes));
              context.adopt(object);
              return Value::object(std::move(object));
          }));
    g.set(Value::string("raise_exception"),
          function("raise_exception", [](const CallArgs& args, CallContext&) -> Value {
              BoundArgs a("raise_exception", args, {{"message", std::nullopt}});
              throw EvalError(to_str(a[0]), EvalError::Kind::raised);
          }));
    g.set(Value::string("strftime_now"), function("strftime_now", [](const CallArgs& args, CallContext& context) {
              BoundArgs a("strftime_now", args, {{"format", std::nullopt}});
              const std::string format = to_str(a[0]);
              const std::tm now = context.now();
              check_value_size(256 + format.size() * 8, "strftime_now's buffer");
              std::string out(256 + format.size() * 8, '\0');
              const size_t n = format.empty() ? 0 : std::strftime(out.data(), out.size(), format.c_str(), &now);
              out.resize(n);
              return Value::string(std::move(out));
          }));
    for (const char* name : {"lipsum", "cycler", "joiner"}) {
        const std::string n = name;
        g.set(Value::string(n), function(n, [n](const CallArgs&, CallContext&) -> Value {
                  throw EvalError("jinja2's " + n + "() is not supported by fitllm's template engine",
                                  EvalError::Kind::unsupported);
              }));
    }
    return g;
}

}  // namespace fitllm::chat::jinja
