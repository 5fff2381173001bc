#include "chat/jinja_value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "chat/py_text.h"
#include "chat/render_budget.h"
#include "chat/template_error.h"

namespace fitllm::chat::jinja {

namespace {

// Heap bytes of a payload beside its contents: the shared_ptr's control block, the payload's
// own members, the allocator's rounding.
constexpr uint64_t kPayloadOverhead = 96;

uint64_t string_heap_bytes(const std::string& s) {
    return s.capacity() > 15 ? s.capacity() + 1 : 0;
}

struct TextPayload {  // a string's text, or an undefined value's reason
    explicit TextPayload(std::string t) : text(std::move(t)) { charge.add(kPayloadOverhead + string_heap_bytes(text)); }
    std::string text;
    MeteredBytes charge;
};

struct ItemsPayload {  // a list's, tuple's or iterator's items
    ItemsPayload(ValueList i, std::string e) : items(std::move(i)), error(std::move(e)) {
        charge.add(kPayloadOverhead + items.capacity() * sizeof(Value) + string_heap_bytes(error));
    }
    ~ItemsPayload() { dispose(items); }
    ValueList items;
    std::string error;  // a failed generator's error, raised when it is iterated
    MeteredBytes charge;
};

struct DictPayload {
    explicit DictPayload(Dict d) : dict(std::move(d)) { charge.add(kPayloadOverhead + dict.heap_bytes()); }
    Dict dict;
    MeteredBytes charge;
};

std::shared_ptr<ItemsPayload> items_payload(ValueList items, std::string error = {}) {
    check_value_size(static_cast<uint64_t>(items.size()) * sizeof(Value), "list");
    return std::make_shared<ItemsPayload>(std::move(items), std::move(error));
}

// Values that wait to be destroyed while another one is (see dispose()).
struct Disposal {
    bool running = false;
    std::vector<Value> pending;
};
thread_local Disposal t_disposal;

}  // namespace

Value Value::undefined(std::string reason) {
    Value v;
    v.ptr_ = std::make_shared<TextPayload>(std::move(reason));
    return v;
}
Value Value::none() {
    Value v;
    v.kind_ = Kind::none;
    return v;
}
Value Value::boolean(bool b) {
    Value v;
    v.kind_ = Kind::boolean;
    v.bool_ = b;
    return v;
}
Value Value::integer(int64_t i) {
    Value v;
    v.kind_ = Kind::integer;
    v.int_ = i;
    return v;
}
Value Value::floating(double f) {
    Value v;
    v.kind_ = Kind::floating;
    v.float_ = f;
    return v;
}
Value Value::string(std::string s, bool markup) {
    check_value_size(s.size(), "string");
    Value v;
    v.kind_ = Kind::string;
    v.markup_ = markup;
    v.ptr_ = std::make_shared<TextPayload>(std::move(s));
    return v;
}
Value Value::list(ValueList items) {
    Value v;
    v.kind_ = Kind::list;
    v.ptr_ = items_payload(std::move(items));
    return v;
}
Value Value::tuple(ValueList items) {
    Value v;
    v.kind_ = Kind::tuple;
    v.ptr_ = items_payload(std::move(items));
    return v;
}
Value Value::dict(Dict d) {
    check_value_size(d.heap_bytes(), "dict");
    Value v;
    v.kind_ = Kind::dict;
    v.ptr_ = std::make_shared<DictPayload>(std::move(d));
    return v;
}
Value Value::object(std::shared_ptr<Object> o) {
    Value v;
    v.kind_ = Kind::object;
    v.ptr_ = std::move(o);
    return v;
}
Value Value::callable(std::shared_ptr<const Callable> c) {
    Value v;
    v.kind_ = Kind::callable;
    v.ptr_ = std::const_pointer_cast<Callable>(std::move(c));
    return v;
}

Value Value::iterator(IteratorKind kind, ValueList items) {
    Value v;
    v.kind_ = Kind::iterator;
    v.int_ = static_cast<int64_t>(kind);
    v.ptr_ = items_payload(std::move(items));
    return v;
}

Value Value::failed_generator(std::string error) {
    Value v;
    v.kind_ = Kind::iterator;
    v.int_ = static_cast<int64_t>(IteratorKind::generator);
    v.ptr_ = items_payload({}, std::move(error));
    return v;
}

const std::string& Value::pending_error() const {
    static const std::string kNone;
    return kind_ == Kind::iterator ? static_cast<const ItemsPayload*>(ptr_.get())->error : kNone;
}

double Value::as_double() const {
    switch (kind_) {
        case Kind::boolean:
            return bool_ ? 1.0 : 0.0;
        case Kind::integer:
            return static_cast<double>(int_);
        default:
            return float_;
    }
}
const std::string& Value::as_string() const {
    return static_cast<const TextPayload*>(ptr_.get())->text;
}
const ValueList& Value::items() const {
    return static_cast<const ItemsPayload*>(ptr_.get())->items;
}
const Dict& Value::as_dict() const {
    return static_cast<const DictPayload*>(ptr_.get())->dict;
}
Object& Value::as_object() const {
    return *static_cast<Object*>(ptr_.get());
}
const Callable& Value::as_callable() const {
    return *static_cast<const Callable*>(ptr_.get());
}
const std::string& Value::undefined_reason() const {
    static const std::string kNoReason;
    return ptr_ ? static_cast<const TextPayload*>(ptr_.get())->text : kNoReason;
}

bool Value::is_same(const Value& other) const {
    if (kind_ != other.kind_) return false;
    switch (kind_) {
        case Kind::undefined:
        case Kind::none:
            return true;
        case Kind::boolean:
            return bool_ == other.bool_;
        case Kind::integer:
            return int_ == other.int_;
        case Kind::floating:
            return float_ == other.float_;
        case Kind::string:
            return as_string() == other.as_string();
        default:
            return ptr_ == other.ptr_;
    }
}

bool Value::owns_nested() const {
    switch (kind_) {
        case Kind::list:
        case Kind::tuple:
        case Kind::dict:
        case Kind::iterator:
        case Kind::object:
        case Kind::callable:
            return ptr_.use_count() == 1;
        default:
            return false;
    }
}

void dispose(Value& value) noexcept {
    if (!value.owns_nested()) return;  // strings and shared values go the ordinary way
    Disposal& d = t_disposal;
    if (d.running) {
        try {
            d.pending.push_back(std::move(value));
        } catch (...) {  // no memory for the queue: destroy it here after all
            value = Value();
        }
        return;
    }
    d.running = true;
    value = Value();  // what it held that nests deeper lands in d.pending
    while (!d.pending.empty()) {
        Value next = std::move(d.pending.back());
        d.pending.pop_back();
    }
    d.pending.shrink_to_fit();
    d.running = false;
}

void dispose(ValueList& values) noexcept {
    for (Value& v : values) dispose(v);
}

namespace {

// Dicts at least this large get hash indexes of their string and integer keys.
constexpr size_t kIndexFrom = 16;

// The integer a key equals under Python's == (1 == 1.0 == True), if it is one.
std::optional<int64_t> integer_key(const Value& key) {
    if (key.is_bool() || key.is_int()) return key.as_int();
    if (key.is_float()) {
        const double d = key.as_double();
        if (d >= -9223372036854775808.0 && d < 9223372036854775808.0 && d == std::trunc(d))
            return static_cast<int64_t>(d);
    }
    return std::nullopt;
}

}  // namespace

Dict::Dict(const Dict& other) : entries_(other.entries_), indexed_(other.indexed_) {
    if (indexed_) index_from(0);
}

Dict& Dict::operator=(const Dict& other) {
    if (this != &other) {
        Dict copy(other);
        *this = std::move(copy);
    }
    return *this;
}

Dict::~Dict() {
    string_index_.clear();
    for (auto& [k, v] : entries_) {
        dispose(k);
        dispose(v);
    }
}

void Dict::index_from(size_t first) {
    for (size_t i = first; i < entries_.size(); ++i) {
        const Value& key = entries_[i].first;
        if (key.is_string())
            string_index_.emplace(key.as_string(), i);
        else if (const auto n = integer_key(key))
            number_index_.emplace(*n, i);
    }
}

uint64_t Dict::heap_bytes() const {
    return entries_.capacity() * sizeof(entries_[0]) + (string_index_.size() + number_index_.size()) * 48 +
           (string_index_.bucket_count() + number_index_.bucket_count()) * 8;
}

std::optional<size_t> Dict::position(const Value& key) const {
    if (key.is_string()) {
        const std::string_view text = key.as_string();
        if (indexed_) {
            const auto it = string_index_.find(text);
            return it == string_index_.end() ? std::nullopt : std::optional<size_t>(it->second);
        }
        for (size_t i = 0; i < entries_.size(); ++i)
            if (entries_[i].first.is_string() && entries_[i].first.as_string() == text) return i;
        return std::nullopt;
    }
    if (indexed_) {
        if (const auto n = integer_key(key)) {
            const auto it = number_index_.find(*n);
            return it == number_index_.end() ? std::nullopt : std::optional<size_t>(it->second);
        }
    }
    for (size_t i = 0; i < entries_.size(); ++i)
        if (equals(entries_[i].first, key)) return i;
    return std::nullopt;
}

const Value* Dict::find(const Value& key) const {
    const auto at = position(key);
    return at ? &entries_[*at].second : nullptr;
}
const Value* Dict::find(std::string_view key) const {
    if (indexed_) {
        const auto it = string_index_.find(key);
        return it == string_index_.end() ? nullptr : &entries_[it->second].second;
    }
    for (const auto& [k, v] : entries_)
        if (k.is_string() && k.as_string() == key) return &v;
    return nullptr;
}
void Dict::set(Value key, Value value) {
    if (const auto at = position(key)) {
        entries_[*at].second = std::move(value);
        return;
    }
    entries_.emplace_back(std::move(key), std::move(value));
    if (indexed_) {
        index_from(entries_.size() - 1);
    } else if (entries_.size() >= kIndexFrom) {
        indexed_ = true;
        index_from(0);
    }
}

const Value* Items::begin() const {
    switch (holder_.kind()) {
        case Value::Kind::list:
        case Value::Kind::tuple:
        case Value::Kind::iterator:
            return holder_.items().data();
        default:
            return nullptr;
    }
}

size_t Items::size() const {
    switch (holder_.kind()) {
        case Value::Kind::list:
        case Value::Kind::tuple:
        case Value::Kind::iterator:
            return holder_.items().size();
        default:
            return 0;
    }
}

Value Items::as_list() const {
    return holder_.is_list() ? holder_ : Value::list(copy());
}

namespace {

thread_local uint32_t t_walk_depth = 0;

// repr() of a value that holds no other values (and of objects and callables, which print
// themselves).
std::string scalar_repr(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::undefined:
            return "Undefined";
        case Value::Kind::none:
            return "None";
        case Value::Kind::boolean:
            return v.as_bool() ? "True" : "False";
        case Value::Kind::integer:
            return std::to_string(v.as_int());
        case Value::Kind::floating:
            return py::float_repr(v.as_double());
        case Value::Kind::string:
            return v.is_markup() ? "Markup(" + py::repr(v.as_string()) + ")" : py::repr(v.as_string());
        case Value::Kind::object:
            return v.as_object().repr();
        case Value::Kind::callable:
            return "<" + v.as_callable().describe() + ">";
        case Value::Kind::iterator:
            return "<" + type_name(v) + " object>";
        default:
            return "";
    }
}

}  // namespace

