#pragma once
// Values of the template language, with the semantics Python gives them under jinja2: what
// is true, how values print (str and repr), compare, iterate and turn into JSON. HF's sandbox
// forbids changing a list or dict in place, so containers are immutable and shared: copying
// a Value is cheap. Only namespace() objects change, through `{% set ns.attr = ... %}`.
//
// Templates are untrusted, so values keep to the render's budget (chat/render_budget.h): a
// string, list or dict is checked against max_value_bytes and charged to the render's meter
// when it is made, and released when its last copy goes; walks over values (repr, ==, tojson)
// stop at max_depth; destroying a deeply nested value does not recurse.
#include <cstdint>
#include <ctime>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
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
    // The last reference to a container, object or callable (its destruction may cascade).
    bool owns_nested() const;

private:
    Kind kind_ = Kind::undefined;
    bool markup_ = false;
    bool bool_ = false;
    int64_t int_ = 0;
    double float_ = 0;
    std::shared_ptr<void> ptr_;  // string/reason, ValueList, Dict, Object or Callable by kind_
};

// A Python dict: insertion-ordered, keys compared with Python's ==. String keys (nearly all)
// are found through a hash index once the dict is large enough for scanning to cost.
class Dict {
public:
    Dict() = default;
    Dict(const Dict& other);
    Dict& operator=(const Dict& other);
    Dict(Dict&&) = default;
    Dict& operator=(Dict&&) = default;
    ~Dict();

    const Value* find(const Value& key) const;
    const Value* find(std::string_view key) const;
    // Replaces the value of an existing key in place (keeping its position), else appends.
    void set(Value key, Value value);
    size_t size() const { return entries_.size(); }
    bool empty() const { return entries_.empty(); }
    const std::vector<std::pair<Value, Value>>& entries() const { return entries_; }
    // Heap bytes of the entries and the index, for the render's meter.
    uint64_t heap_bytes() const;

private:
    std::optional<size_t> position(const Value& key) const;
    void index_from(size_t first);

    std::vector<std::pair<Value, Value>> entries_;
    // Once indexed: key text -> position (views into the keys' own, immutable, strings), and
    // the integer a number key equals -> position. Other keys are compared one by one.
    bool indexed_ = false;
    std::unordered_map<std::string_view, size_t> string_index_;
    std::unordered_map<int64_t, size_t> number_index_;
};

// What a for loop (and every filter that walks a value) sees: the items of a list, tuple or
// iterator, shared rather than copied, or the characters of a string and the keys of a dict,
// made for the occasion (and charged like any list).
class Items {
public:
    Items() = default;
    explicit Items(Value holder) : holder_(std::move(holder)) {}
    const Value* begin() const;
    const Value* end() const { return begin() + size(); }
    size_t size() const;
    bool empty() const { return size() == 0; }
    const Value& operator[](size_t i) const { return begin()[i]; }
    const Value& front() const { return *begin(); }
    const Value& back() const { return end()[-1]; }
    ValueList copy() const { return ValueList(begin(), end()); }
    // A list of the items (the same list when they are one).
    Value as_list() const;

private:
    Value holder_;  // a list, tuple or iterator; undefined for no items
};

// Destroys values without recursing as deep as they nest: a value whose last reference goes
// while another is being destroyed waits in a queue that the outermost destruction empties.
// Payloads and objects that hold values call these from their destructors.
void dispose(ValueList& values) noexcept;
void dispose(Value& value) noexcept;

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
    // An object the call made that may come to hold itself (namespace()): the renderer clears
    // it (Object::clear) when the render ends, so that such a cycle does not outlive it.
    virtual void adopt(const std::shared_ptr<Object>& /*object*/) {}
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
    // Drops the values it holds: objects can form reference cycles (a namespace holding
    // itself), which the renderer breaks this way when the render ends.
    virtual void clear() {}
};

// One level of a walk over a value (repr, ==, ordering, tojson) for as long as it lives, on a
// counter of the thread's: EvalError (Kind::limit) past the render's max_depth, however the
// walks nest (a namespace's repr prints its attributes through to_repr).
class ValueWalk {
public:
    ValueWalk();
    ~ValueWalk();
    ValueWalk(const ValueWalk&) = delete;
    ValueWalk& operator=(const ValueWalk&) = delete;
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
Items iterate(const Value& v);
// A measure of the work of reading v, for the render's step count: one per 64 bytes of a
// string, one per 8 items of a container.
uint64_t read_cost(const Value& v);
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
