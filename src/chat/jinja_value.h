#pragma once
// Values of the template language, with the semantics Python gives them under jinja2: what
// is true, how values print (str and repr), compare, iterate and turn into JSON. HF's sandbox
// forbids changing a list or dict in place, so containers are immutable and shared: copying
// a Value is cheap. Only namespace() objects change, through `{% set ns.attr = ... %}`.
#include <cstdint>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fitllm::chat::jinja {

class Value;
class Dict;
class Object;
class Callable;

using ValueList = std::vector<Value>;

class Value {
public:
    enum class Kind : uint8_t {
        undefined,
        none,
        boolean,
        integer,
        floating,
        string,
        list,
        tuple,
        dict,
        object,
        callable,
        iterator
    };
    // Python iterables that are not lists: what filters like map and select return (a
    // generator: always true, no length, no indexing), reversed(), and dict.keys()/values()/
    // items() views (with a length). Only printing, truthiness and len() tell them apart.
    enum class IteratorKind : uint8_t { generator, reversed, dict_keys, dict_values, dict_items };

    Value() = default;  // undefined, with no explanation
    // An undefined value; `reason` is what jinja2 says when the value is used (printing it is fine).
    static Value undefined(std::string reason);
    static Value none();
    static Value boolean(bool b);
    static Value integer(int64_t i);
    static Value floating(double f);
    // markup: a markupsafe.Markup string (from |safe or |escape), which escapes what is added to it.
    static Value string(std::string s, bool markup = false);
    static Value list(ValueList items);
    static Value tuple(ValueList items);
    static Value dict(Dict d);
    static Value object(std::shared_ptr<Object> o);
    static Value callable(std::shared_ptr<const Callable> c);
    static Value iterator(IteratorKind kind, ValueList items);
    // A generator whose computation failed: Python raises only once something iterates it
    // (a jinja2 filter like map or select on a bad input fails when its result is used).
    static Value failed_generator(std::string error);

    Kind kind() const { return kind_; }
    bool is_undefined() const { return kind_ == Kind::undefined; }
    bool is_none() const { return kind_ == Kind::none; }
    bool is_bool() const { return kind_ == Kind::boolean; }
    bool is_int() const { return kind_ == Kind::integer; }
    bool is_float() const { return kind_ == Kind::floating; }
    // Python's numbers.Number: bool counts, as True + 1 == 2.
    bool is_number() const { return kind_ == Kind::boolean || kind_ == Kind::integer || kind_ == Kind::floating; }
    bool is_string() const { return kind_ == Kind::string; }
    bool is_markup() const { return kind_ == Kind::string && markup_; }
    bool is_list() const { return kind_ == Kind::list; }
    bool is_tuple() const { return kind_ == Kind::tuple; }
    bool is_sequence() const { return kind_ == Kind::list || kind_ == Kind::tuple; }
    bool is_dict() const { return kind_ == Kind::dict; }
    bool is_object() const { return kind_ == Kind::object; }
    bool is_callable() const { return kind_ == Kind::callable; }
    bool is_iterator() const { return kind_ == Kind::iterator; }
    IteratorKind iterator_kind() const { return static_cast<IteratorKind>(int_); }
    // dict views have a length and are false when empty; generators and reversed() do not.
    bool is_dict_view() const { return kind_ == Kind::iterator && iterator_kind() >= IteratorKind::dict_keys; }
    // The error a failed generator raises when iterated; empty otherwise.
    const std::string& pending_error() const;

    bool as_bool() const { return bool_; }
    // bool or int as int64.
    int64_t as_int() const { return kind_ == Kind::boolean ? (bool_ ? 1 : 0) : int_; }
    // Any number as double.
    double as_double() const;
    const std::string& as_string() const;
    const ValueList& items() const;  // list, tuple or iterator
    const Dict& as_dict() const;
    Object& as_object() const;
    const Callable& as_callable() const;
    const std::string& undefined_reason() const;
    // Python's `is`: the same object (or equal singletons and small scalars).
    bool is_same(const Value& other) const;

private:
    Kind kind_ = Kind::undefined;
    bool markup_ = false;
    bool bool_ = false;
    int64_t int_ = 0;
    double float_ = 0;
    std::shared_ptr<void> ptr_;  // string/reason, ValueList, Dict, Object or Callable by kind_
};

// A Python dict: insertion-ordered, keys compared with Python's ==.
class Dict {
public:
    const Value* find(const Value& key) const;
    const Value* find(std::string_view key) const;
    // Replaces the value of an existing key in place (keeping its position), else appends.
    void set(Value key, Value value);
    size_t size() const { return entries_.size(); }
    bool empty() const { return entries_.empty(); }
    const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }

private:
    std::vector<std::pair<Value, Value>> entries_;
};

// Positional then keyword arguments of a call, in source order.
struct CallArgs {
    ValueList positional;
    std::vector<std::pair<std::string, Value>> keyword;
};

// What a callable may ask of the renderer that calls it.
class CallContext {
public:
    virtual ~CallContext() = default;
    // strftime_now's clock reading, as local broken-down time.
    virtual std::tm now() const = 0;
};

class Callable {
public:
    virtual ~Callable() = default;
    // For repr and messages, e.g. "built-in method strip of str object", "Macro 'render'".
    virtual std::string describe() const = 0;
    virtual Value call(CallArgs args, CallContext& context) const = 0;
};

// Objects with attributes: namespace(), the loop variable.
class Object {
public:
    virtual ~Object() = default;
    // Python's qualified type name, for jinja2's messages ("jinja2.utils.Namespace").
    virtual std::string type_name() const = 0;
    // nullopt when there is no such attribute.
    virtual std::optional<Value> attribute(std::string_view name) const = 0;
    // `{% set obj.name = value %}`; false when the object does not allow it.
    virtual bool set_attribute(std::string_view /*name*/, Value /*value*/) { return false; }
    virtual std::string repr() const = 0;
};

// Python truthiness (undefined is false).
bool truthy(const Value& v);
// str(v) and repr(v) as CPython prints them; str(undefined) is "".
std::string to_str(const Value& v);
std::string to_repr(const Value& v);
// type(v).__name__, e.g. "str", "NoneType", "dict".
std::string type_name(const Value& v);
// jinja2's object_type_repr: "dict object", "None", "jinja2.utils.Namespace object".
std::string object_type_repr(const Value& v);
// Python's ==.
bool equals(const Value& a, const Value& b);
// Python's ordering for <, <=, >, >=: negative, zero or positive. EvalError ("'<' not supported
// between instances of 'str' and 'int'") for values Python cannot order; op names the operator.
int compare(const Value& a, const Value& b, std::string_view op = "<");
// Throws EvalError with the reason an undefined value carries.
[[noreturn]] void fail_undefined(const Value& v);
// The items a for loop sees: list/tuple items, dict keys, string characters, nothing for undefined.
ValueList iterate(const Value& v);
// len(v); EvalError for values without a length.
int64_t length_of(const Value& v);
// HTML escaping as markupsafe.escape does it, for |escape and Markup arithmetic.
std::string html_escape(std::string_view s);

// JSON input (chat messages, tools) as template values; objects keep their key order.
Value from_json(const nlohmann::ordered_json& j);
Value from_json(const nlohmann::json& j);

// json.dumps as HF's tojson filter calls it.
struct JsonFormat {
    bool ensure_ascii = false;
    std::optional<std::string> indent;                              // nullopt: one line
    std::optional<std::pair<std::string, std::string>> separators;  // (item, key); default by indent
    bool sort_keys = false;
};
std::string to_json(const Value& v, const JsonFormat& format);

}  // namespace fitllm::chat::jinja