ValueWalk::ValueWalk() {
    const uint32_t max_depth = active_limits().max_depth;
    if (t_walk_depth >= max_depth) throw EvalError(depth_message("value", max_depth), EvalError::Kind::limit);
    ++t_walk_depth;
}

ValueWalk::~ValueWalk() {
    --t_walk_depth;
}

bool truthy(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::undefined:
        case Value::Kind::none:
            return false;
        case Value::Kind::boolean:
            return v.as_bool();
        case Value::Kind::integer:
            return v.as_int() != 0;
        case Value::Kind::floating:
            return v.as_double() != 0.0;
        case Value::Kind::string:
            return !v.as_string().empty();
        case Value::Kind::list:
        case Value::Kind::tuple:
            return !v.items().empty();
        case Value::Kind::dict:
            return !v.as_dict().empty();
        case Value::Kind::iterator:
            return !v.is_dict_view() || !v.items().empty();
        default:
            return true;
    }
}

namespace {

void repr_into(std::string& out, const Value& v);

void items_repr_into(std::string& out, const ValueList& items) {
    for (size_t i = 0; i < items.size(); ++i) {
        if (i) append_within_limit(out, ", ");
        repr_into(out, items[i]);
    }
}

void repr_into(std::string& out, const Value& v) {
    const ValueWalk level;
    switch (v.kind()) {
        case Value::Kind::list:
            append_within_limit(out, "[");
            items_repr_into(out, v.items());
            append_within_limit(out, "]");
            return;
        case Value::Kind::tuple:
            append_within_limit(out, "(");
            items_repr_into(out, v.items());
            append_within_limit(out, v.items().size() == 1 ? ",)" : ")");
            return;
        case Value::Kind::dict: {
            append_within_limit(out, "{");
            bool first = true;
            for (const auto& [k, val] : v.as_dict().entries()) {
                if (!first) append_within_limit(out, ", ");
                first = false;
                repr_into(out, k);
                append_within_limit(out, ": ");
                repr_into(out, val);
            }
            append_within_limit(out, "}");
            return;
        }
        case Value::Kind::iterator:
            if (!v.is_dict_view()) break;
            append_within_limit(out, type_name(v) + "([");
            items_repr_into(out, v.items());
            append_within_limit(out, "])");
            return;
        default:
            break;
    }
    append_within_limit(out, scalar_repr(v));
}

}  // namespace

