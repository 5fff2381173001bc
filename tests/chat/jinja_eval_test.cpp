// Rendering: each construct of the Jinja subset with jinja2's result (checked against jinja2
// under HF's settings), Python's printing of values, jinja2's scoping, HF's globals and tojson,
// and runtime errors that carry the position of the failing expression.
#include <gtest/gtest.h>

#include "chat/chat_template.h"

namespace fitllm::chat {
namespace {

using Json = nlohmann::ordered_json;

std::string render(std::string_view source, Json context = Json::object(), Json messages = Json::array()) {
    RenderOptions options;
    options.add_generation_prompt = false;
    options.extra_context = std::move(context);
    return ChatTemplate::parse(source).render(messages, options);
}

TemplateError render_error(std::string_view source, Json context = Json::object()) {
    try {
        render(source, std::move(context));
    } catch (const TemplateError& e) {
        return e;
    }
    ADD_FAILURE() << "expected a TemplateError for: " << source;
    return TemplateError(TemplateError::Kind::runtime, "", {}, "");
}

TEST(JinjaEval, PrintsValuesAsPythonDoes) {
    EXPECT_EQ(render("{{ 3 / 2 }} {{ 1e16 }} {{ [1, 'a', none] }} {{ {'k': true} }} {{ (1,) }}"),
              "1.5 1e+16 [1, 'a', None] {'k': True} (1,)");
    EXPECT_EQ(render("{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 123456789012345678.0 }} {{ -0.0 }}"),
              "1.0 0.30000000000000004 1e-05 1.2345678901234568e+17 -0.0");
    EXPECT_EQ(render("{{ [\"it's\", 'say \"hi\"', 'tab\\t', 'é'] }}"), "[\"it's\", 'say \"hi\"', 'tab\\t', 'é']");
    EXPECT_EQ(render("[{{ missing }}]"), "[]");
}

TEST(JinjaEval, ArithmeticFollowsPython) {
    EXPECT_EQ(
        render("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 'ab' * 2 }} {{ [1] + [2] }}"),
        "3 -4 2 1024 0.5 abab [1, 2]");
    EXPECT_EQ(render("{{ 1 + 2 * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ true + 1 }}"), "7 64 4 2");
    EXPECT_EQ(render("{{ 'a' ~ 1 ~ none ~ missing }}"), "a1None");
}

TEST(JinjaEval, ComparisonsAndLogicReturnPythonValues) {
    EXPECT_EQ(render("{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' in 'abc' }} {{ 2 not in [1] }} {{ [1, 2] < [1, 3] }}"),
              "True True True True True");
    EXPECT_EQ(render("{{ 0 or 'x' }} {{ 1 and 2 }} {{ none or [] }} {{ not 'a' in 'abc' }}"), "x 2 [] False");
}

TEST(JinjaEval, ForLoopVariablesElseAndFilter) {
    EXPECT_EQ(
        render(
            "{% for x in 'abc' %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% else %}none{% endfor %}"),
        "1a,2b,3c");
    EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
    EXPECT_EQ(render("{% for x in range(10) if x is odd %}{{ loop.index }}/{{ loop.length }}:{{ x }} {% endfor %}"),
              "1/5:1 2/5:3 3/5:5 4/5:7 5/5:9 ");
    EXPECT_EQ(render("{% for x in [1, 2, 3] %}[{{ loop.previtem }}|{{ loop.nextitem }}|{{ loop.revindex0 }}|"
                     "{{ loop.cycle('a', 'b') }}]{% endfor %}"),
              "[|2|2|a][1|3|1|b][2||0|a]");
    EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
    EXPECT_EQ(
        render("{% for x in range(9) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}"
               "{{ x }}{% endfor %}"),
        "0134");
}

TEST(JinjaEval, SetInsideALoopIsForgottenButNamespacesPersist) {
    EXPECT_EQ(render("{% set n = 1 %}{% for i in [1, 2] %}{% set n = n + i %}{{ n }}{% endfor %}|{{ n }}"), "23|1");
    EXPECT_EQ(
        render("{% set ns = namespace(n=1) %}{% for i in [1, 2] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"),
        "4");
    EXPECT_EQ(render("{% if true %}{% set v = 'kept' %}{% endif %}{{ v }}"), "kept");
    EXPECT_EQ(render("{% set a, b = 1, 2 %}{% set t = 3, 4 %}{{ a }}{{ b }}{{ t }}"), "12(3, 4)");
    EXPECT_EQ(render("{% set block %}Hi {{ 'x' }}{% endset %}[{{ block }}]"), "[Hi x]");
}

TEST(JinjaEval, MacrosBindArgumentsAndSeeTheirDefiningScope) {
    EXPECT_EQ(render("{% macro tag(name, body='') %}<{{ name }}>{{ body }}</{{ name }}>{% endmacro %}"
                     "{{ tag('b', 'x') }}{{ tag('i') }}{{ tag(body='y', name='u') }}"),
              "<b>x</b><i></i><u>y</u>");
    EXPECT_EQ(render("{% set s = '!' %}{% macro count(n) %}{% if n > 0 %}{{ n }}{{ count(n - 1) }}{% else %}go{{ s }}"
                     "{% endif %}{% endmacro %}{{ count(3) }}"),
              "321go!");
    EXPECT_EQ(render("{% macro m(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}{{ m(1, 2, x=3) }}"),
              "1|(2,)|{'x': 3}");
}

TEST(JinjaEval, FiltersAndTests) {
    const Json context = {{"messages", Json::array({{{"role", "user"}}, {{"role", "assistant"}}})}};
    EXPECT_EQ(
        render("{{ 'Hello'|upper }} {{ ' x '|trim }} {{ [3, 1, 2]|sort|join(',') }} {{ 'a-b'|replace('-', '+') }} "
               "{{ [1, 2, 3]|length }} {{ messages|selectattr('role', 'equalto', 'user')|list|length }}",
               context),
        "HELLO x 1,2,3 a+b 3 1");
    EXPECT_EQ(render("{{ x is defined }} {{ none is none }} {{ 'a' is string }} {{ 4 is even }} {{ {} is mapping }}"),
              "False True True True True");
    EXPECT_EQ(render("{{ missing|default('d') }} {{ none|default('d') }} {{ ''|default('d', true) }}"), "d None d");
    EXPECT_EQ(render("{{ 'hello wORLD foo-bar'|title }} {{ 2.5|round }} {{ '3.9'|int }} {{ 'x'|int(7) }}"),
              "Hello World Foo-Bar 2.0 3 7");
}

TEST(JinjaEval, StringListAndDictMethods) {
    EXPECT_EQ(render("{{ 'abc'[::-1] }} {{ [1, 2, 3][1:] }} {{ 'a,b'.split(',') }} {{ '  x '.strip() }} "
                     "{{ 'ab'.startswith('a') }} {{ 'a{}c'.format('b') }} {{ '%s=%d' % ('n', 3) }}"),
              "cba [2, 3] ['a', 'b'] x True abc n=3");
    EXPECT_EQ(
        render("{{ d.get('z', 0) }} {{ d.keys()|list }} {{ d.items() }} {{ d.a }} {{ d['a'] }}", {{"d", {{"a", 1}}}}),
        "0 ['a'] dict_items([('a', 1)]) 1 1");
}

TEST(JinjaEval, HfToJsonKeepsUnicodeAndKeyOrder) {
    EXPECT_EQ(render("{{ tools|tojson }}", {{"tools", Json::array({{{"z", 1}, {"a", "é"}}})}}),
              "[{\"z\": 1, \"a\": \"é\"}]");
    EXPECT_EQ(render("{{ [1, {'a': []}]|tojson(indent=2) }}"), "[\n  1,\n  {\n    \"a\": []\n  }\n]");
    EXPECT_EQ(render("{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }} {{ 'é'|tojson(ensure_ascii=true) }}"),
              "{\"a\": 2, \"b\": 1} \"\\u00e9\"");
}

TEST(JinjaEval, MarkupEscapesWhatIsAddedToIt) {
    EXPECT_EQ(render("{{ ('<b>'|safe) + '<i>' }} {{ '<x>'|e }} {{ ('<b>'|safe) ~ '<i>' }}"),
              "<b>&lt;i&gt; &lt;x&gt; <b><i>");
}

TEST(JinjaEval, StrftimeNowReadsTheGivenClock) {
    std::tm now{};
    now.tm_year = 2024 - 1900;
    now.tm_mon = 8;
    now.tm_mday = 26;
    RenderOptions options;
    options.now = now;
    EXPECT_EQ(ChatTemplate::parse("{{ strftime_now('%d %b %Y') }}").render(std::vector<ChatMessage>{}, options),
              "26 Sep 2024");
}

TEST(JinjaEvalErrors, RaiseExceptionKeepsTheTemplatesMessage) {
    const TemplateError e =
        render_error("{% for m in [1] %}\n  {{ raise_exception('Roles must alternate') }}\n{% endfor %}");
    EXPECT_EQ(e.kind(), TemplateError::Kind::raised);
    EXPECT_EQ(e.detail(), "Roles must alternate");
    EXPECT_EQ(e.line(), 2u);
    EXPECT_EQ(e.column(), 6u);
    EXPECT_STREQ(e.what(), "chat_template:2:6: template raised: Roles must alternate");
}

TEST(JinjaEvalErrors, TypeErrorsPointAtTheOperator) {
    const TemplateError e = render_error("{{ 'a' + 1 }}");
    EXPECT_EQ(e.kind(), TemplateError::Kind::runtime);
    EXPECT_EQ(e.detail(), "can only concatenate str (not \"int\") to str");
    EXPECT_EQ(e.column(), 8u);
    EXPECT_EQ(render_error("{{ 1 / 0 }}").detail(), "division by zero");
    EXPECT_EQ(render_error("{{ 'a' < 1 }}").detail(), "'<' not supported between instances of 'str' and 'int'");
}

TEST(JinjaEvalErrors, UsingAnUndefinedValueSaysWhyItIsUndefined) {
    EXPECT_EQ(render_error("{{ missing.attr }}").detail(), "'missing' is undefined");
    const TemplateError e = render_error("{{ m.role + m.content }}", {{"m", {{"role", "user"}}}});
    EXPECT_EQ(e.detail(), "'dict object' has no attribute 'content'");
    EXPECT_EQ(e.column(), 11u);
    EXPECT_EQ(render_error("{{ [1][5] + 1 }}").detail(), "list object has no element 5");
}

TEST(JinjaEvalErrors, RunawayMacroRecursionIsAnError) {
    // Macro calls count toward the one depth limit of statements and expressions.
    const TemplateError e = render_error("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}");
    EXPECT_EQ(e.kind(), TemplateError::Kind::limit);
    EXPECT_NE(e.detail().find("nested too deeply"), std::string::npos) << e.detail();
}

TEST(JinjaEvalErrors, SandboxRefusesToMutateContainers) {
    EXPECT_EQ(render_error("{% set l = [1] %}{{ l.append(2) }}").detail(),
              "access to attribute 'append' of 'list' object is unsafe.");
    EXPECT_EQ(render("[{{ [1].append }}]"), "[]");  // looking it up is fine, calling it is not
    EXPECT_EQ(render_error("{{ range(1000000)|length }}").detail(),
              "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    EXPECT_EQ(render_error("{% set ns = namespace(_x=1) %}").detail(),
              "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '_x'. Please rename "
              "the attribute.");
}

}  // namespace
}  // namespace fitllm::chat