std::string to_str(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::undefined:
            return "";
        case Value::Kind::string:
            return v.as_string();
        default:
            return to_repr(v);
    }
}

std::string to_repr(const Value& v) {
    std::string out;
    repr_into(out, v);
    return out;
}

std::string type_name(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::undefined:
            return "Undefined";
        case Value::Kind::none:
            return "NoneType";
        case Value::Kind::boolean:
            return "bool";
        case Value::Kind::integer:
            return "int";
        case Value::Kind::floating:
            return "float";
        case Value::Kind::string:
            return v.is_markup() ? "Markup" : "str";
        case Value::Kind::list:
            return "list";
        case Value::Kind::tuple:
            return "tuple";
        case Value::Kind::dict:
            return "dict";
        case Value::Kind::object: {
            const std::string full = v.as_object().type_name();
            return full.substr(full.rfind('.') + 1);
        }
        case Value::Kind::callable:
            return "function";
        case Value::Kind::iterator:
            switch (v.iterator_kind()) {
                case Value::IteratorKind::generator:
                    return "generator";
                case Value::IteratorKind::reversed:
                    return "list_reverseiterator";
                case Value::IteratorKind::dict_keys:
                    return "dict_keys";
                case Value::IteratorKind::dict_values:
                    return "dict_values";
                case Value::IteratorKind::dict_items:
                    return "dict_items";
            }
            return "iterator";
    }
    return "object";
}

std::string object_type_repr(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::none:
            return "None";
        case Value::Kind::undefined:
            return "jinja2.runtime.Undefined object";
        case Value::Kind::object:
            return v.as_object().type_name() + " object";
        case Value::Kind::string:
            return v.is_markup() ? "markupsafe.Markup object" : "str object";
        default:
            return type_name(v) + " object";
    }
}

bool equals(const Value& a, const Value& b) {
    if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
        return a.as_int() == b.as_int();
    }
    if (a.kind() != b.kind()) return false;
    switch (a.kind()) {
        case Value::Kind::undefined:
        case Value::Kind::none:
            return true;
        case Value::Kind::string:
            return a.as_string() == b.as_string();
        case Value::Kind::list:
        case Value::Kind::tuple: {
            const auto &x = a.items(), &y = b.items();
            if (x.size() != y.size()) return false;
            const ValueWalk level;
            for (size_t i = 0; i < x.size(); ++i)
                if (!equals(x[i], y[i])) return false;
            return true;
        }
        case Value::Kind::dict: {
            const Dict &x = a.as_dict(), &y = b.as_dict();
            if (x.size() != y.size()) return false;
            const ValueWalk level;
            for (const auto& [k, val] : x.entries()) {
                const Value* other = y.find(k);
                if (!other || !equals(val, *other)) return false;
            }
            return true;
        }
        default:
            return a.is_same(b);
    }
}

int compare(const Value& a, const Value& b, std::string_view op) {
    if (a.is_undefined()) fail_undefined(a);
    if (b.is_undefined()) fail_undefined(b);
    if (a.is_number() && b.is_number()) {
        if (a.is_float() || b.is_float()) {
            const double x = a.as_double(), y = b.as_double();
            return x < y ? -1 : (x > y ? 1 : 0);
        }
        const int64_t x = a.as_int(), y = b.as_int();
        return x < y ? -1 : (x > y ? 1 : 0);
    }
    if (a.is_string() && b.is_string()) {
        // UTF-8 byte order is code point order, which is how Python orders str.
        const int c = a.as_string().compare(b.as_string());
        return c < 0 ? -1 : (c > 0 ? 1 : 0);
    }
    if (a.kind() == b.kind() && a.is_sequence()) {
        const auto &x = a.items(), &y = b.items();
        const ValueWalk level;
        for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
            if (equals(x[i], y[i])) continue;
            return compare(x[i], y[i], op);
        }
        return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
    }
    throw EvalError("'" + std::string(op) + "' not supported between instances of '" + type_name(a) + "' and '" +
                    type_name(b) + "'");
}

void fail_undefined(const Value& v) {
    const std::string& reason = v.undefined_reason();
    throw EvalError(reason.empty() ? "value is undefined" : reason);
}

Items iterate(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::undefined:
            return {};
        case Value::Kind::list:
        case Value::Kind::tuple:
        case Value::Kind::iterator:
            if (!v.pending_error().empty()) throw EvalError(v.pending_error());
            return Items(v);
        case Value::Kind::dict: {
            const Dict& d = v.as_dict();
            check_value_size(static_cast<uint64_t>(d.size()) * sizeof(Value), "list of the keys");
            ValueList keys;
            keys.reserve(d.size());
            for (const auto& entry : d.entries()) keys.push_back(entry.first);
            return Items(Value::list(std::move(keys)));
        }
        case Value::Kind::string: {
            const std::string& s = v.as_string();
            check_value_size(static_cast<uint64_t>(py::length(s)) * sizeof(Value), "list of the characters");
            ValueList chars;
            chars.reserve(py::length(s));
            for (char32_t cp : py::decode(s)) {
                std::string one;
                py::append_utf8(one, cp);
                chars.push_back(Value::string(std::move(one)));  // iterating a Markup yields plain str
            }
            return Items(Value::list(std::move(chars)));
        }
        default:
            throw EvalError("'" + type_name(v) + "' object is not iterable");
    }
}

uint64_t read_cost(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::string:
            return v.as_string().size() / 64;
        case Value::Kind::list:
        case Value::Kind::tuple:
        case Value::Kind::iterator:
            return v.items().size() / 8;
        case Value::Kind::dict:
            return v.as_dict().size() / 8;
        default:
            return 0;
    }
}

int64_t length_of(const Value& v) {
    switch (v.kind()) {
        case Value::Kind::undefined:
            return 0;
        case Value::Kind::string:
            return static_cast<int64_t>(py::length(v.as_string()));
        case Value::Kind::list:
        case Value::Kind::tuple:
            return static_cast<int64_t>(v.items().size());
        case Value::Kind::dict:
            return static_cast<int64_t>(v.as_dict().size());
        case Value::Kind::iterator:
            if (v.is_dict_view()) return static_cast<int64_t>(v.items().size());
            [[fallthrough]];
        default:
            throw EvalError("object of type '" + type_name(v) + "' has no len()");
    }
}

std::string html_escape(std::string_view s) {
    const uint64_t limit = active_limits().max_value_bytes;
    std::string out;
    out.reserve(s.size());
    for (char c : s) {
        if (out.size() > limit) check_value_size(out.size(), "escaped string");  // throws
        switch (c) {
            case '&':
                out += "&amp;";
                break;
            case '<':
                out += "&lt;";
                break;
            case '>':
                out += "&gt;";
                break;
            case '"':
                out += "&#34;";
                break;
            case '\'':
                out += "&#39;";
                break;
            default:
                out += c;
        }
    }
    return out;
}

}  // namespace fitllm::chat::jinja
